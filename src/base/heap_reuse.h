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
// madvise): decode streams every weight each step, and with 4 KiB pages each 4 KiB read costs a
// TLB miss -- a two-level page walk under a hypervisor -- and filling memory 512 times as many
// page faults. glibc reads the switch, the tunable glibc.malloc.hugetlb=1, only at start-up, so
// without it in GLIBC_TUNABLES the process executes itself again with it added; a value the user
// set is left alone. Returns when no exec is needed or the exec failed (the run goes on with small
// pages). Madvising each large tensor from the program instead measured slower (bench/RESULTS.md).
// Call first thing in main.
void ExecWithHugePageHeap(char** argv);

}  // namespace moe
