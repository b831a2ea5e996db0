// accel::checkpoint::CheckpointError — what saving or loading a checkpoint throws, naming the file
// and what is wrong with it.
#pragma once

#include "base/error.h"

#include <stdexcept>

namespace accel::checkpoint {

class CheckpointError : public accel::RuntimeError {
 public:
  using accel::RuntimeError::RuntimeError;
};

}  // namespace accel::checkpoint
