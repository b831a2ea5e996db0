// accel::zero::unit_report — what prepare says about a model whose parameters are sharded but whose
// root unit (every parameter in no accel::unit) stays whole on every rank.
//
// Under ZeRO-3 / FULL_SHARD only units are gathered one at a time; the root unit is gathered once and
// kept from step to step. A model with no unit, or one whose unmarked part is most of it, therefore
// holds DDP's parameter memory under ZeRO-3's name. The rule: warn when the root unit holds at least
// half of the model's parameter bytes (every model with no unit at all). Below that, the root is the
// usual embeddings, norms and heads beside marked blocks, which FSDP keeps in its root unit as well;
// warning there would fire on every well-marked transformer and teach users to ignore it.
#pragma once

#include <optional>
#include <string>

namespace accel::zero {

class Engine;

// The warning, or nullopt when parameters are not sharded (DDP, ZeRO-1/2, a world of one) or the
// root unit holds less than half of the model. The message gives the root's share and size, names
// the largest unmarked submodules (module path, parameters, bytes) and shows how to mark them.
std::optional<std::string> unit_report(const Engine& engine);

}  // namespace accel::zero
