#  include "proj/proj.h"
