#include "nn/lora.h"
#include "model/adapter.h"
#include "util/rng.h"
