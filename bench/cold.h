// Copies of a benchmark's operands, used in turn, so that each call finds its operands in memory
// rather than in the last-level cache: a decode step reads every layer's weights and latent cache
// once, from DRAM, and a benchmark that reran one 16 MiB weight from L3 would report L3 bandwidth
// as if it were memory's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <unistd.h>

namespace moe::bench {

// Enough copies of `bytes` to span twice the last-level cache, and at least 256 MiB (some VMs
// report a 480 MiB L3; others report none).
inline int64_t ColdCopies(int64_t bytes) {
  static const int64_t span = std::max<int64_t>(int64_t{256} << 20, 2 * sysconf(_SC_LEVEL3_CACHE_SIZE));
  return std::max<int64_t>(1, (span + bytes - 1) / bytes);
}

template <typename T>
class Rotation {
 public:
  explicit Rotation(const std::vector<T>& one) : size_(one.size()) {
    const int64_t copies = ColdCopies(static_cast<int64_t>(one.size() * sizeof(T)));
    data_.reserve(copies * one.size());
    for (int64_t c = 0; c < copies; ++c) data_.insert(data_.end(), one.begin(), one.end());
  }
  // The next copy, cycling.
  const T* Next() {
    const T* p = data_.data() + next_ * size_;
    next_ = (next_ + 1) * size_ < data_.size() ? next_ + 1 : 0;
    return p;
  }

 private:
  size_t size_;
  std::vector<T> data_;
  size_t next_ = 0;
};

}  // namespace moe::bench
