// (being written)
#include "cli/conformance.h"
