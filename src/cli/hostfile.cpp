// (being written)
#include "cli/hostfile.h"
