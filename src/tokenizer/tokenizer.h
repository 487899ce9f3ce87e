// Tokenizer: byte-level BPE loaded from a Hugging Face tokenizer.json + tokenizer_config.json,
// with DeepSeek-V3's pre-tokenizer, special tokens and chat template.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace moe {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

class Tokenizer {
 public:
  // Reads `dir`/tokenizer.json and `dir`/tokenizer_config.json.
  static Expected<Tokenizer> Load(const std::string& dir);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Special/added tokens in `text` are matched first; the rest is pre-tokenized and BPE-encoded.
  // Invalid UTF-8 bytes are encoded as their byte-level tokens (the rule is at SplitRegex in
  // pretokenizer.h), so Decode(Encode(text)) == text for any bytes.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;

  // Fails on an id outside the vocabulary, naming it. The result may hold invalid UTF-8 when the
  // ids split a character.
  Expected<std::string> Decode(std::span<const int32_t> ids) const;

  // DeepSeek-V3's conversation format with the tokens named in tokenizer_config.json. The text
  // starts with the BOS token's text, so encode it with add_bos = false. Fails when the tokenizer
  // lacks DeepSeek-V3's chat tokens, when tokenizer_config.json's chat_template is another
  // family's, or on a role other than system, user and assistant (tool calls are unsupported).
  Expected<std::string> ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt) const;

  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  int32_t vocab_size() const;  // largest id + 1, added tokens included
  // tokenizer_config.json's add_bos_token (true when absent, as for DeepSeek-V3): whether plain
  // prompts should be encoded with add_bos.
  bool add_bos_token() const;
  // tokenizer_config.json's Jinja chat template, kept for reference; ApplyChatTemplate does not run
  // it. Empty when the file has none.
  const std::string& chat_template() const;

 private:
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of token ids into text pieces that are always whole UTF-8 characters: bytes of a
// character split across tokens are held back until it completes. Bytes that no later token can
// turn into a valid character are emitted as U+FFFD right away, so every piece is valid UTF-8.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  Expected<std::string> Push(int32_t id);
  // The held-back bytes at the end of the stream, invalid ones replaced with U+FFFD.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

}  // namespace moe
