#include "sched/request.h"

namespace moe {

const char* RequestStatusName(RequestStatus status) {
  switch (status) {
    case RequestStatus::kWaiting: return "waiting";
    case RequestStatus::kRunning: return "running";
    case RequestStatus::kPreempted: return "preempted";
    case RequestStatus::kFinishedStopped: return "finished_stopped";
    case RequestStatus::kFinishedLength: return "finished_length";
    case RequestStatus::kFinishedAborted: return "finished_aborted";
  }
  return "unknown";
}

}  // namespace moe
