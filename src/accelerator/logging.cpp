// accel::get_logger (logging.h): the process filter and in_order over the world communicator.
#include "accelerator/logging.h"

#include "comm/communicator.h"

namespace accel {

void Logger::log(log::Level level, std::string_view message, LogOptions options) const {
  auto world = comm::Communicator::world();
  if (options.main_process_only) {
    if (world->rank() == 0) log::write(name_, level, message);
    return;
  }
  if (!options.in_order) {
    log::write(name_, level, message);
    return;
  }
  // Rank r writes after the r barriers that follow ranks 0..r-1's writes; every rank passes all
  // world-size barriers, so the call is collective whatever the level lets through.
  for (int r = 0; r < world->size(); ++r) {
    if (r == world->rank()) log::write(name_, level, message);
    world->barrier();
  }
}

Logger get_logger(const std::string& name, std::optional<log::Level> level) {
  Logger logger(name);
  if (level) logger.set_level(*level);
  return logger;
}

}  // namespace accel
