#include "base/heap_reuse.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace moe {

void ReuseFreedHeapMemory() {
  // No mmap-backed allocations (they go back to the kernel on free), and no trimming of the top of
  // the heap: the steady state of a server is the same buffers over and over.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
}

void ExecWithHugePageHeap(char** argv) {
  const char* set = std::getenv("GLIBC_TUNABLES");
  const std::string tunables = set ? set : "";
  if (tunables.find("glibc.malloc.hugetlb=") != std::string::npos) return;
  const std::string with_huge_pages = (tunables.empty() ? "" : tunables + ":") + "glibc.malloc.hugetlb=1";
  setenv("GLIBC_TUNABLES", with_huge_pages.c_str(), 1);
  execv("/proc/self/exe", argv);
  if (set) {
    setenv("GLIBC_TUNABLES", tunables.c_str(), 1);
  } else {
    unsetenv("GLIBC_TUNABLES");
  }
}

}  // namespace moe
