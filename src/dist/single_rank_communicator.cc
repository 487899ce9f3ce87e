#include <algorithm>

#include "base/check.h"
#include "dist/communicator.h"

namespace moe {
namespace {

class Done final : public PendingCollective {
 public:
  void Wait() override {}
};

class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }

  std::unique_ptr<PendingCollective> StartAllToAllV(std::span<const uint8_t> send, std::span<const int64_t> send_counts,
                                                    std::span<uint8_t> recv,
                                                    std::span<const int64_t> recv_counts) override {
    MOE_CHECK(send_counts.size() == 1 && recv_counts.size() == 1 && send_counts[0] == recv_counts[0],
              "single rank: counts must be one and equal");
    std::copy_n(send.begin(), send_counts[0], recv.begin());
    return std::make_unique<Done>();
  }
  std::vector<int64_t> AllToAll(std::span<const int64_t> values) override { return {values.begin(), values.end()}; }
  std::vector<int64_t> AllGather(int64_t value) override { return {value}; }
  void AllGatherV(std::span<const uint8_t> send, std::span<uint8_t> recv, std::span<const int64_t> counts) override {
    std::copy_n(send.begin(), counts[0], recv.begin());
  }
  void ReduceScatterSum(std::span<const float> send, std::span<float> recv, std::span<const int64_t> counts) override {
    std::copy_n(send.begin(), counts[0], recv.begin());
  }
  int64_t AllReduceMax(int64_t value) override { return value; }
  void Barrier() override {}
  void SetCollectiveTimeout(std::chrono::milliseconds) override {}  // nothing to wait for
};

}  // namespace

std::unique_ptr<Communicator> MakeSingleRankCommunicator() { return std::make_unique<SingleRankCommunicator>(); }

}  // namespace moe
