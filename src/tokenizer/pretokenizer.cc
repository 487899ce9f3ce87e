#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"

namespace moe {
namespace {

// The split the ByteLevel pre-tokenizer does itself when use_regex is true (GPT-2's pattern).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

std::string TypeOf(const nlohmann::json& config) {
  const auto it = config.find("type");
  return it != config.end() && it->is_string() ? it->get<std::string>() : "(no type)";
}

// Reads an optional boolean field, `fallback` when absent.
Expected<bool> BoolField(const nlohmann::json& config, const char* key, bool fallback) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Status::Error(std::string(key) + " is not a boolean");
  return it->get<bool>();
}

Expected<SplitRegex> SplitFromJson(const nlohmann::json& config) {
  const auto behavior = config.find("behavior");
  if (behavior == config.end() || !behavior->is_string() || *behavior != "Isolated") {
    return Status::Error("unsupported Split behavior " +
                         (behavior == config.end() ? std::string("(none)") : behavior->dump()) +
                         " (only \"Isolated\" is supported)");
  }
  MOE_ASSIGN_OR_RETURN(const bool invert, BoolField(config, "invert", false));
  if (invert) return Status::Error("unsupported Split with invert: true");

  const auto pattern = config.find("pattern");
  if (pattern != config.end() && pattern->is_object()) {
    const auto regex = pattern->find("Regex");
    if (regex != pattern->end() && regex->is_string()) {
      return SplitRegex::Compile(regex->get<std::string>(), /*literal=*/false);
    }
    const auto string = pattern->find("String");
    if (string != pattern->end() && string->is_string()) {
      return SplitRegex::Compile(string->get<std::string>(), /*literal=*/true);
    }
  }
  return Status::Error(
      "Split pre-tokenizer without a {\"Regex\": ...} or {\"String\": ...} pattern");
}

// Returns the regex step a ByteLevel pre-tokenizer contributes, if any.
Expected<std::optional<SplitRegex>> ByteLevelFromJson(const nlohmann::json& config) {
  // Hugging Face's default for add_prefix_space is true.
  MOE_ASSIGN_OR_RETURN(const bool add_prefix_space, BoolField(config, "add_prefix_space", true));
  if (add_prefix_space) return Status::Error("unsupported ByteLevel with add_prefix_space: true");
  MOE_ASSIGN_OR_RETURN(const bool use_regex, BoolField(config, "use_regex", true));
  if (!use_regex) return std::optional<SplitRegex>();
  MOE_ASSIGN_OR_RETURN(SplitRegex regex, SplitRegex::Compile(kGpt2Pattern, /*literal=*/false));
  return std::optional<SplitRegex>(std::move(regex));
}

}  // namespace

void SplitRegex::CodeDeleter::operator()(pcre2_code* code) const { pcre2_code_free(code); }

Expected<SplitRegex> SplitRegex::Compile(std::string_view pattern, bool literal) {
  // PCRE2 rejects UCP together with LITERAL; a literal has no classes for UCP to affect anyway.
  const uint32_t options =
      PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Status::Error("cannot compile pre-tokenizer pattern '" + std::string(pattern) +
                         "' at offset " + std::to_string(error_offset) + ": " +
                         reinterpret_cast<const char*>(message));
  }
  // JIT is only a speed-up: when it is unavailable pcre2_match interprets the pattern.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  SplitRegex regex;
  regex.code_.reset(code);
  return regex;
}

void SplitRegex::Split(std::string_view text, pcre2_match_data* match_data,
                       std::vector<std::string_view>& out) const {
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data);
  size_t piece_start = 0;  // where the stretch not yet emitted begins
  size_t search_from = 0;
  while (search_from < text.size()) {
    const int rc =
        pcre2_match(code_.get(), subject, text.size(), search_from, 0, match_data, nullptr);
    // Any failure other than "no match" (a resource limit) leaves the rest as one piece: the
    // tokens are still a faithful spelling of the text, only perhaps not the shortest one.
    if (rc < 0) break;
    const size_t start = ovector[0], end = ovector[1];
    if (start == end) {
      // An empty match cuts nothing; look again one character further on.
      if (start == text.size()) break;
      search_from = start + utf8::Scan(text, start).length;
      continue;
    }
    if (start > piece_start) out.push_back(text.substr(piece_start, start - piece_start));
    out.push_back(text.substr(start, end - start));
    piece_start = search_from = end;
  }
  if (piece_start < text.size()) out.push_back(text.substr(piece_start));
}

Expected<PreTokenizer> PreTokenizer::FromJson(const nlohmann::json& config) {
  if (!config.is_object()) {
    return Status::Error("pre_tokenizer is " + config.dump() +
                         "; only byte-level BPE (a ByteLevel pre-tokenizer) is supported");
  }
  std::vector<const nlohmann::json*> steps;
  if (TypeOf(config) == "Sequence") {
    const auto list = config.find("pretokenizers");
    if (list == config.end() || !list->is_array()) {
      return Status::Error("Sequence pre_tokenizer without a pretokenizers array");
    }
    for (const auto& step : *list) steps.push_back(&step);
  } else {
    steps.push_back(&config);
  }
  if (steps.empty()) {
    return Status::Error(
        "empty pre_tokenizer Sequence; only byte-level BPE (ending with a "
        "ByteLevel step) is supported");
  }

  for (const nlohmann::json* step : steps) {
    const std::string type = step->is_object() ? TypeOf(*step) : "(not an object)";
    if (type != "Split" && type != "ByteLevel") {
      return Status::Error("unsupported pre_tokenizer type '" + type + "'");
    }
  }
  // Split steps cut raw text; the ByteLevel step comes last, as in GPT-2-style tokenizers.
  for (size_t i = 0; i < steps.size(); ++i) {
    if ((TypeOf(*steps[i]) == "ByteLevel") != (i + 1 == steps.size())) {
      return Status::Error(
          "unsupported pre_tokenizer: it must end with its only ByteLevel step "
          "(only byte-level BPE is supported)");
    }
  }
  PreTokenizer result;
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    MOE_ASSIGN_OR_RETURN(SplitRegex regex, SplitFromJson(*steps[i]));
    result.steps_.push_back(std::move(regex));
  }
  MOE_ASSIGN_OR_RETURN(std::optional<SplitRegex> regex, ByteLevelFromJson(*steps.back()));
  if (regex) result.steps_.push_back(std::move(*regex));
  return result;
}

std::vector<std::string_view> PreTokenizer::Split(std::string_view text) const {
  std::vector<std::string_view> pieces{text}, next;
  if (steps_.empty()) return pieces;
  // One pair is enough: only the whole match is used.
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match_data(
      pcre2_match_data_create(1, nullptr));
  MOE_CHECK(match_data != nullptr, "out of memory for PCRE2 match data");
  for (const SplitRegex& step : steps_) {
    next.clear();
    for (std::string_view piece : pieces) step.Split(piece, match_data.get(), next);
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace moe
