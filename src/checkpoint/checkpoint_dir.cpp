// (being written)
#include "checkpoint/checkpoint_dir.h"
