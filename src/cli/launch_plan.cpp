// (being written)
#include "cli/launch_plan.h"
