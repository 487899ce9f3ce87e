#include "dist/moe_dispatch.h"

#include <algorithm>
#include <cstring>

namespace moe {
namespace {

std::span<const uint8_t> Bytes(const auto& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(v[0])};
}
std::span<uint8_t> MutableBytes(auto& v) { return {reinterpret_cast<uint8_t*>(v.data()), v.size() * sizeof(v[0])}; }

std::vector<int64_t> Scaled(std::span<const int64_t> rows, int64_t bytes_per_row) {
  std::vector<int64_t> out(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) out[r] = rows[r] * bytes_per_row;
  return out;
}

int64_t Sum(std::span<const int64_t> v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

}  // namespace

Expected<ExpertPlacement> ExpertPlacement::Contiguous(int64_t num_experts, int num_ranks, int shared_expert_ranks) {
  const int routed_ranks = num_ranks - shared_expert_ranks;
  if (shared_expert_ranks < 0 || routed_ranks < 1) {
    return Status::Error(std::to_string(shared_expert_ranks) + " shared-expert ranks of " + std::to_string(num_ranks) +
                         " leave no rank for the routed experts");
  }
  if (num_experts < routed_ranks) {
    return Status::Error(std::to_string(num_experts) + " routed experts cannot be spread over " +
                         std::to_string(routed_ranks) + " ranks: every rank needs at least one");
  }
  ExpertPlacement p;
  p.num_ranks_ = num_ranks;
  p.shared_expert_ranks_ = shared_expert_ranks;
  const int64_t base = num_experts / routed_ranks, extra = num_experts % routed_ranks;
  for (int r = 0; r < routed_ranks; ++r) p.owner_.insert(p.owner_.end(), base + (r < extra ? 1 : 0), r);
  return p;
}

std::vector<int32_t> ExpertPlacement::experts_of(int rank) const {
  std::vector<int32_t> out;
  for (size_t e = 0; e < owner_.size(); ++e) {
    if (owner_[e] == rank) out.push_back(static_cast<int32_t>(e));
  }
  return out;
}

MoeLayout MoeDispatcher::Layout(MoeExchange exchange, const int32_t* expert_ids, int64_t tokens, int64_t top_k) {
  MoeLayout layout;
  layout.exchange = exchange;
  layout.tokens = tokens;
  layout.top_k = top_k;
  layout.expert_ids.assign(expert_ids, expert_ids + tokens * top_k);
  if (exchange == MoeExchange::kAllGatherReduceScatter) {
    layout.rank_tokens = comm_.AllGather(tokens);
    return layout;
  }
  const int ranks = comm_.size();
  layout.send_rows.assign(ranks, 0);
  for (int r = 0; r < ranks; ++r) {
    for (int64_t t = 0; t < tokens; ++t) {
      const int32_t* slots = expert_ids + t * top_k;
      if (std::any_of(slots, slots + top_k, [&](int32_t e) { return placement_.owner(e, comm_.rank()) == r; })) {
        layout.send_token.push_back(static_cast<int32_t>(t));
        ++layout.send_rows[r];
      }
    }
  }
  layout.recv_rows = comm_.AllToAll(layout.send_rows);
  return layout;
}

PendingDispatch MoeDispatcher::StartDispatch(const MoeLayout& layout, std::span<const RowPayload> payloads) {
  const int64_t k = layout.top_k;
  PendingDispatch pending;
  DispatchedTokens& out = pending.out_;
  if (layout.exchange == MoeExchange::kAllGatherReduceScatter) {
    out.rows = Sum(layout.rank_tokens);
    for (const RowPayload& p : payloads) {
      auto& recv = out.payloads.emplace_back(out.rows * p.row_bytes);
      comm_.AllGatherV({p.data, static_cast<size_t>(layout.tokens * p.row_bytes)}, recv,
                       Scaled(layout.rank_tokens, p.row_bytes));
    }
    out.expert_ids.resize(out.rows * k);
    comm_.AllGatherV(Bytes(layout.expert_ids), MutableBytes(out.expert_ids),
                     Scaled(layout.rank_tokens, k * int64_t{sizeof(int32_t)}));
    int32_t* slot = out.expert_ids.data();  // rows arrive by home rank
    for (int home = 0; home < comm_.size(); ++home) {
      for (int64_t i = 0; i < layout.rank_tokens[home] * k; ++i, ++slot) {
        if (placement_.owner(*slot, home) != comm_.rank()) *slot = -1;
      }
    }
    return pending;
  }

  // Each row to rank r carries only the slots r owns; the others travel as -1.
  std::vector<int32_t>& routing = pending.routing_;
  routing.reserve(layout.send_token.size() * k);
  size_t row = 0;
  for (int r = 0; r < comm_.size(); ++r) {
    for (int64_t i = 0; i < layout.send_rows[r]; ++i, ++row) {
      const int32_t* slots = &layout.expert_ids[layout.send_token[row] * k];
      for (int64_t j = 0; j < k; ++j) routing.push_back(placement_.owner(slots[j], comm_.rank()) == r ? slots[j] : -1);
    }
  }
  out.rows = Sum(layout.recv_rows);
  pending.send_.resize(payloads.size());
  for (size_t p = 0; p < payloads.size(); ++p) {
    const int64_t bytes = payloads[p].row_bytes;
    std::vector<uint8_t>& send = pending.send_[p];
    send.resize(layout.send_token.size() * bytes);
    for (size_t i = 0; i < layout.send_token.size(); ++i) {
      std::memcpy(&send[i * bytes], payloads[p].data + layout.send_token[i] * bytes, bytes);
    }
    out.payloads.emplace_back(out.rows * bytes);
    pending.pending_.push_back(comm_.StartAllToAllV(send, Scaled(layout.send_rows, bytes), out.payloads.back(),
                                                    Scaled(layout.recv_rows, bytes)));
  }
  out.expert_ids.resize(out.rows * k);
  const int64_t routing_bytes = k * int64_t{sizeof(int32_t)};
  pending.pending_.push_back(comm_.StartAllToAllV(Bytes(routing), Scaled(layout.send_rows, routing_bytes),
                                                  MutableBytes(out.expert_ids),
                                                  Scaled(layout.recv_rows, routing_bytes)));
  return pending;
}

DispatchedTokens PendingDispatch::Wait() {
  for (auto& p : pending_) p->Wait();
  pending_.clear();
  return std::move(out_);
}

std::vector<float> MoeDispatcher::Combine(const MoeLayout& layout, const DispatchedTokens& dispatched,
                                          const float* results, int64_t dim) {
  const int64_t k = layout.top_k;
  std::vector<float> out(layout.tokens * k * dim, 0.0f);
  if (layout.exchange == MoeExchange::kAllGatherReduceScatter) {
    // Each slot is non-zero on exactly one rank, so the sum adds zeros to it: exact in any order.
    std::vector<float> send(dispatched.rows * k * dim, 0.0f);
    for (int64_t s = 0; s < dispatched.rows * k; ++s) {
      if (dispatched.expert_ids[s] >= 0) std::copy_n(results + s * dim, dim, &send[s * dim]);
    }
    comm_.ReduceScatterSum(send, out, Scaled(layout.rank_tokens, k * dim));
    return out;
  }

  // Back along the way the rows came: to each source rank, its rows' owned slots in slot order.
  const int ranks = comm_.size();
  std::vector<int64_t> send_floats(ranks, 0), recv_floats(ranks, 0);
  std::vector<float> send;
  int64_t row = 0;
  for (int r = 0; r < ranks; ++r) {
    for (int64_t i = 0; i < layout.recv_rows[r]; ++i, ++row) {
      for (int64_t j = 0; j < k; ++j) {
        if (dispatched.expert_ids[row * k + j] < 0) continue;
        send.insert(send.end(), results + (row * k + j) * dim, results + (row * k + j + 1) * dim);
        send_floats[r] += dim;
      }
    }
  }
  size_t sent = 0;
  for (int r = 0; r < ranks; ++r) {
    for (int64_t i = 0; i < layout.send_rows[r]; ++i, ++sent) {
      const int32_t* slots = &layout.expert_ids[layout.send_token[sent] * k];
      for (int64_t j = 0; j < k; ++j) recv_floats[r] += placement_.owner(slots[j], comm_.rank()) == r ? dim : 0;
    }
  }
  std::vector<float> recv(Sum(recv_floats));
  comm_.StartAllToAllV(Bytes(send), Scaled(send_floats, sizeof(float)), MutableBytes(recv),
                       Scaled(recv_floats, sizeof(float)))
      ->Wait();
  const float* next = recv.data();
  sent = 0;
  for (int r = 0; r < ranks; ++r) {
    for (int64_t i = 0; i < layout.send_rows[r]; ++i, ++sent) {
      const int64_t t = layout.send_token[sent];
      for (int64_t j = 0; j < k; ++j) {
        if (placement_.owner(layout.expert_ids[t * k + j], comm_.rank()) != r) continue;
        std::copy_n(next, dim, &out[(t * k + j) * dim]);
        next += dim;
      }
    }
  }
  return out;
}

}  // namespace moe
