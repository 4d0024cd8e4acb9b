#include "train/trainer.h"
#include "eval/eval.h"
#include "nn/forward.h"
