#include "eval/eval.h"
#include "train/trainer.h"
