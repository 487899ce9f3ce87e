// How much memory this process holds, for start-up reports (e.g. each rank's share of the model).
#pragma once

#include <cstdint>

namespace moe {

// RssAnon of this process in bytes (resident memory it allocated: converted weights, caches; not
// the pages of files it maps, such as a checkpoint), or -1 where /proc/self/status cannot say.
int64_t AnonymousResidentBytes();

}  // namespace moe
