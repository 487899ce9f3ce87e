#include "base/termination.h"

#include <signal.h>

#include <cerrno>

namespace moe {
namespace {

sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

void BlockTerminationSignals() {
  const sigset_t set = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTermination(std::chrono::milliseconds timeout) {
  const sigset_t set = TerminationSignals();
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout);
  const timespec ts{static_cast<time_t>(seconds.count()),
                    static_cast<long>(std::chrono::nanoseconds(timeout - seconds).count())};
  int sig;
  do {
    sig = sigtimedwait(&set, nullptr, &ts);
  } while (sig < 0 && errno == EINTR);
  return sig < 0 ? 0 : sig;
}

}  // namespace moe
