#include "cli.h"
#include "eval/session.h"
#include "train/trainer.h"
#include "util/util.h"
