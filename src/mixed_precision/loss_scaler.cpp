// (being written)
#include "mixed_precision/loss_scaler.h"
