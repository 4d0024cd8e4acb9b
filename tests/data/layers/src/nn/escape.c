/* three spellings that reach above nn/ without "train/...": each is one break */
#include "../train/trainer.h"
#include <train/trainer.h>
#include "nightlora.h"
/* a system header that shares a room's name is not an include of the room (none: no file) */
#include <extra/none.h>
#include <stdio.h>
/* the public header in angle brackets (include/ is on the include path): one break */
#include <nightlora.h>
/* an include of a macro (the check cannot see where it goes): one break */
#define NL_FIXTURE_H "train/trainer.h"
#include NL_FIXTURE_H
/* no space after the directive: one break */
#include"train/trainer.h"
