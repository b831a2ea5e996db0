// (being written)
#include "cli/estimate_memory.h"
