// (being written)
#include "checkpoint/sharded_state.h"
