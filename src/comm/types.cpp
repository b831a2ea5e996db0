#include "comm/types.h"
#include "base/error.h"
#include "comm/counters.h"
#include "comm/dtype.h"
#include "comm/topology.h"

#include "base/env.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>
#include <vector>

namespace accel::comm {

Duration default_timeout() {
  double s = env::get_double("ACCEL_COMM_TIMEOUT_S");
  if (!(s > 0)) throw accel::InvalidArgumentError("ACCEL_COMM_TIMEOUT_S must be > 0 seconds");
  return Duration(static_cast<long long>(s * 1000.0));
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

const char* to_string(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllGather: return "all_gather";
    case Collective::Broadcast: return "broadcast";
    case Collective::Barrier: return "barrier";
  }
  return "?";
}

CollectiveCount Counters::total() const {
  CollectiveCount t;
  for (const auto& c : by_kind) {
    t.calls += c.calls;
    t.bytes_sent += c.bytes_sent;
    t.bytes_received += c.bytes_received;
  }
  return t;
}

DtypeClass classify(c10::ScalarType t) {
  switch (t) {
    case c10::kDouble:
    case c10::kFloat: return DtypeClass::Float;
    case c10::kBFloat16:
    case c10::kHalf: return DtypeClass::HalfFloat;
    case c10::kInt:
    case c10::kLong:
    case c10::kByte: return DtypeClass::Integer;
    case c10::kFloat8_e4m3fn:
    case c10::kFloat8_e5m2: return DtypeClass::Fp8;
    default: return DtypeClass::Unsupported;
  }
}

const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kDouble: return "float64";
    case c10::kFloat: return "float32";
    case c10::kBFloat16: return "bfloat16";
    case c10::kHalf: return "float16";
    case c10::kInt: return "int32";
    case c10::kLong: return "int64";
    case c10::kByte: return "uint8";
    case c10::kFloat8_e4m3fn: return "float8_e4m3fn";
    case c10::kFloat8_e5m2: return "float8_e5m2";
    case c10::kBool: return "bool";
    default: return c10::toString(t);
  }
}

const char* supported_dtypes() {
  return "float64, float32, bfloat16, float16, int32, int64, uint8, float8_e4m3fn, float8_e5m2 "
         "(fp8: all_gather and broadcast only)";
}

std::string Topology::to_string() const {
  std::ostringstream os;
  os << "rank " << rank << "/" << world_size << " local_rank " << local_rank << "/" << local_world_size << " node "
     << node_rank << "/" << num_nodes << (simulated ? " (simulated nodes: ACCEL_RANKS_PER_NODE)" : "");
  return os.str();
}

Topology apply_node_override(Topology t, const char* env) {
  if (env == nullptr || *env == '\0') return t;
  const std::string s(env);
  // "k" (nodes of k ranks each) or "k0,k1,..." (node i holds the next k_i ranks).
  std::vector<long> sizes;
  bool ok = true;
  for (std::size_t at = 0; ok && at <= s.size();) {
    const std::size_t comma = std::min(s.find(',', at), s.size());
    const std::string part = s.substr(at, comma - at);
    long k = 0;
    try {
      std::size_t pos = 0;
      k = std::stol(part, &pos);
      if (pos != part.size()) k = 0;
    } catch (const std::exception&) {
      k = 0;
    }
    ok = k > 0;
    sizes.push_back(k);
    at = comma + 1;
  }
  long total = 0;
  for (long k : sizes) total += k;
  if (ok && sizes.size() == 1) ok = t.world_size % sizes[0] == 0;
  if (ok && sizes.size() > 1) ok = total == t.world_size;
  if (!ok)
    throw accel::InvalidArgumentError(
        fmt::format("ACCEL_RANKS_PER_NODE='{}' must be a positive divisor of the world size {}, or a list of "
                    "positive node sizes that add up to it (\"2,1\")",
                    s, t.world_size));
  if (sizes.size() == 1) sizes.assign(static_cast<std::size_t>(t.world_size / sizes[0]), sizes[0]);
  int first = 0;
  for (std::size_t node = 0; node < sizes.size(); ++node) {
    const int k = static_cast<int>(sizes[node]);
    if (t.rank < first + k) {
      t.local_world_size = k;
      t.local_rank = t.rank - first;
      t.node_rank = static_cast<int>(node);
      break;
    }
    first += k;
  }
  t.num_nodes = static_cast<int>(sizes.size());
  t.simulated = true;
  return t;
}

}  // namespace accel::comm
