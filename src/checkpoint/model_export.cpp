// (being written)
#include "checkpoint/model_export.h"
