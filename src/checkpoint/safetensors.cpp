// (being written)
#include "checkpoint/safetensors.h"
