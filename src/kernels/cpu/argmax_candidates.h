// The pieces of MatmulTwoPart's greedy rows (kernels.h) that run once per row: which columns of the
// first part's logits could still hold the row's maximum, and the INT8 dot products that give
// those columns their second part. They run on every greedy row of every decode step: 129280
// columns and ~25 candidates a row on the bench model, ~1.3% of a 32-sequence step compiled for
// SSE (bench/RESULTS.md).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/isa.h"

namespace moe::kernels::cpu {

// The columns j of `first` (n values, in ascending order into `out`) whose upper end
// first[j] + bound * row_norms[j] reaches the largest lower end first[i] - bound * row_norms[i]:
// the only ones that may hold the row's maximum once each gets a second part of magnitude at most
// bound * row_norms[j]. Every variant finds the same columns.
void MaxCandidates(Isa isa, const float* first, const float* row_norms, int64_t n, float bound,
                   std::vector<int32_t>& out);

// The exact sum of a[p] * b[p] over k values.
int32_t DotInt8(Isa isa, const int8_t* a, const int8_t* b, int64_t k);

// kAvx512 where the CPU has it, else kGeneric.
Isa BestArgmaxIsa();

}  // namespace moe::kernels::cpu
