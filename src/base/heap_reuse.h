// How the process's heap treats large buffers.
#pragma once

namespace moe {

// Keeps freed memory in the heap for the next allocation instead of giving it back to the kernel.
// A forward pass allocates and frees the same large per-step buffers (a prefill of 2048 tokens:
// tens of MB per layer); glibc maps each one afresh and unmaps it when freed, so every step paid
// for page faults and the kernel's zeroing of every page (about 8% of a 2048-token prefill,
// measured). Call once at start-up, before other threads run.
void ReuseFreedHeapMemory();

}  // namespace moe
