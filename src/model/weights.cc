#include "model/weights.h"

#include <cstring>
#include <string>


namespace moe {
namespace {

// Loads tensors under one name prefix, remembering the first error so that a block's loader reads
// as a list of tensors rather than a chain of checks.
class TensorLoader {
 public:
  TensorLoader(const Checkpoint& checkpoint, DType linear_dtype)
      : checkpoint_(checkpoint), linear_dtype_(linear_dtype) {}

  Linear LoadLinear(const std::string& name, int64_t out, int64_t in) {
    return MakeLinear(F32(name, {out, in}), linear_dtype_);
  }
  Tensor F32(const std::string& name, Shape shape) { return Get(name, std::move(shape), DType::kF32); }
  const Status& status() const { return status_; }
  DType linear_dtype() const { return linear_dtype_; }

 private:
  // After an error, returns zeros of the right shape so that later conversions stay well-defined.
  Tensor Get(const std::string& name, Shape shape, DType dtype) {
    if (!status_.ok()) return Tensor::F32(shape);
    auto tensor = checkpoint_.Load(name, shape, dtype);
    if (!tensor.ok()) {
      status_ = tensor.status();
      return Tensor::F32(shape);
    }
    return std::move(tensor).value();
  }

  const Checkpoint& checkpoint_;
  DType linear_dtype_;
  Status status_;
};

MlpWeights LoadMlp(TensorLoader& loader, const std::string& prefix, int64_t hidden, int64_t width) {
  MlpWeights mlp;
  mlp.gate = loader.LoadLinear(prefix + "gate_proj.weight", width, hidden);
  mlp.up = loader.LoadLinear(prefix + "up_proj.weight", width, hidden);
  mlp.down = loader.LoadLinear(prefix + "down_proj.weight", hidden, width);
  return mlp;
}

// Row range [begin, begin + rows) of a 2-D tensor, transposed when `transpose`.
Tensor Slice(const Tensor& w, int64_t begin, int64_t rows, bool transpose) {
  const int64_t cols = w.dim(1);
  const size_t elem = DTypeSize(w.dtype());
  Tensor out(w.dtype(), transpose ? Shape{cols, rows} : Shape{rows, cols});
  const auto* src = static_cast<const uint8_t*>(w.raw());
  auto* dst = static_cast<uint8_t*>(out.raw());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t to = transpose ? c * rows + r : r * cols + c;
      std::memcpy(dst + to * elem, src + ((begin + r) * cols + c) * elem, elem);
    }
  }
  return out;
}

AttentionWeights LoadAttention(TensorLoader& loader, const std::string& prefix, const ModelConfig& c) {
  AttentionWeights a;
  const int64_t heads = c.num_attention_heads, hidden = c.hidden_size;
  const Tensor q = c.q_lora_rank ? loader.F32(prefix + "q_a_proj.weight", {*c.q_lora_rank, hidden})
                                 : loader.F32(prefix + "q_proj.weight", {heads * c.qk_head_dim(), hidden});
  if (c.q_lora_rank) {
    a.q_a_norm = loader.F32(prefix + "q_a_layernorm.weight", {*c.q_lora_rank});
    a.q_b = loader.LoadLinear(prefix + "q_b_proj.weight", heads * c.qk_head_dim(), *c.q_lora_rank);
  }
  const Tensor kv_a = loader.F32(prefix + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, hidden});
  a.q_kv_a = MakeInputProjection(q, kv_a, loader.linear_dtype());
  a.kv_a_norm = loader.F32(prefix + "kv_a_layernorm.weight", {c.kv_lora_rank});
  Tensor kv_b = loader.F32(prefix + "kv_b_proj.weight", {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank});
  a.o_proj = loader.LoadLinear(prefix + "o_proj.weight", hidden, heads * c.v_head_dim);
  SplitAbsorbedWeights(c, kv_b, loader.linear_dtype(), a);
  a.kv_b = MakeLinear(std::move(kv_b), loader.linear_dtype());
  return a;
}

LayerWeights LoadLayer(TensorLoader& loader, int64_t index, const ModelConfig& c, const ExpertSelection& experts) {
  const std::string prefix = "model.layers." + std::to_string(index) + ".";
  LayerWeights layer;
  layer.input_norm = loader.F32(prefix + "input_layernorm.weight", {c.hidden_size});
  layer.post_attention_norm = loader.F32(prefix + "post_attention_layernorm.weight", {c.hidden_size});
  layer.attention = LoadAttention(loader, prefix + "self_attn.", c);
  if (!c.IsMoeLayer(index)) {
    layer.dense = LoadMlp(loader, prefix + "mlp.", c.hidden_size, c.intermediate_size);
    return layer;
  }
  MoeWeights& moe = layer.moe.emplace();
  moe.router = loader.F32(prefix + "mlp.gate.weight", {c.n_routed_experts, c.hidden_size});
  if (c.topk_method == TopkMethod::kNoauxTc) {
    moe.score_bias = loader.F32(prefix + "mlp.gate.e_score_correction_bias", {c.n_routed_experts});
  }
  moe.experts.resize(c.n_routed_experts);
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    if (experts.routed && !experts.routed(e)) continue;
    moe.experts[e] =
        LoadMlp(loader, prefix + "mlp.experts." + std::to_string(e) + ".", c.hidden_size, c.moe_intermediate_size);
  }
  if (c.n_shared_experts > 0 && experts.shared) {
    moe.shared = LoadMlp(loader, prefix + "mlp.shared_experts.", c.hidden_size,
                         c.n_shared_experts * c.moe_intermediate_size);
  }
  return layer;
}

}  // namespace

Linear MakeInputProjection(const Tensor& q, const Tensor& kv_a, DType dtype) {
  MOE_CHECK(q.dim(1) == kv_a.dim(1), "q [%lld, %lld] and kv_a [%lld, %lld] take different inputs",
            static_cast<long long>(q.dim(0)), static_cast<long long>(q.dim(1)), static_cast<long long>(kv_a.dim(0)),
            static_cast<long long>(kv_a.dim(1)));
  Tensor stacked = Tensor::ForOverwrite(DType::kF32, {q.dim(0) + kv_a.dim(0), q.dim(1)});
  std::memcpy(stacked.data<float>(), q.data<float>(), q.numel() * sizeof(float));
  std::memcpy(stacked.data<float>() + q.numel(), kv_a.data<float>(), kv_a.numel() * sizeof(float));
  return MakeLinear(std::move(stacked), dtype);
}

void SplitAbsorbedWeights(const ModelConfig& c, const Tensor& kv_b, DType dtype, AttentionWeights& a) {
  const int64_t per_head = c.qk_nope_head_dim + c.v_head_dim;
  a.k_absorb.clear();
  a.v_absorb.clear();
  for (int64_t h = 0; h < c.num_attention_heads; ++h) {
    a.k_absorb.push_back(MakeLinear(Slice(kv_b, h * per_head, c.qk_nope_head_dim, /*transpose=*/true), dtype));
    a.v_absorb.push_back(
        MakeLinear(Slice(kv_b, h * per_head + c.qk_nope_head_dim, c.v_head_dim, /*transpose=*/false), dtype));
  }
}

namespace {

Linear MakeLinear(Tensor w, DType dtype, bool with_plain_rows) {
  MOE_CHECK(w.dtype() == DType::kF32 && w.shape().size() == 2, "MakeLinear takes a 2-D F32 tensor");
  Linear linear;
  linear.dtype = dtype;
  linear.out = w.dim(0);
  linear.in = w.dim(1);
  switch (dtype) {
    case DType::kF32:
      linear.weight = std::move(w);
      break;
    case DType::kBF16:
      linear.weight = Tensor(DType::kBF16, w.shape());
      for (int64_t i = 0; i < w.numel(); ++i) linear.weight.data<bf16>()[i] = F32ToBf16(w.data<float>()[i]);
      break;
    case DType::kI8: {
      Tensor plain(DType::kI8, w.shape());
      linear.row_scales = Tensor::F32({linear.out});
      kernels::QuantizeRows(w.data<float>(), linear.out, linear.in, plain.data<int8_t>(),
                            linear.row_scales.data<float>());
      linear.gemv_packed = kernels::PackGemvWeight(plain.view());
      if (kernels::NeedsMatmulPacking(linear.out, linear.in)) linear.packed = kernels::PackMatmulWeight(plain.view());
      if (with_plain_rows) linear.row_norms = kernels::I8RowNorms(plain.view(), linear.row_scales.data<float>());
      if (with_plain_rows || kernels::NeedsPlainI8(linear.out, linear.in)) linear.weight = std::move(plain);
      break;
    }
    default:
      MOE_CHECK(false, "no linear layers in %s", std::string(DTypeName(dtype)).c_str());
  }
  return linear;
}

}  // namespace

Linear MakeLinear(Tensor w, DType dtype) { return MakeLinear(std::move(w), dtype, /*with_plain_rows=*/false); }

Linear MakeHead(Tensor w, DType dtype) { return MakeLinear(std::move(w), dtype, /*with_plain_rows=*/true); }

Expected<ModelWeights> LoadModelWeights(const Checkpoint& checkpoint, const ModelConfig& c, DType dtype,
                                        const ExpertSelection& experts) {
  MOE_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kI8, "unsupported run dtype");
  TensorLoader loader(checkpoint, dtype);
  ModelWeights w;
  w.embed = loader.F32("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  for (int64_t i = 0; i < c.num_hidden_layers && loader.status().ok(); ++i) {
    w.layers.push_back(LoadLayer(loader, i, c, experts));
  }
  w.final_norm = loader.F32("model.norm.weight", {c.hidden_size});
  w.lm_head = MakeHead(loader.F32(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
                                    {c.vocab_size, c.hidden_size}),
                         dtype);
  if (c.num_nextn_predict_layers > 0 && loader.status().ok()) {
    const int64_t index = c.num_hidden_layers;
    const std::string prefix = "model.layers." + std::to_string(index) + ".";
    MtpWeights& mtp = w.mtp.emplace();
    mtp.embed = loader.F32(prefix + "embed_tokens.weight", {c.vocab_size, c.hidden_size});
    mtp.enorm = loader.F32(prefix + "enorm.weight", {c.hidden_size});
    mtp.hnorm = loader.F32(prefix + "hnorm.weight", {c.hidden_size});
    mtp.eh_proj = loader.LoadLinear(prefix + "eh_proj.weight", c.hidden_size, 2 * c.hidden_size);
    mtp.head_norm = loader.F32(prefix + "shared_head.norm.weight", {c.hidden_size});
    mtp.head = MakeLinear(loader.F32(prefix + "shared_head.head.weight", {c.vocab_size, c.hidden_size}), dtype);
    mtp.block = LoadLayer(loader, index, c, experts);
  }
  if (!loader.status().ok()) return loader.status();
  return w;
}

}  // namespace moe
