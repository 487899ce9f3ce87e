// Collectives between the ranks ("cards") of one instance. The model and the engine see only this
// interface; Open MPI implements it (mpi_communicator.cc, the only file with MPI headers), and a
// single process is the same code with a communicator of size 1.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace moe {

// A collective started without waiting; Wait() returns once its buffers may be reused.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void Wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Every rank sends send_counts[r] bytes to rank r, taken consecutively from `send` in rank order,
  // and receives recv_counts[r] bytes from rank r into `recv`, in rank order. The counts must agree
  // pairwise (what r sends to s is what s expects from r): exchange them first with AllToAll.
  virtual std::unique_ptr<PendingCollective> StartAllToAllV(std::span<const uint8_t> send,
                                                            std::span<const int64_t> send_counts,
                                                            std::span<uint8_t> recv,
                                                            std::span<const int64_t> recv_counts) = 0;
  // One value to each rank, one from each: out[r] is what rank r sent to this one.
  virtual std::vector<int64_t> AllToAll(std::span<const int64_t> values) = 0;
  // Every rank's value, by rank.
  virtual std::vector<int64_t> AllGather(int64_t value) = 0;
  // Every rank's bytes, concatenated in rank order (counts[r] from rank r, which all must know).
  virtual void AllGatherV(std::span<const uint8_t> send, std::span<uint8_t> recv, std::span<const int64_t> counts) = 0;
  // Sums float arrays elementwise over the ranks, in rank order (deterministic), and leaves rank r
  // the slice of counts[r] floats that starts after the slices of the ranks before it.
  virtual void ReduceScatterSum(std::span<const float> send, std::span<float> recv, std::span<const int64_t> counts) = 0;
  virtual int64_t AllReduceMax(int64_t value) = 0;
  virtual void Barrier() = 0;

  // A rank that stops answering (hung, stopped, its host gone) holds every other rank in its next
  // collective forever. From this call on, a rank blocked in one collective for longer than
  // `timeout` says so on stderr and exits, and the launcher (mpirun) ends the whole instance.
  virtual void SetCollectiveTimeout(std::chrono::milliseconds timeout) = 0;

  // Bytes this rank has handed to others through the data collectives (AllToAllV, AllGatherV,
  // ReduceScatterSum), its own share excluded: what crosses the links.
  int64_t bytes_sent() const { return bytes_sent_; }

 protected:
  int64_t bytes_sent_ = 0;
};

// The communicator of a process that is the whole instance.
std::unique_ptr<Communicator> MakeSingleRankCommunicator();

// MPI_COMM_WORLD, initializing MPI on first use (and finalizing it at exit). Outside mpirun this
// is a world of one.
std::unique_ptr<Communicator> MakeMpiCommunicator();

}  // namespace moe
