#include "model/adapter.h"
#include "nn/lora.h" /* the break */
#include "util/util.h"
