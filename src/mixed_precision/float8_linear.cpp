// (being written)
#include "mixed_precision/float8_linear.h"
