#include "server/openai_protocol.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace moe {
namespace {

using json = nlohmann::json;

ParseLimits Limits() {
  ParseLimits limits;
  limits.served_model = "tiny";
  limits.max_n = 16;
  limits.max_logprobs = 20;
  return limits;
}

json ChatBody() { return {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Hello"}}}}}; }
json CompletionBody() { return {{"model", "tiny"}, {"prompt", "Hello"}}; }

GenerationRequest ParseOk(bool chat, const std::string& body) {
  auto result = chat ? ParseChatRequest(body, Limits()) : ParseCompletionRequest(body, Limits());
  if (auto* error = std::get_if<ApiError>(&result)) {
    ADD_FAILURE() << "unexpected error: " << error->message;
    return {};
  }
  return std::get<GenerationRequest>(result);
}
GenerationRequest ChatOk(const json& body) { return ParseOk(true, body.dump()); }
GenerationRequest CompletionOk(const json& body) { return ParseOk(false, body.dump()); }

// ---- Rejected requests: one row per rule ----

struct BadCase {
  std::string name;
  bool chat;
  std::string body;
  int status;
  std::string param;    // expected param ("" = null)
  std::string message;  // a substring of the expected message
};

// Starts from a valid body and sets (or, with a discarded value, removes) one field.
std::string Chat(const char* key, json value) {
  json body = ChatBody();
  if (value.is_discarded()) {
    body.erase(key);
  } else {
    body[key] = std::move(value);
  }
  return body.dump();
}
std::string Completion(const char* key, json value) {
  json body = CompletionBody();
  if (value.is_discarded()) {
    body.erase(key);
  } else {
    body[key] = std::move(value);
  }
  return body.dump();
}
std::string ChatMessages(json messages) { return Chat("messages", std::move(messages)); }
const json kRemove = json(json::value_t::discarded);

std::vector<BadCase> BadCases() {
  json user = {{"role", "user"}, {"content", "hi"}};
  return {
      // Body level.
      {"MalformedJson", true, R"({"model": "tiny", "messages": [)", 400, "", "line 1, column"},
      {"EmptyBody", false, "", 400, "", "Invalid JSON body"},
      {"TrailingGarbage", false, R"({"prompt": "a"} x)", 400, "", "Invalid JSON body"},
      {"BodyNotObject", false, "[1, 2]", 400, "", "must be a JSON object"},
      {"InvalidUtf8", false, "{\"prompt\": \"a\xff\xfe\"}", 400, "", "UTF-8"},
      {"TruncatedUtf8", true, "{\"messages\": [{\"role\": \"user\", \"content\": \"\xe4\xb8\"}]}", 400, "",
       "UTF-8"},
      {"LoneSurrogate", false, R"({"prompt": "\ud800"})", 400, "", "surrogate"},
      // Model.
      {"UnknownModel", true, Chat("model", "gpt-4"), 404, "model", "`gpt-4` does not exist"},
      {"ModelNotString", false, Completion("model", 5), 400, "model", "expected a string"},
      // Messages.
      {"MissingMessages", true, Chat("messages", kRemove), 400, "messages", "Missing required parameter"},
      {"NullMessages", true, Chat("messages", nullptr), 400, "messages", "Missing required parameter"},
      {"MessagesNotArray", true, ChatMessages("hi"), 400, "messages", "expected an array, but got a string"},
      {"EmptyMessages", true, ChatMessages(json::array()), 400, "messages", "empty array"},
      {"MessageNotObject", true, ChatMessages({"hi"}), 400, "messages[0]", "expected an object"},
      {"MissingRole", true, ChatMessages({{{"content", "hi"}}}), 400, "messages[0].role", "Missing"},
      {"RoleNotString", true, ChatMessages({{{"role", 1}, {"content", "hi"}}}), 400, "messages[0].role",
       "expected a string"},
      {"UnknownRole", true, ChatMessages({user, {{"role", "wizard"}, {"content", "hi"}}}), 400, "messages[1].role",
       "\"wizard\" is not supported"},
      {"ToolRole", true, ChatMessages({{{"role", "tool"}, {"content", "42"}}}), 400, "messages[0].role",
       "not supported"},
      {"MissingContent", true, ChatMessages({user, {{"role", "assistant"}}}), 400, "messages[1].content",
       "Missing required parameter"},
      {"NullContent", true, ChatMessages({{{"role", "user"}, {"content", nullptr}}}), 400, "messages[0].content",
       "Missing required parameter"},
      {"ContentNumber", true, ChatMessages({{{"role", "user"}, {"content", 7}}}), 400, "messages[0].content",
       "expected a string or an array of content parts"},
      {"ContentEmptyArray", true, ChatMessages({{{"role", "user"}, {"content", json::array()}}}), 400,
       "messages[0].content", "empty array"},
      {"ContentImagePart", true,
       ChatMessages({{{"role", "user"},
                      {"content",
                       {{{"type", "text"}, {"text", "look"}},
                        {{"type", "image_url"}, {"image_url", {{"url", "http://x/y.png"}}}}}}}}),
       400, "messages[0].content[1].type", "only 'text' parts are supported"},
      {"ContentPartWithoutText", true, ChatMessages({{{"role", "user"}, {"content", {{{"type", "text"}}}}}}), 400,
       "messages[0].content[0].text", "Missing"},
      {"ContentPartWithoutType", true, ChatMessages({{{"role", "user"}, {"content", {{{"text", "x"}}}}}}), 400,
       "messages[0].content[0].type", "Missing"},
      {"ContentPartNotObject", true, ChatMessages({{{"role", "user"}, {"content", {"x"}}}}), 400,
       "messages[0].content[0]", "expected an object"},
      // Prompt.
      {"MissingPrompt", false, Completion("prompt", kRemove), 400, "prompt", "Missing required parameter"},
      {"PromptNumber", false, Completion("prompt", 5), 400, "prompt", "expected a string or an array"},
      {"PromptEmptyArray", false, Completion("prompt", json::array()), 400, "prompt", "empty array"},
      {"BatchedTextPrompts", false, Completion("prompt", {"a", "b"}), 400, "prompt", "Batched prompts"},
      {"BatchedIdPrompts", false, Completion("prompt", {{1, 2}, {3}}), 400, "prompt", "Batched prompts"},
      {"NegativeTokenId", false, Completion("prompt", {1, -2}), 400, "prompt[1]", "between 0 and 2147483647"},
      {"HugeTokenId", false, Completion("prompt", {2147483648LL}), 400, "prompt[0]", "between 0 and"},
      {"FloatTokenId", false, Completion("prompt", {1.5}), 400, "prompt[0]", "expected an integer token id"},
      {"MixedTokenIds", false, Completion("prompt", {1, "a"}), 400, "prompt[1]", "expected an integer token id"},
      {"EmptyNestedIds", false, Completion("prompt", {json::array()}), 400, "prompt[0]", "empty array"},
      {"PromptOfObjects", false, Completion("prompt", {json::object()}), 400, "prompt[0]", "expected a string"},
      // Lengths.
      {"MaxTokensZero", false, Completion("max_tokens", 0), 400, "max_tokens",
       "'max_tokens' must be at least 1, got 0"},
      {"MaxTokensNegative", true, Chat("max_tokens", -5), 400, "max_tokens", "must be at least 1, got -5"},
      {"MaxTokensString", false, Completion("max_tokens", "16"), 400, "max_tokens",
       "expected an integer, but got a string"},
      {"MaxTokensFraction", false, Completion("max_tokens", 1.5), 400, "max_tokens", "expected an integer"},
      {"MaxTokensHugeFloat", false, Completion("max_tokens", 1e30), 400, "max_tokens", "expected an integer"},
      {"MaxTokensAboveInt64", false, R"({"prompt": "a", "max_tokens": 18446744073709551615})", 400, "max_tokens",
       "too large"},
      {"MaxCompletionTokensZero", true, Chat("max_completion_tokens", 0), 400, "max_completion_tokens",
       "must be at least 1"},
      {"MinTokensNegative", false, Completion("min_tokens", -1), 400, "min_tokens", "must be at least 0"},
      {"MinTokensAboveMax", false, R"({"prompt": "a", "max_tokens": 4, "min_tokens": 5})", 400, "min_tokens",
       "at most 'max_tokens' (4), got 5"},
      {"NZero", true, Chat("n", 0), 400, "n", "'n' must be between 1 and 16, got 0"},
      {"NTooLarge", false, Completion("n", 17), 400, "n", "between 1 and 16, got 17"},
      {"NString", true, Chat("n", "2"), 400, "n", "expected an integer"},
      // Stops.
      {"FiveStops", false, Completion("stop", {"a", "b", "c", "d", "e"}), 400, "stop", "maximum length 4"},
      {"StopNumber", true, Chat("stop", 3), 400, "stop", "expected a string or an array of strings"},
      {"StopArrayWithNumber", false, Completion("stop", {"a", 1}), 400, "stop[1]", "expected a string"},
      {"EmptyStop", true, Chat("stop", ""), 400, "stop", "must not be empty"},
      {"StopTokenIdsNotArray", false, Completion("stop_token_ids", 2), 400, "stop_token_ids", "expected an array"},
      {"StopTokenIdNegative", true, Chat("stop_token_ids", {5, -1}), 400, "stop_token_ids[1]", "between 0"},
      {"IgnoreEosString", false, Completion("ignore_eos", "true"), 400, "ignore_eos", "expected a boolean"},
      // Sampling.
      {"TemperatureTooHigh", true, Chat("temperature", 2.5), 400, "temperature",
       "'temperature' must be between 0.0 and 2.0, got 2.5"},
      {"TemperatureNegative", false, Completion("temperature", -0.1), 400, "temperature", "got -0.1"},
      {"TemperatureString", true, Chat("temperature", "hot"), 400, "temperature", "expected a number"},
      {"TopPZero", false, Completion("top_p", 0), 400, "top_p", "greater than 0.0 and at most 1.0"},
      {"TopPTooHigh", true, Chat("top_p", 1.5), 400, "top_p", "got 1.5"},
      {"TopKBelowMinusOne", false, Completion("top_k", -2), 400, "top_k", "got -2"},
      {"TopKFraction", true, Chat("top_k", 1.5), 400, "top_k", "expected an integer"},
      {"MinPTooHigh", false, Completion("min_p", 1.5), 400, "min_p", "between 0.0 and 1.0"},
      {"PresencePenaltyTooHigh", true, Chat("presence_penalty", 3), 400, "presence_penalty", "between -2.0 and 2.0"},
      {"FrequencyPenaltyTooLow", false, Completion("frequency_penalty", -2.5), 400, "frequency_penalty", "got -2.5"},
      {"RepetitionPenaltyZero", true, Chat("repetition_penalty", 0), 400, "repetition_penalty", "greater than 0"},
      {"SeedString", false, Completion("seed", "x"), 400, "seed", "expected an integer"},
      {"SeedFraction", true, Chat("seed", 0.5), 400, "seed", "expected an integer"},
      // Streaming.
      {"StreamString", true, Chat("stream", "yes"), 400, "stream", "expected a boolean"},
      {"StreamOptionsWithoutStream", false, Completion("stream_options", {{"include_usage", true}}), 400,
       "stream_options", "only allowed when 'stream' is enabled"},
      {"IncludeUsageString", true, R"({"messages": [{"role": "user", "content": "a"}], "stream": true,
          "stream_options": {"include_usage": "yes"}})",
       400, "stream_options.include_usage", "expected a boolean"},
      {"StreamOptionsNotObject", true,
       R"({"messages": [{"role": "user", "content": "a"}], "stream": true, "stream_options": 1})", 400,
       "stream_options", "expected an object"},
      // Log-probs.
      {"CompletionLogprobsTooMany", false, Completion("logprobs", 21), 400, "logprobs", "between 0 and 20, got 21"},
      {"CompletionLogprobsNegative", false, Completion("logprobs", -1), 400, "logprobs", "got -1"},
      {"CompletionLogprobsBool", false, Completion("logprobs", true), 400, "logprobs",
       "expected an integer, but got a boolean"},
      {"ChatLogprobsInt", true, Chat("logprobs", 1), 400, "logprobs", "expected a boolean"},
      {"ChatTopLogprobsTooMany", true, R"({"messages": [{"role": "user", "content": "a"}], "logprobs": true,
          "top_logprobs": 21})",
       400, "top_logprobs", "between 0 and 20"},
      {"ChatTopLogprobsWithoutLogprobs", true, Chat("top_logprobs", 3), 400, "top_logprobs",
       "requires 'logprobs'"},
      // Unsupported features are refused, not ignored.
      {"Echo", false, Completion("echo", true), 400, "echo", "not supported"},
      {"BestOf", false, Completion("best_of", 2), 400, "best_of", "not supported"},
      {"Suffix", false, Completion("suffix", "end"), 400, "suffix", "not supported"},
      {"LogitBias", true, Chat("logit_bias", {{"50256", -100}}), 400, "logit_bias", "not supported"},
      {"Tools", true, Chat("tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}), 400, "tools",
       "not supported"},
      {"JsonResponseFormat", true, Chat("response_format", {{"type", "json_object"}}), 400, "response_format.type",
       "only 'text'"},
  };
}

class BadRequestTest : public testing::TestWithParam<BadCase> {};

TEST_P(BadRequestTest, IsRejectedWithOpenAiError) {
  const BadCase& c = GetParam();
  auto result = c.chat ? ParseChatRequest(c.body, Limits()) : ParseCompletionRequest(c.body, Limits());
  ASSERT_TRUE(std::holds_alternative<ApiError>(result)) << "accepted: " << c.body;
  const ApiError& e = std::get<ApiError>(result);
  EXPECT_EQ(e.status, c.status);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_EQ(e.param, c.param);
  EXPECT_NE(e.message.find(c.message), std::string::npos) << "message: " << e.message;
  // Whatever the input, the error body is valid JSON in OpenAI's shape.
  json parsed = json::parse(ErrorJson(e));
  EXPECT_EQ(parsed["error"]["message"].is_string(), true);
  EXPECT_EQ(parsed["error"]["param"], c.param.empty() ? json(nullptr) : json(c.param));
}

INSTANTIATE_TEST_SUITE_P(Rules, BadRequestTest, testing::ValuesIn(BadCases()),
                         [](const testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(BadRequest, UnknownModelCarriesModelNotFoundCode) {
  auto result = ParseCompletionRequest(Completion("model", "other"), Limits());
  const ApiError& e = std::get<ApiError>(result);
  json parsed = json::parse(ErrorJson(e));
  EXPECT_EQ(parsed["error"]["code"], "model_not_found");
  EXPECT_EQ(parsed["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e.status, 404);
}

TEST(BadRequest, ParseErrorNamesTheByteWhereItFailed) {
  auto result = ParseChatRequest("{\"messages\": [}", Limits());
  const ApiError& e = std::get<ApiError>(result);
  EXPECT_NE(e.message.find("line 1, column 15"), std::string::npos) << e.message;
  EXPECT_EQ(e.message.find("json.exception"), std::string::npos) << e.message;
}

TEST(BadRequest, InvalidUtf8ErrorIsStillValidJson) {
  auto result = ParseCompletionRequest("{\"prompt\": \"\xc3\x28\"}", Limits());
  const ApiError& e = std::get<ApiError>(result);
  std::string body = ErrorJson(e);
  EXPECT_TRUE(json::accept(body)) << body;
}

// ---- Accepted requests ----

TEST(ParseCompletion, Defaults) {
  GenerationRequest r = CompletionOk(CompletionBody());
  EXPECT_FALSE(r.chat);
  EXPECT_EQ(r.model, "tiny");
  EXPECT_EQ(std::get<std::string>(r.prompt), "Hello");
  ASSERT_TRUE(r.max_tokens.has_value());
  EXPECT_EQ(*r.max_tokens, 16);
  EXPECT_EQ(r.min_tokens, 0);
  EXPECT_EQ(r.n, 1);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_TRUE(r.stop_token_ids.empty());
  EXPECT_FALSE(r.ignore_eos);
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_EQ(r.sampling.temperature, 1.0);
  EXPECT_EQ(r.sampling.top_p, 1.0);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
  EXPECT_FALSE(r.logprobs);
}

TEST(ParseCompletion, NullMaxTokensMeansUntilTheContextIsFull) {
  GenerationRequest r = CompletionOk({{"prompt", "a"}, {"max_tokens", nullptr}});
  EXPECT_FALSE(r.max_tokens.has_value());
}

TEST(ParseCompletion, AbsentModelIsTheServedOne) {
  EXPECT_EQ(CompletionOk({{"prompt", "a"}}).model, "tiny");
  EXPECT_EQ(ChatOk({{"messages", {{{"role", "user"}, {"content", "a"}}}}}).model, "tiny");
}

TEST(ParseCompletion, PromptForms) {
  EXPECT_EQ(std::get<std::vector<int32_t>>(CompletionOk({{"prompt", {1, 2, 3}}}).prompt),
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(std::get<std::string>(CompletionOk({{"prompt", {"only"}}}).prompt), "only");
  EXPECT_EQ(std::get<std::vector<int32_t>>(CompletionOk({{"prompt", {{7, 8}}}}).prompt),
            (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(std::get<std::string>(CompletionOk({{"prompt", ""}}).prompt), "");
  EXPECT_EQ(std::get<std::vector<int32_t>>(CompletionOk({{"prompt", {2147483647}}}).prompt)[0], 2147483647);
}

TEST(ParseCompletion, EveryFieldReachesTheRequest) {
  json body = {{"prompt", "x"},     {"max_tokens", 32},          {"min_tokens", 4},
               {"n", 3},            {"stop", {"\n\n", "END"}},   {"stop_token_ids", {5, 6}},
               {"ignore_eos", true}, {"temperature", 0.5},       {"top_p", 0.9},
               {"top_k", 40},       {"min_p", 0.05},             {"presence_penalty", 0.5},
               {"frequency_penalty", -0.5}, {"repetition_penalty", 1.1}, {"seed", 1234},
               {"stream", true},    {"stream_options", {{"include_usage", true}}}, {"logprobs", 5}};
  GenerationRequest r = CompletionOk(body);
  EXPECT_EQ(*r.max_tokens, 32);
  EXPECT_EQ(r.min_tokens, 4);
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(r.stop_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.sampling.temperature, 0.5);
  EXPECT_EQ(r.sampling.top_p, 0.9);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_EQ(r.sampling.min_p, 0.05);
  EXPECT_EQ(r.sampling.presence_penalty, 0.5);
  EXPECT_EQ(r.sampling.frequency_penalty, -0.5);
  EXPECT_EQ(r.sampling.repetition_penalty, 1.1);
  ASSERT_TRUE(r.seed.has_value());
  EXPECT_EQ(*r.seed, 1234u);
  EXPECT_EQ(r.sampling.seed, 1234u);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 5);
}

TEST(ParseCompletion, BoundaryValuesAreAccepted) {
  json body = {{"prompt", "x"}, {"temperature", 0},  {"top_p", 1},    {"min_p", 1}, {"presence_penalty", -2},
               {"frequency_penalty", 2}, {"n", 16}, {"logprobs", 20}, {"max_tokens", 16.0},
               {"stop", {"a", "b", "c", "d"}}, {"top_k", -1}, {"min_tokens", 16}};
  GenerationRequest r = CompletionOk(body);
  EXPECT_EQ(r.sampling.temperature, 0.0);
  EXPECT_EQ(r.sampling.top_k, 0);  // -1 is vLLM's "off"
  EXPECT_EQ(r.n, 16);
  EXPECT_EQ(r.top_logprobs, 20);
  EXPECT_EQ(*r.max_tokens, 16);
  EXPECT_EQ(r.stop.size(), 4u);
}

TEST(ParseCompletion, LogprobsZeroStillAsksForTheSampledToken) {
  GenerationRequest r = CompletionOk({{"prompt", "x"}, {"logprobs", 0}});
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
}

TEST(ParseCompletion, SeedsKeepAll64Bits) {
  EXPECT_EQ(*CompletionOk({{"prompt", "x"}, {"seed", -1}}).seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*ParseOk(false, R"({"prompt": "x", "seed": 18446744073709551615})").seed,
            std::numeric_limits<uint64_t>::max());
}

TEST(ParseCompletion, HarmlessFormsOfUnsupportedFieldsAreAccepted) {
  json body = {{"prompt", "x"}, {"echo", false}, {"best_of", 1}, {"suffix", ""}, {"logit_bias", json::object()},
               {"stop", nullptr}, {"stream_options", nullptr}, {"user", "me"}};
  GenerationRequest r = CompletionOk(body);
  EXPECT_TRUE(r.stop.empty());
}

TEST(ParseCompletion, UnknownFieldsAreIgnored) {
  json body = CompletionBody();
  body["frobnicate"] = {{"deep", {1, 2, {{"x", nullptr}}}}};
  body["metadata"] = "anything";
  EXPECT_EQ(std::get<std::string>(CompletionOk(body).prompt), "Hello");
}

TEST(ParseCompletion, DeeplyNestedUnknownFieldDoesNotCrash) {
  // A 10 MB body of brackets must not blow the stack when it is parsed or freed.
  const int depth = 1'000'000;
  std::string body = R"({"prompt": "a", "junk": )" + std::string(depth, '[') + std::string(depth, ']') + "}";
  EXPECT_EQ(std::get<std::string>(ParseOk(false, body).prompt), "a");
}

TEST(ParseCompletion, Utf8TextSurvives) {
  GenerationRequest r = ParseOk(false, R"({"prompt": "caf\u00e9 \ud83d\ude00 日本"})");
  EXPECT_EQ(std::get<std::string>(r.prompt), "caf\xc3\xa9 \xf0\x9f\x98\x80 \xe6\x97\xa5\xe6\x9c\xac");
}

TEST(ParseCompletion, LargePromptIsAccepted) {
  std::string text(1 << 20, 'a');
  EXPECT_EQ(std::get<std::string>(CompletionOk({{"prompt", text}}).prompt).size(), text.size());
}

TEST(ParseChat, Defaults) {
  GenerationRequest r = ChatOk(ChatBody());
  EXPECT_TRUE(r.chat);
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, "user");
  EXPECT_EQ(r.messages[0].content, "Hello");
  EXPECT_FALSE(r.max_tokens.has_value());  // chat: until the context is full
  EXPECT_TRUE(r.add_generation_prompt);
  EXPECT_FALSE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
}

TEST(ParseChat, Conversation) {
  json body = {{"messages",
                {{{"role", "system"}, {"content", "Be brief."}},
                 {{"role", "user"}, {"content", "Hi"}, {"name", "bob"}},
                 {{"role", "assistant"}, {"content", ""}},
                 {{"role", "developer"}, {"content", "Use French."}}}}};
  GenerationRequest r = ChatOk(body);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "Hi");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.messages[3].role, "system");
}

TEST(ParseChat, TextPartsAreJoined) {
  json content = {{{"type", "text"}, {"text", "first"}}, {{"type", "text"}, {"text", "second"}}};
  GenerationRequest r = ChatOk({{"messages", {{{"role", "user"}, {"content", content}}}}});
  EXPECT_EQ(r.messages[0].content, "first\nsecond");
}

TEST(ParseChat, MaxCompletionTokensWinsOverMaxTokens) {
  json body = ChatBody();
  body["max_tokens"] = 10;
  EXPECT_EQ(*ChatOk(body).max_tokens, 10);
  body["max_completion_tokens"] = 20;
  EXPECT_EQ(*ChatOk(body).max_tokens, 20);
}

TEST(ParseChat, LogprobsAndTopLogprobs) {
  json body = ChatBody();
  body["logprobs"] = true;
  GenerationRequest r = ChatOk(body);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
  body["top_logprobs"] = 5;
  EXPECT_EQ(ChatOk(body).top_logprobs, 5);
  body["logprobs"] = false;
  body["top_logprobs"] = 0;  // sent by some clients with logprobs off: harmless
  EXPECT_FALSE(ChatOk(body).logprobs);
}

TEST(ParseChat, StreamWithUsageAndEmptyTools) {
  json body = ChatBody();
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  body["tools"] = json::array();
  body["response_format"] = {{"type", "text"}};
  body["add_generation_prompt"] = false;
  GenerationRequest r = ChatOk(body);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_FALSE(r.add_generation_prompt);
}

// ---- Errors ----

TEST(ErrorJson, OpenAiShape) {
  json e = json::parse(ErrorJson(InvalidRequestError("'n' must be at least 1, got 0", "n")));
  ASSERT_TRUE(e.contains("error"));
  EXPECT_EQ(e.size(), 1u);
  EXPECT_EQ(e["error"]["message"], "'n' must be at least 1, got 0");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "n");
  EXPECT_TRUE(e["error"]["code"].is_null());

  json bare = json::parse(ErrorJson(InvalidRequestError("bad")));
  EXPECT_TRUE(bare["error"]["param"].is_null());
}

TEST(ErrorJson, Helpers) {
  EXPECT_EQ(ModelNotFoundError("m").status, 404);
  EXPECT_EQ(NotFoundError("Invalid URL (GET /v2)").status, 404);
  ApiError auth = AuthenticationError();
  EXPECT_EQ(auth.status, 401);
  EXPECT_EQ(auth.code, "invalid_api_key");
  ApiError big = RequestTooLargeError(11'000'000, 10'000'000);
  EXPECT_EQ(big.status, 413);
  EXPECT_NE(big.message.find("11000000"), std::string::npos);
  EXPECT_EQ(RateLimitError("queue full").status, 429);
  EXPECT_EQ(ServiceUnavailableError("engine starting").status, 503);
  EXPECT_EQ(InternalServerError("oops").status, 500);
  for (const ApiError& e : {auth, big, RateLimitError("x"), ServiceUnavailableError("y")}) {
    json parsed = json::parse(ErrorJson(e));
    EXPECT_EQ(parsed["error"]["code"], e.code);
    EXPECT_EQ(parsed["error"]["type"], e.type);
  }
}

// ---- Responses ----

ResponseMeta Meta(bool chat, bool logprobs = false, bool include_usage = false) {
  ResponseMeta meta;
  meta.chat = chat;
  meta.id = NewResponseId(chat);
  meta.created = 1700000000;
  meta.model = "tiny";
  meta.logprobs = logprobs;
  meta.include_usage = include_usage;
  return meta;
}

LogprobEntry Entry(int32_t id, std::string token, double lp, std::vector<TopLogprobEntry> top = {}) {
  return LogprobEntry{id, std::move(token), lp, std::move(top)};
}

TEST(Response, Ids) {
  std::string a = NewResponseId(false), b = NewResponseId(false), c = NewResponseId(true);
  EXPECT_EQ(a.rfind("cmpl-", 0), 0u);
  EXPECT_EQ(a.size(), 5u + 32u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef", 5), std::string::npos);
  EXPECT_NE(a, b);
  EXPECT_EQ(c.rfind("chatcmpl-", 0), 0u);
  EXPECT_GT(UnixSeconds(), 1700000000);
}

TEST(Response, MetaFromRequest) {
  json body = ChatBody();
  body["logprobs"] = true;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  ResponseMeta meta = MakeResponseMeta(ChatOk(body));
  EXPECT_TRUE(meta.chat);
  EXPECT_EQ(meta.id.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(meta.model, "tiny");
  EXPECT_TRUE(meta.logprobs);
  EXPECT_TRUE(meta.include_usage);
  EXPECT_GT(meta.created, 0);
}

TEST(Response, CompletionWithSeveralChoices) {
  ResponseMeta meta = Meta(false);
  std::vector<ChoiceResult> choices = {{0, "Hello world", "length", {}}, {1, "Hi", "stop", {}}};
  json r = json::parse(CompletionResponseJson(meta, choices, Usage{5, 7, std::nullopt}));
  EXPECT_EQ(r["id"], meta.id);
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["created"], 1700000000);
  EXPECT_EQ(r["model"], "tiny");
  ASSERT_EQ(r["choices"].size(), 2u);
  EXPECT_EQ(r["choices"][0]["index"], 0);
  EXPECT_EQ(r["choices"][0]["text"], "Hello world");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["choices"][1]["index"], 1);
  EXPECT_EQ(r["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"], (json{{"prompt_tokens", 5}, {"completion_tokens", 7}, {"total_tokens", 12}}));
}

TEST(Response, CompletionLogprobs) {
  ResponseMeta meta = Meta(false, true);
  // "é" split over two tokens: text_offset counts characters of the joined text.
  std::vector<ChoiceResult> choices = {
      {0, "Hi\xc3\xa9!", "stop",
       {Entry(10, "Hi", -0.5, {{10, "Hi", -0.5}, {11, "Ho", -1.5}}), Entry(12, "\xc3", -0.25),
        Entry(13, "\xa9", -std::numeric_limits<double>::infinity()), Entry(14, "!", -1.0, {{15, "?", -0.1}})}}};
  json r = json::parse(CompletionResponseJson(meta, choices, Usage{3, 4, 2}));
  const json& lp = r["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], (json{"Hi", "\xef\xbf\xbd", "\xef\xbf\xbd", "!"}));
  EXPECT_EQ(lp["token_logprobs"], (json{-0.5, -0.25, -9999.0, -1.0}));
  EXPECT_EQ(lp["text_offset"], (json{0, 2, 3, 3}));
  ASSERT_EQ(lp["top_logprobs"].size(), 4u);
  EXPECT_EQ(lp["top_logprobs"][0], (json{{"Hi", -0.5}, {"Ho", -1.5}}));
  EXPECT_EQ(lp["top_logprobs"][1], (json{{"\xef\xbf\xbd", -0.25}}));  // the sampled token is always there
  EXPECT_EQ(lp["top_logprobs"][3], (json{{"?", -0.1}, {"!", -1.0}}));
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
}

TEST(Response, ChatWithLogprobs) {
  ResponseMeta meta = Meta(true, true);
  std::vector<ChoiceResult> choices = {
      {0, "Yes", "stop", {Entry(5, "Yes", -0.1, {{5, "Yes", -0.1}, {6, "No", -2.5}}), Entry(7, "\xe4", -0.3)}}};
  json r = json::parse(CompletionResponseJson(meta, choices, Usage{8, 2, std::nullopt}));
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  const json& c = r["choices"][0];
  EXPECT_EQ(c["message"], (json{{"role", "assistant"}, {"content", "Yes"}}));
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_FALSE(c.contains("text"));
  const json& content = c["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "Yes");
  EXPECT_EQ(content[0]["logprob"], -0.1);
  EXPECT_EQ(content[0]["bytes"], (json{89, 101, 115}));
  ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1], (json{{"token", "No"}, {"logprob", -2.5}, {"bytes", {78, 111}}}));
  EXPECT_EQ(content[1]["token"], "\xef\xbf\xbd");
  EXPECT_EQ(content[1]["bytes"], (json{0xe4}));  // the raw byte, not the replacement
  EXPECT_TRUE(content[1]["top_logprobs"].is_array());
  EXPECT_EQ(r["usage"]["total_tokens"], 10);
  EXPECT_FALSE(r["usage"].contains("prompt_tokens_details"));
}

TEST(Response, ChatWithoutLogprobsAndInvalidText) {
  ResponseMeta meta = Meta(true);
  std::vector<ChoiceResult> choices = {{0, "ok\xff", "length", {}}};
  json r = json::parse(CompletionResponseJson(meta, choices, Usage{1, 1, std::nullopt}));
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["choices"][0]["message"]["content"], "ok\xef\xbf\xbd");
}

TEST(Stream, ChatChunks) {
  ResponseMeta meta = Meta(true);
  json first = json::parse(StreamChunkJson(meta, ChunkDelta{0, true, "", {}, 0, ""}));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["id"], meta.id);
  EXPECT_EQ(first["created"], 1700000000);
  EXPECT_EQ(first["model"], "tiny");
  ASSERT_EQ(first["choices"].size(), 1u);
  EXPECT_EQ(first["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(first["choices"][0]["logprobs"].is_null());
  EXPECT_FALSE(first.contains("usage"));

  json middle = json::parse(StreamChunkJson(meta, ChunkDelta{2, false, "lo", {}, 0, ""}));
  EXPECT_EQ(middle["choices"][0]["index"], 2);
  EXPECT_EQ(middle["choices"][0]["delta"], (json{{"content", "lo"}}));

  json last = json::parse(StreamChunkJson(meta, ChunkDelta{2, false, "", {}, 0, "stop"}));
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");

  json last_with_text = json::parse(StreamChunkJson(meta, ChunkDelta{0, false, "!", {}, 0, "length"}));
  EXPECT_EQ(last_with_text["choices"][0]["delta"], (json{{"content", "!"}}));
  EXPECT_EQ(last_with_text["choices"][0]["finish_reason"], "length");
}

TEST(Stream, ChatChunkLogprobsAndUsageNull) {
  ResponseMeta meta = Meta(true, true, true);
  ChunkDelta delta{0, false, "a", {Entry(1, "a", -0.5, {{1, "a", -0.5}})}, 0, ""};
  json chunk = json::parse(StreamChunkJson(meta, delta));
  EXPECT_TRUE(chunk.contains("usage"));
  EXPECT_TRUE(chunk["usage"].is_null());
  const json& content = chunk["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 1u);
  EXPECT_EQ(content[0]["token"], "a");
  EXPECT_EQ(content[0]["top_logprobs"][0]["logprob"], -0.5);
  // A final chunk without tokens says null rather than an empty list.
  json last = json::parse(StreamChunkJson(meta, ChunkDelta{0, false, "", {}, 0, "stop"}));
  EXPECT_TRUE(last["choices"][0]["logprobs"].is_null());
}

TEST(Stream, CompletionChunks) {
  ResponseMeta meta = Meta(false, true);
  ChunkDelta delta{1, false, "b\xc3\xa9", {Entry(3, "b", -0.1), Entry(4, "\xc3\xa9", -0.2)}, 7, ""};
  json chunk = json::parse(StreamChunkJson(meta, delta));
  EXPECT_EQ(chunk["object"], "text_completion");
  const json& c = chunk["choices"][0];
  EXPECT_EQ(c["index"], 1);
  EXPECT_EQ(c["text"], "b\xc3\xa9");
  EXPECT_TRUE(c["finish_reason"].is_null());
  EXPECT_EQ(c["logprobs"]["text_offset"], (json{7, 8}));
  EXPECT_EQ(c["logprobs"]["tokens"], (json{"b", "\xc3\xa9"}));
  EXPECT_FALSE(c.contains("delta"));

  json last = json::parse(StreamChunkJson(Meta(false), ChunkDelta{0, false, "", {}, 0, "length"}));
  EXPECT_EQ(last["choices"][0]["text"], "");
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(last["choices"][0]["logprobs"].is_null());
}

TEST(Stream, UsageChunk) {
  for (bool chat : {false, true}) {
    ResponseMeta meta = Meta(chat, false, true);
    json u = json::parse(UsageChunkJson(meta, Usage{4, 6, std::nullopt}));
    EXPECT_EQ(u["object"], chat ? "chat.completion.chunk" : "text_completion");
    EXPECT_EQ(u["id"], meta.id);
    EXPECT_EQ(u["choices"], json::array());
    EXPECT_EQ(u["usage"], (json{{"prompt_tokens", 4}, {"completion_tokens", 6}, {"total_tokens", 10}}));
  }
}

TEST(Stream, SseFraming) {
  EXPECT_EQ(SseEvent(R"({"a":1})"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(SseDone(), "data: [DONE]\n\n");
  // Chunks are one line: a newline inside would break the event.
  std::string chunk = StreamChunkJson(Meta(true), ChunkDelta{0, false, "line1\nline2\r\n", {}, 0, ""});
  EXPECT_EQ(chunk.find('\n'), std::string::npos);
  EXPECT_EQ(json::parse(chunk)["choices"][0]["delta"]["content"], "line1\nline2\r\n");
}

TEST(Models, List) {
  std::vector<ModelInfo> models = {{"tiny", 1700000000, "moe-serve", 4096}, {"other", 5, "me", 0}};
  json list = json::parse(ModelListJson(models));
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 2u);
  const json& m = list["data"][0];
  EXPECT_EQ(m["id"], "tiny");
  EXPECT_EQ(m["object"], "model");
  EXPECT_EQ(m["created"], 1700000000);
  EXPECT_EQ(m["owned_by"], "moe-serve");
  EXPECT_EQ(m["max_model_len"], 4096);
  EXPECT_FALSE(list["data"][1].contains("max_model_len"));
  EXPECT_EQ(json::parse(ModelJson(models[1]))["owned_by"], "me");
  EXPECT_EQ(json::parse(ModelListJson({}))["data"], json::array());
}

}  // namespace
}  // namespace moe
