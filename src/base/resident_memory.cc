#include "base/resident_memory.h"

#include <fstream>
#include <string>

namespace moe {

int64_t AnonymousResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "RssAnon:") {
      int64_t kib = -1;
      status >> kib;
      return kib < 0 ? -1 : kib * 1024;
    }
    status.ignore(1 << 12, '\n');
  }
  return -1;
}

}  // namespace moe
