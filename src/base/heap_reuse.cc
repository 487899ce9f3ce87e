#include "base/heap_reuse.h"

#include <malloc.h>

namespace moe {

void ReuseFreedHeapMemory() {
  // No mmap-backed allocations (they go back to the kernel on free), and no trimming of the top of
  // the heap: the steady state of a server is the same buffers over and over.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
}

}  // namespace moe
