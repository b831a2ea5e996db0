#include "comm/broadcast_text.h"

#include "comm/communicator.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>

namespace accel::comm {

std::string broadcast_text(Communicator& group, const std::string& text, int root) {
  at::Tensor len = at::full({1}, static_cast<std::int64_t>(text.size()), at::kLong);
  group.broadcast(len, {root});
  const std::int64_t n = len.item<std::int64_t>();
  at::Tensor buf = at::empty({n}, at::kByte);
  if (group.rank() == root) std::memcpy(buf.data_ptr(), text.data(), text.size());
  if (n > 0) group.broadcast(buf, {root});
  return std::string(static_cast<const char*>(buf.data_ptr()), static_cast<std::size_t>(n));
}

}  // namespace accel::comm
