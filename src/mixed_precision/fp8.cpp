// (being written)
#include "mixed_precision/fp8.h"
