#include "server/engine_messages.h"

#include <gtest/gtest.h>

namespace moe {
namespace {

TEST(EngineMessages, SubmitSurvivesTheWire) {
  EngineRequest r;
  r.id = (int64_t{1234} << 32) | 7;
  r.prompt = {0, 5, 4095};
  r.max_tokens = 9;
  r.min_tokens = 2;
  r.sampling.temperature = 0.7;
  r.sampling.top_p = 0.9;
  r.sampling.top_k = 40;
  r.sampling.min_p = 0.05;
  r.sampling.repetition_penalty = 1.1;
  r.sampling.presence_penalty = -0.5;
  r.sampling.frequency_penalty = 0.25;
  r.sampling.seed = ~uint64_t{0};
  r.logprobs = 3;
  r.eos_id = 1;
  r.ignore_eos = true;
  r.stop_token_ids = {7, 8};
  r.priority = -2;
  auto decoded = DecodeToEngine(Encode(ToEngine(SubmitMessage{"api-1", r})));
  ASSERT_TRUE(decoded.ok()) << decoded.status().message();
  const auto& submit = std::get<SubmitMessage>(*decoded);
  EXPECT_EQ(submit.client, "api-1");
  const EngineRequest& d = submit.request;
  EXPECT_EQ(d.id, r.id);
  EXPECT_EQ(d.prompt, r.prompt);
  EXPECT_EQ(d.max_tokens, 9);
  EXPECT_EQ(d.min_tokens, 2);
  EXPECT_EQ(d.sampling.temperature, 0.7);
  EXPECT_EQ(d.sampling.top_p, 0.9);
  EXPECT_EQ(d.sampling.top_k, 40);
  EXPECT_EQ(d.sampling.min_p, 0.05);
  EXPECT_EQ(d.sampling.repetition_penalty, 1.1);
  EXPECT_EQ(d.sampling.presence_penalty, -0.5);
  EXPECT_EQ(d.sampling.frequency_penalty, 0.25);
  EXPECT_EQ(d.sampling.seed, ~uint64_t{0});
  EXPECT_EQ(d.logprobs, 3);
  EXPECT_EQ(d.eos_id, std::optional<int32_t>(1));
  EXPECT_TRUE(d.ignore_eos);
  EXPECT_EQ(d.stop_token_ids, (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(d.priority, -2);
}

TEST(EngineMessages, AbsentEosStaysAbsent) {
  EngineRequest r;
  r.prompt = {1};
  auto decoded = DecodeToEngine(Encode(ToEngine(SubmitMessage{"c", r})));
  ASSERT_TRUE(decoded.ok());
  EXPECT_FALSE(std::get<SubmitMessage>(*decoded).request.eos_id.has_value());
}

TEST(EngineMessages, SmallMessagesSurviveTheWire) {
  auto hello = DecodeToEngine(Encode(ToEngine(HelloMessage{"api-9"})));
  ASSERT_TRUE(hello.ok());
  EXPECT_EQ(std::get<HelloMessage>(*hello).client, "api-9");
  auto abort = DecodeToEngine(Encode(ToEngine(AbortMessage{{3, 4}})));
  ASSERT_TRUE(abort.ok());
  EXPECT_EQ(std::get<AbortMessage>(*abort).ids, (std::vector<RequestId>{3, 4}));
  auto query = DecodeToEngine(Encode(ToEngine(MetricsQuery{"api-2", 17})));
  ASSERT_TRUE(query.ok());
  EXPECT_EQ(std::get<MetricsQuery>(*query).query_id, 17u);
  auto info = DecodeFromEngine(Encode(FromEngine(EngineInfo{"m", 1024, 4096, 5000})));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(std::get<EngineInfo>(*info).max_model_len, 1024);
  EXPECT_EQ(std::get<EngineInfo>(*info).vocab_size, 4096);
  auto metrics = DecodeFromEngine(Encode(FromEngine(MetricsReply{5, "moe:x 1\n"})));
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(std::get<MetricsReply>(*metrics).text, "moe:x 1\n");
}

TEST(EngineMessages, StepSurvivesTheWire) {
  StepMessage step;
  RequestOutput out;
  out.id = 11;
  out.new_token_ids = {4, 5};
  out.new_logprobs = {{{4, -0.1}, {6, -2.5}}, {{5, -0.2}}};
  out.finished = true;
  out.finish_reason = "length";
  out.num_prompt_tokens = 30;
  out.num_cached_tokens = 16;
  step.outputs.push_back(out);
  step.errors.push_back({12, 429, "full"});
  step.load = {3, 4, 0.5, 99};
  auto decoded = DecodeFromEngine(Encode(FromEngine(step)));
  ASSERT_TRUE(decoded.ok()) << decoded.status().message();
  const auto& d = std::get<StepMessage>(*decoded);
  ASSERT_EQ(d.outputs.size(), 1u);
  const RequestOutput& o = d.outputs[0];
  EXPECT_EQ(o.id, 11);
  EXPECT_EQ(o.new_token_ids, out.new_token_ids);
  ASSERT_EQ(o.new_logprobs.size(), 2u);
  EXPECT_EQ(o.new_logprobs[0][1].id, 6);
  EXPECT_EQ(o.new_logprobs[0][1].logprob, -2.5);
  EXPECT_TRUE(o.finished);
  EXPECT_EQ(o.finish_reason, "length");
  EXPECT_EQ(o.num_prompt_tokens, 30);
  EXPECT_EQ(o.num_cached_tokens, 16);
  ASSERT_EQ(d.errors.size(), 1u);
  EXPECT_EQ(d.errors[0].status, 429);
  EXPECT_EQ(d.errors[0].message, "full");
  EXPECT_EQ(d.load.num_running, 3);
  EXPECT_EQ(d.load.num_waiting, 4);
  EXPECT_EQ(d.load.kv_cache_usage, 0.5);
  EXPECT_EQ(d.load.num_tokens, 99);
}

TEST(EngineMessages, GarbageIsAnErrorNotACrash) {
  for (const std::string& bytes : {std::string(), std::string("\xc1"), std::string("\x81\xa4type\xa3zzz"),
                                  std::string("\x81\xa4type\xa6submit")}) {
    EXPECT_FALSE(DecodeToEngine(bytes).ok());
    EXPECT_FALSE(DecodeFromEngine(bytes).ok());
  }
  auto unknown = DecodeToEngine(std::string("\x81\xa4type\xa3zzz"));
  EXPECT_NE(unknown.status().message().find("zzz"), std::string::npos);
}

}  // namespace
}  // namespace moe
