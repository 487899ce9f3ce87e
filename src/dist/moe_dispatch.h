// Moving MoE work between ranks, shaped like DeepEP: a layout says which of this rank's tokens go
// to which rank (once per rank, however many of its experts live there); dispatch sends those
// tokens' activation rows with their routing; combine brings each expert's output back to the
// token's home rank. The layout is the handle both directions share.
//
// Combine returns one vector per (token, expert slot), not partial sums: the home rank then sums
// them in ascending expert order, exactly as a single rank does, so results are bit-identical
// for any number of ranks and either exchange (all-to-all, or all-gather + reduce-scatter).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "dist/communicator.h"

namespace moe {

// Which rank runs each expert. Experts 0 .. num_experts-1 are the routed ones. With dedicated
// shared-expert ranks (the CM384 layout), expert id num_experts stands for a token's shared
// experts, which travel like routed work to the shared-expert rank that serves the token's home.
class ExpertPlacement {
 public:
  // The last `shared_expert_ranks` ranks run only shared experts, for the home ranks congruent to
  // them modulo their count; the others own contiguous ranges of routed experts, the first
  // (num_experts % their count) one more. Fails when a routed-expert rank would get none.
  static Expected<ExpertPlacement> Contiguous(int64_t num_experts, int num_ranks, int shared_expert_ranks = 0);

  // The rank that runs `expert` for the tokens of rank `home`.
  int owner(int32_t expert, int home) const {
    if (expert < num_experts()) return owner_[expert];
    return num_ranks_ - shared_expert_ranks_ + home % shared_expert_ranks_;
  }
  int64_t num_experts() const { return static_cast<int64_t>(owner_.size()); }
  int num_ranks() const { return num_ranks_; }
  int shared_expert_ranks() const { return shared_expert_ranks_; }
  // The id that routes a token to its shared-expert rank; only with shared_expert_ranks() > 0.
  int32_t shared_expert_id() const { return static_cast<int32_t>(num_experts()); }
  bool runs_shared_experts(int rank) const { return rank >= num_ranks_ - shared_expert_ranks_; }
  // The routed experts rank r runs, ascending.
  std::vector<int32_t> experts_of(int rank) const;

 private:
  std::vector<int> owner_;
  int num_ranks_ = 1;
  int shared_expert_ranks_ = 0;
};

enum class MoeExchange {
  kAllToAll,                // tokens go only to the ranks that own their experts
  kAllGatherReduceScatter,  // every rank sees every token; results come back by reduce-scatter
};

// This rank's view of one MoE layer's exchange.
struct MoeLayout {
  MoeExchange exchange = MoeExchange::kAllToAll;
  int64_t tokens = 0;  // local tokens
  int64_t top_k = 0;
  std::vector<int32_t> expert_ids;  // [tokens, top_k]: the local routing
  // All-to-all: rows sent to each rank, and for each sent row (grouped by rank) its local token.
  std::vector<int64_t> send_rows;
  std::vector<int32_t> send_token;
  std::vector<int64_t> recv_rows;
  // All-gather: every rank's token count.
  std::vector<int64_t> rank_tokens;
};

// Per-token data to send: row_bytes bytes for each local token, e.g. its INT8 activations, or its
// quantization scale. Several payloads travel concurrently.
struct RowPayload {
  const uint8_t* data = nullptr;
  int64_t row_bytes = 0;
};

// Rows that arrived to be run here: each payload's bytes and, per row, top_k routing slots whose
// expert is -1 unless this rank owns it.
struct DispatchedTokens {
  int64_t rows = 0;
  std::vector<std::vector<uint8_t>> payloads;  // per payload: rows * its row_bytes
  std::vector<int32_t> expert_ids;             // rows * top_k
};

// A dispatch in flight; its buffers live here until Wait() returns the rows that arrived.
class PendingDispatch {
 public:
  DispatchedTokens Wait();

 private:
  friend class MoeDispatcher;
  DispatchedTokens out_;
  std::vector<std::vector<uint8_t>> send_;
  std::vector<int32_t> routing_;
  std::vector<std::unique_ptr<PendingCollective>> pending_;
};

class MoeDispatcher {
 public:
  MoeDispatcher(Communicator& comm, const ExpertPlacement& placement) : comm_(comm), placement_(placement) {}

  // Every rank calls each of these for every MoE layer, with tokens = 0 when it has none, and in
  // the same order (several dispatches may be in flight at once).
  MoeLayout Layout(MoeExchange exchange, const int32_t* expert_ids, int64_t tokens, int64_t top_k);

  // Sends the tokens' payloads and routing, all started before any is waited for. All-to-all
  // returns while they travel; all-gather only once they arrived.
  PendingDispatch StartDispatch(const MoeLayout& layout, std::span<const RowPayload> payloads);
  DispatchedTokens Dispatch(const MoeLayout& layout, std::span<const RowPayload> payloads) {
    return StartDispatch(layout, payloads).Wait();
  }

  // `results` holds, for each dispatched row and slot, `dim` floats (read only where the slot's
  // expert is this rank's). Returns [layout.tokens, top_k, dim]: each local token's expert outputs
  // by slot.
  std::vector<float> Combine(const MoeLayout& layout, const DispatchedTokens& dispatched, const float* results,
                             int64_t dim);

 private:
  Communicator& comm_;
  const ExpertPlacement& placement_;
};

}  // namespace moe
