/* three spellings that reach above nn/ without "train/...": each is one break */
#include "../train/trainer.h"
#include <train/trainer.h>
#include "nightlora.h"
/* a system header that shares a room's name is not an include of the room (none: no file) */
#include <extra/none.h>
#include <stdio.h>
