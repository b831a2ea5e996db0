// accel::comm::broadcast_text — a byte string from one rank to every rank of a group: its length, then
// its bytes (two broadcasts, none of them for an empty string's bytes). What is not a tensor: a path a
// rank chose, a serialized object (Accelerator::broadcast_object).
#pragma once

#include <string>

namespace accel::comm {

class Communicator;

// Collective over `group`: every rank calls it; `text` is read on `root` only. Returns root's text.
std::string broadcast_text(Communicator& group, const std::string& text, int root = 0);

}  // namespace accel::comm
