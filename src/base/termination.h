// SIGTERM and SIGINT as events a thread waits for, instead of interrupts that land in whatever
// thread runs: servers drain on them rather than die mid-write.
#pragma once

#include <chrono>

namespace moe {

// Blocks SIGTERM and SIGINT in the calling thread; threads it creates afterwards inherit the mask,
// so call it first thing in main, before any thread exists.
void BlockTerminationSignals();

// Waits for SIGTERM or SIGINT up to `timeout`: the signal's number, or 0 when none came.
int WaitForTermination(std::chrono::milliseconds timeout);

}  // namespace moe
