// While one lives, engines (and Accelerators) over CPU models take a device's offload path, through
// zero::HostCopies' emulated device (zero/host_copies.h): host masters, gradients streamed to them,
// parameter shards in host memory, every copy run only when waited for.
#pragma once

#include "zero/host_copies.h"

namespace accel::test {

struct EmulatedDevice {
  EmulatedDevice() { zero::HostCopies::emulate_device_for_tests(true); }
  ~EmulatedDevice() { zero::HostCopies::emulate_device_for_tests(false); }
  EmulatedDevice(const EmulatedDevice&) = delete;
  EmulatedDevice& operator=(const EmulatedDevice&) = delete;
};

}  // namespace accel::test
