// DeepSeek-V3's conversation format, written out directly instead of running the Jinja template
// from tokenizer_config.json. For messages without tool calls that template renders:
//   bos_token + (system contents joined by "\n\n")
//   + for each turn: "<｜User｜>" + content, or "<｜Assistant｜>" + content +
//   "<｜end▁of▁sentence｜>"
//   + "<｜Assistant｜>" when add_generation_prompt.
#include <string_view>

#include "tokenizer/tokenizer_impl.h"

namespace moe {
namespace {

constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kEndOfSentence = "<｜end▁of▁sentence｜>";

}  // namespace

Expected<std::string> Tokenizer::ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                                   bool add_generation_prompt) const {
  // Without these as added tokens the prompt would be BPE-encoded as ordinary text, which the
  // model was never trained on.
  for (std::string_view token : {kUser, kAssistant, kEndOfSentence}) {
    if (!impl_->added_ids.contains(std::string(token))) {
      return Status::Error(impl_->tokenizer_path + " has no added token '" + std::string(token) +
                           "', which DeepSeek-V3's chat format needs");
    }
  }
  // A template that never writes the User token belongs to another model family.
  if (!impl_->chat_template.empty() &&
      (impl_->chat_template.find(kUser) == std::string::npos ||
       impl_->chat_template.find(kAssistant) == std::string::npos)) {
    return Status::Error(impl_->config_path +
                         ": chat_template is not DeepSeek-V3's format, the only one supported");
  }

  std::string system_prompt;
  bool first_system = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return Status::Error("chat message " + std::to_string(i) + " has unsupported role '" + role +
                           "' (expected system, user or assistant)");
    }
    if (role != "system") continue;
    if (!first_system) system_prompt += "\n\n";
    system_prompt += messages[i].content;
    first_system = false;
  }

  std::string prompt = impl_->bos_token.value_or("") + system_prompt;
  for (const ChatMessage& message : messages) {
    if (message.role == "user") {
      prompt.append(kUser).append(message.content);
    } else if (message.role == "assistant") {
      prompt.append(kAssistant).append(message.content).append(kEndOfSentence);
    }
  }
  if (add_generation_prompt) prompt.append(kAssistant);
  return prompt;
}

}  // namespace moe
