// Tokenizer's private state, shared by the files that implement it.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace moe {

// A plain struct rather than Impl itself so that helper functions outside Tokenizer can fill it.
struct TokenizerState {
  std::string tokenizer_path, config_path;  // for error messages
  BpeModel bpe;
  PreTokenizer pre_tokenizer;
  AddedTokenMatcher added_matcher;
  std::unordered_map<std::string, int32_t> added_ids;  // added token content -> id
  std::unordered_map<int32_t, std::string> id_bytes;   // what each id decodes to
  int32_t vocab_size = 0;

  std::optional<std::string> bos_token, eos_token;
  std::optional<int32_t> bos_id, eos_id;
  bool add_bos_token = true;
  std::string chat_template;
};

struct Tokenizer::Impl : TokenizerState {};

}  // namespace moe
