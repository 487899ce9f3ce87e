#include "model/config.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace moe {
namespace {

using nlohmann::json;

std::string FormatDouble(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Reads typed fields of one JSON object. The first error is kept and later reads return defaults,
// so that parsing reads as a plain list of fields followed by one status check.
class FieldReader {
 public:
  // `prefix` qualifies field names in messages, e.g. "rope_scaling.".
  FieldReader(const json& object, const std::string& source, std::string prefix)
      : object_(object), source_(source), prefix_(std::move(prefix)) {}

  // A field that is absent or null.
  bool IsNull(const char* key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null();
  }

  // Absent or null fields take `fallback`, or are an error when it is nullopt (a required field).
  int64_t Int(const char* key, std::optional<int64_t> fallback = std::nullopt) {
    const json* j = Get(key, fallback.has_value());
    if (j == nullptr) return fallback.value_or(0);
    if (j->is_number_integer() &&
        !(j->is_number_unsigned() && j->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
      return j->get<int64_t>();
    }
    TypeError(key, "an integer", *j);
    return 0;
  }

  double Double(const char* key, std::optional<double> fallback = std::nullopt) {
    const json* j = Get(key, fallback.has_value());
    if (j == nullptr) return fallback.value_or(0.0);
    if (j->is_number()) return j->get<double>();
    TypeError(key, "a number", *j);
    return 0.0;
  }

  bool Bool(const char* key, bool fallback) {
    const json* j = Get(key, true);
    if (j == nullptr) return fallback;
    if (j->is_boolean()) return j->get<bool>();
    TypeError(key, "a boolean", *j);
    return fallback;
  }

  std::string String(const char* key, std::optional<std::string> fallback = std::nullopt) {
    const json* j = Get(key, fallback.has_value());
    if (j == nullptr) return fallback.value_or("");
    if (j->is_string()) return j->get<std::string>();
    TypeError(key, "a string", *j);
    return "";
  }

  std::optional<int64_t> OptionalInt(const char* key) {
    if (IsNull(key)) return std::nullopt;
    return Int(key);
  }

  // Records `message` about field `key` unless an error is already recorded.
  void Fail(const std::string& key, const std::string& message) {
    if (status_.ok()) status_ = Status::Error(source_ + ": " + prefix_ + key + " " + message);
  }

  // Range checks: a failed rule names the field, its value and the rule.
  void Require(bool ok, const char* key, int64_t value, const std::string& rule) {
    if (!ok) Fail(key, "= " + std::to_string(value) + ": must be " + rule);
  }
  void Require(bool ok, const char* key, double value, const std::string& rule) {
    if (!ok) Fail(key, "= " + FormatDouble(value) + ": must be " + rule);
  }

  const Status& status() const { return status_; }

 private:
  const json* Get(const char* key, bool optional) {
    const auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) {
      if (!optional) Fail(key, "is required but missing");
      return nullptr;
    }
    return &*it;
  }

  void TypeError(const char* key, const char* expected, const json& got) {
    Fail(key, std::string("must be ") + expected + ", got " + got.type_name());
  }

  const json& object_;
  const std::string& source_;
  std::string prefix_;
  Status status_;
};

Status ParseYarn(const json& rope_scaling, const std::string& source, ModelConfig& config) {
  if (!rope_scaling.is_object()) {
    return Status::Error(source + ": rope_scaling must be an object or null, got " +
                         rope_scaling.type_name());
  }
  FieldReader r(rope_scaling, source, "rope_scaling.");
  const std::string type = r.IsNull("type") ? r.String("rope_type") : r.String("type");
  if (!r.status().ok()) return r.status();
  if (type != "yarn") {
    return Status::Error(source + ": rope_scaling type '" + type + "' is not supported (only 'yarn')");
  }
  const YarnScaling defaults;
  YarnScaling yarn;
  yarn.factor = r.Double("factor", defaults.factor);
  yarn.original_max_position_embeddings =
      r.Int("original_max_position_embeddings", defaults.original_max_position_embeddings);
  yarn.beta_fast = r.Double("beta_fast", defaults.beta_fast);
  yarn.beta_slow = r.Double("beta_slow", defaults.beta_slow);
  yarn.mscale = r.Double("mscale", defaults.mscale);
  yarn.mscale_all_dim = r.Double("mscale_all_dim", defaults.mscale_all_dim);
  r.Require(yarn.factor >= 1.0, "factor", yarn.factor, ">= 1");
  r.Require(yarn.original_max_position_embeddings > 0, "original_max_position_embeddings",
            yarn.original_max_position_embeddings, "> 0");
  r.Require(yarn.beta_fast > 0.0, "beta_fast", yarn.beta_fast, "> 0");
  r.Require(yarn.beta_slow > 0.0, "beta_slow", yarn.beta_slow, "> 0");
  if (!r.status().ok()) return r.status();
  config.yarn = yarn;
  return Status::Ok();
}

// Range checks of the routing fields; only meaningful when the model has routed experts.
void ValidateMoe(const ModelConfig& c, FieldReader& r) {
  r.Require(c.moe_intermediate_size > 0, "moe_intermediate_size", c.moe_intermediate_size, "> 0");
  r.Require(c.num_experts_per_tok > 0, "num_experts_per_tok", c.num_experts_per_tok, "> 0");
  r.Require(c.num_experts_per_tok <= c.n_routed_experts, "num_experts_per_tok", c.num_experts_per_tok,
            "<= n_routed_experts (" + std::to_string(c.n_routed_experts) + ")");
  r.Require(c.n_group > 0, "n_group", c.n_group, "> 0");
  r.Require(c.topk_group > 0, "topk_group", c.topk_group, "> 0");
  if (!r.status().ok()) return;
  r.Require(c.n_routed_experts % c.n_group == 0, "n_routed_experts", c.n_routed_experts,
            "a multiple of n_group (" + std::to_string(c.n_group) + ")");
  r.Require(c.topk_group <= c.n_group, "topk_group", c.topk_group,
            "<= n_group (" + std::to_string(c.n_group) + ")");
  if (c.topk_method == TopkMethod::kGreedy || !r.status().ok()) return;
  const int64_t per_group = c.n_routed_experts / c.n_group;
  // noaux_tc scores a group by its two best experts.
  if (c.topk_method == TopkMethod::kNoauxTc) {
    r.Require(per_group >= 2, "n_group", c.n_group,
              "at most n_routed_experts / 2 for noaux_tc (each group needs >= 2 experts)");
  }
  // The surviving groups must hold enough experts to pick top-k from.
  r.Require(c.topk_group * per_group >= c.num_experts_per_tok, "num_experts_per_tok", c.num_experts_per_tok,
            "<= topk_group * experts per group (" + std::to_string(c.topk_group) + " * " +
                std::to_string(per_group) + ")");
}

void Validate(const ModelConfig& c, FieldReader& r) {
  const auto positive = [&](const char* key, int64_t v) { r.Require(v > 0, key, v, "> 0"); };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("intermediate_size", c.intermediate_size);
  positive("num_hidden_layers", c.num_hidden_layers);
  positive("num_attention_heads", c.num_attention_heads);
  positive("kv_lora_rank", c.kv_lora_rank);
  positive("qk_nope_head_dim", c.qk_nope_head_dim);
  positive("qk_rope_head_dim", c.qk_rope_head_dim);
  positive("v_head_dim", c.v_head_dim);
  positive("max_position_embeddings", c.max_position_embeddings);
  positive("moe_layer_freq", c.moe_layer_freq);
  if (c.q_lora_rank) positive("q_lora_rank", *c.q_lora_rank);
  r.Require(c.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", c.qk_rope_head_dim, "even (rope rotates pairs)");
  r.Require(c.n_routed_experts >= 0, "n_routed_experts", c.n_routed_experts, ">= 0");
  r.Require(c.n_shared_experts >= 0, "n_shared_experts", c.n_shared_experts, ">= 0");
  r.Require(c.first_k_dense_replace >= 0 && c.first_k_dense_replace <= c.num_hidden_layers,
            "first_k_dense_replace", c.first_k_dense_replace,
            "in [0, num_hidden_layers (" + std::to_string(c.num_hidden_layers) + ")]");
  r.Require(c.num_nextn_predict_layers == 0 || c.num_nextn_predict_layers == 1, "num_nextn_predict_layers",
            c.num_nextn_predict_layers, "0 or 1");
  r.Require(c.rms_norm_eps > 0.0, "rms_norm_eps", c.rms_norm_eps, "> 0");
  r.Require(c.rope_theta > 0.0, "rope_theta", c.rope_theta, "> 0");
  r.Require(c.routed_scaling_factor > 0.0, "routed_scaling_factor", c.routed_scaling_factor, "> 0");
  const std::string token_range = "in [0, vocab_size (" + std::to_string(c.vocab_size) + "))";
  if (c.bos_token_id) {
    r.Require(*c.bos_token_id >= 0 && *c.bos_token_id < c.vocab_size, "bos_token_id", *c.bos_token_id,
              token_range);
  }
  if (c.eos_token_id) {
    r.Require(*c.eos_token_id >= 0 && *c.eos_token_id < c.vocab_size, "eos_token_id", *c.eos_token_id,
              token_range);
  }
  if (c.n_routed_experts > 0) ValidateMoe(c, r);
}

}  // namespace

double ModelConfig::SoftmaxScale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (yarn && yarn->factor > 1.0) {
    const double m = 0.1 * yarn->mscale_all_dim * std::log(yarn->factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

Expected<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number overflow
    // what() starts with nlohmann's "[json.exception.parse_error.101] ", which means nothing to a user.
    const std::string what = e.what();
    return Status::Error(source + ": invalid JSON: " + what.substr(what.find("] ") + 2));
  }
  if (!root.is_object()) return Status::Error(source + ": expected a JSON object, got " + root.type_name());

  FieldReader r(root, source, "");
  ModelConfig c;
  c.model_type = r.String("model_type");
  if (!r.status().ok()) return r.status();
  const bool v3 = c.model_type == "deepseek_v3";
  if (!v3 && c.model_type != "deepseek_v2") {
    return Status::Error(source + ": model_type '" + c.model_type +
                         "' is not supported (expected 'deepseek_v3' or 'deepseek_v2')");
  }

  c.vocab_size = r.Int("vocab_size");
  c.hidden_size = r.Int("hidden_size");
  c.intermediate_size = r.Int("intermediate_size");
  c.num_hidden_layers = r.Int("num_hidden_layers");
  c.num_attention_heads = r.Int("num_attention_heads");
  c.kv_lora_rank = r.Int("kv_lora_rank");
  c.qk_nope_head_dim = r.Int("qk_nope_head_dim");
  c.qk_rope_head_dim = r.Int("qk_rope_head_dim");
  c.v_head_dim = r.Int("v_head_dim");
  c.max_position_embeddings = r.Int("max_position_embeddings");
  c.rms_norm_eps = r.Double("rms_norm_eps");
  c.q_lora_rank = r.OptionalInt("q_lora_rank");

  const ModelConfig defaults;
  c.n_routed_experts = r.Int("n_routed_experts", 0);
  const bool moe = c.n_routed_experts > 0;
  c.moe_intermediate_size = moe ? r.Int("moe_intermediate_size") : r.Int("moe_intermediate_size", 0);
  c.num_experts_per_tok = moe ? r.Int("num_experts_per_tok") : r.Int("num_experts_per_tok", 0);
  c.n_shared_experts = r.Int("n_shared_experts", defaults.n_shared_experts);
  c.first_k_dense_replace = r.Int("first_k_dense_replace", 0);
  c.moe_layer_freq = r.Int("moe_layer_freq", 1);
  c.n_group = r.Int("n_group", 1);
  c.topk_group = r.Int("topk_group", 1);
  c.norm_topk_prob = r.Bool("norm_topk_prob", defaults.norm_topk_prob);
  c.routed_scaling_factor = r.Double("routed_scaling_factor", defaults.routed_scaling_factor);
  c.rope_theta = r.Double("rope_theta", defaults.rope_theta);
  c.num_nextn_predict_layers = r.Int("num_nextn_predict_layers", 0);
  c.tie_word_embeddings = r.Bool("tie_word_embeddings", defaults.tie_word_embeddings);
  c.bos_token_id = r.OptionalInt("bos_token_id");

  const std::string topk_method = r.String("topk_method", v3 ? "noaux_tc" : "greedy");
  const std::string scoring_func = r.String("scoring_func", v3 ? "sigmoid" : "softmax");
  if (!r.status().ok()) return r.status();
  if (topk_method == "noaux_tc") {
    c.topk_method = TopkMethod::kNoauxTc;
  } else if (topk_method == "group_limited_greedy") {
    c.topk_method = TopkMethod::kGroupLimitedGreedy;
  } else if (topk_method == "greedy") {
    c.topk_method = TopkMethod::kGreedy;
  } else {
    r.Fail("topk_method", "'" + topk_method + "' is not one of noaux_tc, group_limited_greedy, greedy");
  }
  if (scoring_func == "sigmoid") {
    c.scoring_func = ScoringFunc::kSigmoid;
  } else if (scoring_func == "softmax") {
    c.scoring_func = ScoringFunc::kSoftmax;
  } else {
    r.Fail("scoring_func", "'" + scoring_func + "' is not one of sigmoid, softmax");
  }

  // Some configs list several end tokens; generation stops on the first.
  if (const auto it = root.find("eos_token_id"); it != root.end() && it->is_array()) {
    if (it->empty() || !(*it)[0].is_number_integer()) {
      r.Fail("eos_token_id", "must be an integer or a non-empty list of integers");
    } else {
      c.eos_token_id = (*it)[0].get<int64_t>();
    }
  } else {
    c.eos_token_id = r.OptionalInt("eos_token_id");
  }
  if (!r.status().ok()) return r.status();

  if (!r.IsNull("rope_scaling")) MOE_RETURN_IF_ERROR(ParseYarn(root.at("rope_scaling"), source, c));

  Validate(c, r);
  if (!r.status().ok()) return r.status();
  return c;
}

Expected<ModelConfig> LoadModelConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::Error(path + ": read error");
  return ParseModelConfig(text.str(), path);
}

}  // namespace moe
