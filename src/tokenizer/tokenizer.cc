#include "tokenizer/tokenizer.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/tokenizer_impl.h"

namespace moe {
namespace {

using nlohmann::json;

Expected<json> ReadJson(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return Status::Error(path + ": cannot open: " + std::strerror(errno));
  std::stringstream content;
  content << file.rdbuf();
  if (file.bad()) return Status::Error(path + ": cannot read: " + std::strerror(errno));
  try {
    return json::parse(content.str());
  } catch (const json::exception& e) {
    return Status::Error(path + ": invalid JSON: " + e.what());
  }
}

// root[key], or null when absent; a reference, since "model" alone holds megabytes.
const json& Section(const json& root, const char* key) {
  static const json kNull;
  const auto it = root.find(key);
  return it == root.end() ? kNull : *it;
}

std::string TypeOf(const json& section) {
  if (!section.is_object()) return section.dump();
  const auto it = section.find("type");
  return it != section.end() && it->is_string() ? it->get<std::string>() : "(no type)";
}

Status CheckNormalizer(const json& normalizer) {
  if (normalizer.is_null()) return Status::Ok();
  // DeepSeek-V3 has an empty Sequence: no normalization at all.
  if (TypeOf(normalizer) == "Sequence") {
    const auto list = normalizer.find("normalizers");
    if (list == normalizer.end() || !list->is_array()) {
      return Status::Error("Sequence normalizer without a normalizers array");
    }
    for (const json& step : *list) MOE_RETURN_IF_ERROR(CheckNormalizer(step));
    return Status::Ok();
  }
  return Status::Error("unsupported normalizer type '" + TypeOf(normalizer) + "'");
}

Status CheckDecoderAndPostProcessor(const json& root) {
  const json& decoder = Section(root, "decoder");
  if (TypeOf(decoder) != "ByteLevel") {
    return Status::Error("unsupported decoder type '" + TypeOf(decoder) +
                         "' (only ByteLevel is supported)");
  }
  // A ByteLevel post-processor only adjusts offsets, which this tokenizer does not report.
  const json& post = Section(root, "post_processor");
  if (!post.is_null() && TypeOf(post) != "ByteLevel") {
    return Status::Error("unsupported post_processor type '" + TypeOf(post) +
                         "' (only ByteLevel or none is supported)");
  }
  return Status::Ok();
}

Status ReadAddedTokens(const json& root, TokenizerState& impl) {
  const json& list = Section(root, "added_tokens");
  if (list.is_null()) return Status::Ok();
  if (!list.is_array()) return Status::Error("added_tokens is not an array");
  for (const json& token : list) {
    const auto id = token.find("id");
    const auto content = token.find("content");
    if (!token.is_object() || id == token.end() || !id->is_number_integer() ||
        id->get<int64_t>() < 0 || id->get<int64_t>() >= INT32_MAX || content == token.end() ||
        !content->is_string() || content->get_ref<const std::string&>().empty()) {
      return Status::Error("added token " + token.dump() +
                           " lacks an id in [0, 2^31 - 1) or a non-empty content");
    }
    // These options change how the text around a token is cut; no supported model uses them.
    for (const char* option : {"lstrip", "rstrip", "single_word"}) {
      if (token.value(option, false)) {
        return Status::Error("added token " + token.dump() + " uses unsupported option " + option);
      }
    }
    const std::string& text = content->get_ref<const std::string&>();
    impl.added_matcher.Add(text, id->get<int32_t>());
    impl.added_ids[text] = id->get<int32_t>();
  }
  return Status::Ok();
}

Status ReadTokenizerJson(const json& root, TokenizerState& impl) {
  if (!root.is_object()) return Status::Error("not a JSON object");
  MOE_RETURN_IF_ERROR(CheckNormalizer(Section(root, "normalizer")));
  MOE_ASSIGN_OR_RETURN(impl.pre_tokenizer, PreTokenizer::FromJson(Section(root, "pre_tokenizer")));
  MOE_ASSIGN_OR_RETURN(impl.bpe, BpeModel::FromJson(Section(root, "model")));
  MOE_RETURN_IF_ERROR(CheckDecoderAndPostProcessor(root));
  MOE_RETURN_IF_ERROR(ReadAddedTokens(root, impl));

  // Vocab tokens are byte-level spellings; an added token stands for its own text unless it
  // happens to be spelled in the byte-level alphabet, which is how Hugging Face decodes too.
  const auto bytes_of = [&](const std::string& token) {
    return impl.bpe.alphabet().Decode(token).value_or(token);
  };
  for (const auto& [token, id] : impl.bpe.vocab()) impl.id_bytes[id] = bytes_of(token);
  for (const auto& [token, id] : impl.added_ids) impl.id_bytes[id] = bytes_of(token);
  for (const auto& [id, bytes] : impl.id_bytes) impl.vocab_size = std::max(impl.vocab_size, id + 1);
  return Status::Ok();
}

// bos_token and eos_token are a string, an {"content": ...} object (AddedToken) or null.
Expected<std::optional<std::string>> SpecialTokenText(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) {
      return std::optional<std::string>(content->get<std::string>());
    }
  }
  return Status::Error(std::string(key) + " is neither a string nor an object with a content");
}

Expected<std::optional<int32_t>> SpecialTokenId(const TokenizerState& impl,
                                                const std::optional<std::string>& text,
                                                const char* key) {
  if (!text) return std::optional<int32_t>();
  if (const auto it = impl.added_ids.find(*text); it != impl.added_ids.end()) {
    return std::optional<int32_t>(it->second);
  }
  if (const auto it = impl.bpe.vocab().find(*text); it != impl.bpe.vocab().end()) {
    return std::optional<int32_t>(it->second);
  }
  return Status::Error(std::string(key) + " '" + *text + "' is not a token of " +
                       impl.tokenizer_path);
}

Status ReadTokenizerConfig(const json& config, TokenizerState& impl) {
  if (!config.is_object()) return Status::Error("not a JSON object");
  MOE_ASSIGN_OR_RETURN(impl.bos_token, SpecialTokenText(config, "bos_token"));
  MOE_ASSIGN_OR_RETURN(impl.eos_token, SpecialTokenText(config, "eos_token"));
  MOE_ASSIGN_OR_RETURN(impl.bos_id, SpecialTokenId(impl, impl.bos_token, "bos_token"));
  MOE_ASSIGN_OR_RETURN(impl.eos_id, SpecialTokenId(impl, impl.eos_token, "eos_token"));

  if (const auto it = config.find("add_bos_token"); it != config.end() && !it->is_null()) {
    if (!it->is_boolean()) return Status::Error("add_bos_token is not a boolean");
    impl.add_bos_token = it->get<bool>();
  }

  // A string, or a list of {"name", "template"} of which "default" is the chat one.
  const json& chat_template = Section(config, "chat_template");
  if (chat_template.is_string()) {
    impl.chat_template = chat_template.get<std::string>();
  } else if (chat_template.is_array()) {
    for (const json& entry : chat_template) {
      if (entry.is_object() && entry.value("name", "") == "default" &&
          entry.value("template", json()).is_string()) {
        impl.chat_template = entry["template"].get<std::string>();
      }
    }
  } else if (!chat_template.is_null()) {
    return Status::Error("chat_template is neither a string nor a list");
  }
  return Status::Ok();
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Expected<Tokenizer> Tokenizer::Load(const std::string& dir) {
  const std::string tokenizer_path = dir + "/tokenizer.json";
  const std::string config_path = dir + "/tokenizer_config.json";
  MOE_ASSIGN_OR_RETURN(const json root, ReadJson(tokenizer_path));
  MOE_ASSIGN_OR_RETURN(const json config, ReadJson(config_path));

  auto impl = std::make_unique<Impl>();
  impl->tokenizer_path = tokenizer_path;
  impl->config_path = config_path;
  // The explicit checks name what is wrong; the catch turns a field of an unexpected JSON type
  // that slipped past them into an error rather than a crash.
  const auto read = [&](auto reader, const json& file, const std::string& path) -> Status {
    try {
      return reader(file, *impl).WithContext(path);
    } catch (const json::exception& e) {
      return Status::Error(path + ": " + e.what());
    }
  };
  MOE_RETURN_IF_ERROR(read(ReadTokenizerJson, root, tokenizer_path));
  MOE_RETURN_IF_ERROR(read(ReadTokenizerConfig, config, config_path));

  Tokenizer tokenizer;
  tokenizer.impl_ = std::move(impl);
  return tokenizer;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> ids;
  if (add_bos && impl_->bos_id) ids.push_back(*impl_->bos_id);
  // Added tokens are cut out first, so that pre-tokenization never splits one.
  size_t pos = 0;
  while (pos < text.size()) {
    const auto match = impl_->added_matcher.FindNext(text, pos);
    const size_t end = match ? match->pos : text.size();
    for (std::string_view piece : impl_->pre_tokenizer.Split(text.substr(pos, end - pos))) {
      impl_->bpe.Encode(piece, ids);
    }
    if (!match) break;
    ids.push_back(match->id);
    pos = match->pos + match->length;
  }
  return ids;
}

Expected<std::string> Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string text;
  for (int32_t id : ids) {
    const auto it = impl_->id_bytes.find(id);
    if (it == impl_->id_bytes.end()) {
      return Status::Error("unknown token id " + std::to_string(id) + " (vocabulary size " +
                           std::to_string(impl_->vocab_size) + ")");
    }
    text += it->second;
  }
  return text;
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos_id; }
int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
bool Tokenizer::add_bos_token() const { return impl_->add_bos_token; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

}  // namespace moe
