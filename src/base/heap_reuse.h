// How the process's heap treats large buffers.
#pragma once

namespace moe {

// Keeps freed memory in the heap for the next allocation instead of giving it back to the kernel.
// A forward pass allocates and frees the same large per-step buffers (a prefill of 2048 tokens:
// tens of MB per layer); glibc maps each one afresh and unmaps it when freed, so every step paid
// for page faults and the kernel's zeroing of every page (about 8% of a 2048-token prefill,
// measured). Call once at start-up, before other threads run.
void ReuseFreedHeapMemory();

// Has glibc's malloc back the heap with transparent huge pages (where the kernel leaves them to
// madvise): filling memory then takes 512 times fewer page faults, which were half of the bench
// model's load time (it loads ~2.4x faster; decode and prefill measured unchanged within the
// noise, bench/RESULTS.md). glibc reads the switch, the tunable glibc.malloc.hugetlb=1, only at
// start-up, so without it in GLIBC_TUNABLES the process executes itself again with it added; a
// value the user set is left alone. Returns when no exec is needed or the exec failed (the run
// goes on with small pages). Madvising each large tensor from the program instead made batch-1
// decode slower. Call first thing in main.
void ExecWithHugePageHeap(char** argv);

}  // namespace moe
