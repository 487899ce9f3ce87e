#include <mpi.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <thread>

#include "base/check.h"
#include "dist/communicator.h"

namespace moe {
namespace {

void EnsureMpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  // One thread of each rank talks to MPI at a time (the step loop); other threads never do.
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  MOE_CHECK(provided >= MPI_THREAD_SERIALIZED, "MPI lacks MPI_THREAD_SERIALIZED support");
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
}

// MPI counts are ints: a step's exchange is far below 2 GiB per peer, and a larger one is a bug.
std::vector<int> ToInts(std::span<const int64_t> counts) {
  std::vector<int> out(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    MOE_CHECK(counts[i] >= 0 && counts[i] <= INT_MAX, "collective count %lld out of range",
              static_cast<long long>(counts[i]));
    out[i] = static_cast<int>(counts[i]);
  }
  return out;
}

std::vector<int> Offsets(const std::vector<int>& counts) {
  std::vector<int> offsets(counts.size(), 0);
  std::exclusive_scan(counts.begin(), counts.end(), offsets.begin(), 0);
  return offsets;
}

// Ends the process when one blocking MPI call lasts longer than the timeout (see
// Communicator::SetCollectiveTimeout). MPI offers no timeout of its own, and a thread blocked
// inside MPI cannot be woken: leaving the process is the one way out, and mpirun then stops the rest.
class CollectiveWatchdog {
 public:
  ~CollectiveWatchdog() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  void Start(int rank, std::chrono::milliseconds timeout) {
    MOE_CHECK(!thread_.joinable(), "the collective timeout is set once");
    thread_ = std::thread([this, rank, timeout] { Watch(rank, timeout); });
  }

  // Marks one blocking call, for as long as it lives.
  class Blocked {
   public:
    explicit Blocked(CollectiveWatchdog& w) : w_(w) { w_.since_ = Clock::now().time_since_epoch().count(); }
    ~Blocked() { w_.since_ = 0; }

   private:
    CollectiveWatchdog& w_;
  };

 private:
  using Clock = std::chrono::steady_clock;

  void Watch(int rank, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; })) {
      const int64_t since = since_.load();
      if (since == 0 || Clock::now() - Clock::time_point(Clock::duration(since)) < timeout) continue;
      std::fprintf(stderr,
                   "error: rank %d waited %.1f s in a collective for another rank (hung, stopped or gone); "
                   "ending this rank so that the instance fails instead of hanging\n",
                   rank, static_cast<double>(timeout.count()) / 1000);
      std::fflush(stderr);
      std::_Exit(3);
    }
  }

  std::atomic<int64_t> since_{0};  // steady-clock ticks when the current blocking call began; 0: none
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

class PendingMpi final : public PendingCollective {
 public:
  PendingMpi(std::vector<int> send_counts, std::vector<int> recv_counts, CollectiveWatchdog& watchdog)
      : watchdog_(watchdog),
        send_counts_(std::move(send_counts)),
        recv_counts_(std::move(recv_counts)),
        send_offsets_(Offsets(send_counts_)),
        recv_offsets_(Offsets(recv_counts_)) {}
  ~PendingMpi() override { Wait(); }

  void Start(const uint8_t* send, uint8_t* recv) {
    MPI_Ialltoallv(send, send_counts_.data(), send_offsets_.data(), MPI_BYTE, recv, recv_counts_.data(),
                   recv_offsets_.data(), MPI_BYTE, MPI_COMM_WORLD, &request_);
  }
  void Wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    CollectiveWatchdog::Blocked blocked(watchdog_);
    MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }

 private:
  CollectiveWatchdog& watchdog_;
  // MPI reads the count and offset arrays until the collective completes, so they live here.
  std::vector<int> send_counts_, recv_counts_, send_offsets_, recv_offsets_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    EnsureMpi();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<PendingCollective> StartAllToAllV(std::span<const uint8_t> send, std::span<const int64_t> send_counts,
                                                    std::span<uint8_t> recv,
                                                    std::span<const int64_t> recv_counts) override {
    CountSent(send_counts);
    auto pending = std::make_unique<PendingMpi>(ToInts(send_counts), ToInts(recv_counts), watchdog_);
    pending->Start(send.data(), recv.data());
    return pending;
  }

  std::vector<int64_t> AllToAll(std::span<const int64_t> values) override {
    std::vector<int64_t> out(size_);
    CollectiveWatchdog::Blocked blocked(watchdog_);
    MPI_Alltoall(values.data(), 1, MPI_INT64_T, out.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
    return out;
  }

  std::vector<int64_t> AllGather(int64_t value) override {
    std::vector<int64_t> out(size_);
    CollectiveWatchdog::Blocked blocked(watchdog_);
    MPI_Allgather(&value, 1, MPI_INT64_T, out.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
    return out;
  }

  void AllGatherV(std::span<const uint8_t> send, std::span<uint8_t> recv, std::span<const int64_t> counts) override {
    const std::vector<int> c = ToInts(counts);
    bytes_sent_ += int64_t{c[rank_]} * (size_ - 1);
    CollectiveWatchdog::Blocked blocked(watchdog_);
    MPI_Allgatherv(send.data(), c[rank_], MPI_BYTE, recv.data(), c.data(), Offsets(c).data(), MPI_BYTE,
                   MPI_COMM_WORLD);
  }

  // MPI_Reduce_scatter may add in any order; summing the gathered slices here in rank order makes
  // the result the same on every run and every rank count.
  void ReduceScatterSum(std::span<const float> send, std::span<float> recv, std::span<const int64_t> counts) override {
    std::vector<int64_t> send_bytes(size_), recv_bytes(size_);
    for (int r = 0; r < size_; ++r) {
      send_bytes[r] = counts[r] * int64_t{sizeof(float)};
      recv_bytes[r] = counts[rank_] * int64_t{sizeof(float)};
    }
    std::vector<float> gathered(static_cast<size_t>(counts[rank_]) * size_);
    StartAllToAllV({reinterpret_cast<const uint8_t*>(send.data()), send.size_bytes()}, send_bytes,
                   {reinterpret_cast<uint8_t*>(gathered.data()), gathered.size() * sizeof(float)}, recv_bytes)
        ->Wait();
    const size_t n = static_cast<size_t>(counts[rank_]);
    std::fill_n(recv.begin(), n, 0.0f);
    for (int r = 0; r < size_; ++r) {
      for (size_t i = 0; i < n; ++i) recv[i] += gathered[r * n + i];
    }
  }

  int64_t AllReduceMax(int64_t value) override {
    int64_t out = 0;
    CollectiveWatchdog::Blocked blocked(watchdog_);
    MPI_Allreduce(&value, &out, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    return out;
  }

  void Barrier() override {
    CollectiveWatchdog::Blocked blocked(watchdog_);
    MPI_Barrier(MPI_COMM_WORLD);
  }

  void SetCollectiveTimeout(std::chrono::milliseconds timeout) override { watchdog_.Start(rank_, timeout); }

 private:
  void CountSent(std::span<const int64_t> counts) {
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) bytes_sent_ += counts[r];
    }
  }

  int rank_ = 0;
  int size_ = 1;
  CollectiveWatchdog watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> MakeMpiCommunicator() { return std::make_unique<MpiCommunicator>(); }

}  // namespace moe
