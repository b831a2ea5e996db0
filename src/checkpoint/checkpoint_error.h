// accel::checkpoint::CheckpointError — what saving or loading a checkpoint throws, naming the file
// and what is wrong with it.
#pragma once

#include <stdexcept>

namespace accel::checkpoint {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace accel::checkpoint
