// How much memory this process holds, for start-up reports (e.g. each rank's share of the model).
#pragma once

#include <cstdint>

namespace moe {

// VmRSS of this process in bytes, or -1 where /proc/self/status cannot say.
int64_t ResidentBytes();

}  // namespace moe
