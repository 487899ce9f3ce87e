#include "server/stop_matcher.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace moe {
namespace {

// Feeds `pieces` and returns everything emitted (Flush included when nothing matched).
struct Fed {
  std::string text;
  bool stopped = false;
  std::string matched;
};
Fed Feed(std::vector<std::string> stops, const std::vector<std::string>& pieces) {
  StopMatcher m(std::move(stops));
  Fed run;
  for (const std::string& p : pieces) {
    StopMatcher::Result r = m.Push(p);
    run.text += r.text;
    if (r.stopped) {
      run.stopped = true;
      break;
    }
  }
  if (!run.stopped) run.text += m.Flush();
  run.matched = m.matched();
  return run;
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.Push("abc").text, "abc");
  EXPECT_EQ(m.Push("").text, "");
  EXPECT_EQ(m.Flush(), "");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, EmptyStopStringsAreIgnored) {
  StopMatcher m({"", ""});
  StopMatcher::Result r = m.Push("abc");
  EXPECT_EQ(r.text, "abc");
  EXPECT_FALSE(r.stopped);
}

TEST(StopMatcher, TextWithoutStopIsEmittedAtOnce) {
  StopMatcher m({"END"});
  StopMatcher::Result r = m.Push("hello ");
  EXPECT_EQ(r.text, "hello ");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(m.Push("world").text, "world");
}

TEST(StopMatcher, MatchInsideOnePiece) {
  StopMatcher m({"END"});
  StopMatcher::Result r = m.Push("abcENDdef");
  EXPECT_EQ(r.text, "abc");
  EXPECT_TRUE(r.stopped);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "END");
}

TEST(StopMatcher, PieceThatIsExactlyTheStop) {
  StopMatcher m({"\n\n"});
  EXPECT_EQ(m.Push("para").text, "para");
  StopMatcher::Result r = m.Push("\n\n");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
}

TEST(StopMatcher, HoldsBackAPossiblePrefixThenReleasesIt) {
  StopMatcher m({"END"});
  StopMatcher::Result r = m.Push("abcE");
  EXPECT_EQ(r.text, "abc");  // "E" may start "END"
  r = m.Push("N");
  EXPECT_EQ(r.text, "");  // "EN" still may
  r = m.Push("x");
  EXPECT_EQ(r.text, "ENx");  // no longer
  EXPECT_FALSE(r.stopped);
}

TEST(StopMatcher, MatchAcrossThreePieces) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.Push("xS").text, "x");
  EXPECT_EQ(m.Push("T").text, "");
  EXPECT_EQ(m.Push("O").text, "");
  StopMatcher::Result r = m.Push("Pyz");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
}

TEST(StopMatcher, TextBeforeTheStopInTheSamePieceIsEmitted) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.Push("aST").text, "a");
  StopMatcher::Result r = m.Push("bbSTOP");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "STbb");
}

TEST(StopMatcher, FlushReleasesHeldText) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.Push("thE").text, "th");
  EXPECT_EQ(m.Flush(), "E");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcher, PushesAfterAMatchAreIgnored) {
  StopMatcher m({"x"});
  EXPECT_TRUE(m.Push("ax").stopped);
  StopMatcher::Result r = m.Push("more");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcher, LongestPossiblePrefixIsHeld) {
  // Both "a" and "aa" are prefixes of "aab"; holding only "a" would lose the match.
  StopMatcher m({"aab"});
  EXPECT_EQ(m.Push("caa").text, "c");
  StopMatcher::Result r = m.Push("b");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
}

TEST(StopMatcher, SelfOverlappingStop) {
  // "abab" inside "abababX": the first occurrence starts at 0.
  EXPECT_EQ(Feed({"abab"}, {"ab", "ab", "ab", "X"}).text, "");
  // "aaa" after "aa" + "aa": the match starts at the first a.
  Fed run = Feed({"aaa"}, {"xaa", "aa"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.text, "x");
}

TEST(StopMatcher, MultipleStopsFirstToCompleteWins) {
  Fed run = Feed({"world", "lo"}, {"hel", "lo wor", "ld"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.text, "hel");
  EXPECT_EQ(run.matched, "lo");
}

TEST(StopMatcher, OverlappingStopsEarliestEndWinsThenEarliestStart) {
  // Both in one piece: "bc" ends before "abcd" does.
  Fed run = Feed({"abcd", "bc"}, {"xabcd"});
  EXPECT_EQ(run.text, "xa");
  EXPECT_EQ(run.matched, "bc");
  // Same end: the longer, earlier-starting one is removed whole.
  run = Feed({"cd", "bcd"}, {"abcd"});
  EXPECT_EQ(run.text, "a");
  EXPECT_EQ(run.matched, "bcd");
}

TEST(StopMatcher, StopThatIsAPrefixOfAnother) {
  Fed run = Feed({"ab", "abc"}, {"x", "a", "b", "c"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.text, "x");
  EXPECT_EQ(run.matched, "ab");
}

TEST(StopMatcher, HoldBackFollowsTheStopThatCouldStillMatch) {
  StopMatcher m({"xyz", "yq"});
  EXPECT_EQ(m.Push("axy").text, "a");  // "xy" may start "xyz"
  StopMatcher::Result r = m.Push("q");  // "yq" completes inside the held text
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "x");
}

TEST(StopMatcher, MultiByteCharactersAreNeverSplit) {
  // "日本" is 6 bytes; a held prefix always starts where a stop starts, on a character boundary.
  StopMatcher m({"日本語"});
  StopMatcher::Result r = m.Push("こんにちは日");
  EXPECT_EQ(r.text, "こんにちは");
  r = m.Push("本");
  EXPECT_EQ(r.text, "");
  r = m.Push("人");
  EXPECT_EQ(r.text, "日本人");
  r = m.Push("日本語です");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
}

TEST(StopMatcher, ResultDoesNotDependOnHowTheTextIsCut) {
  // Cut the same text into random pieces (at character boundaries: all ASCII here) and compare
  // with feeding it whole.
  const std::string text = "the cat sat on the mat; the bat ate the rat. THE END";
  const std::vector<std::vector<std::string>> stop_sets = {
      {"the rat"}, {"at;", "t s"}, {"mat", "at on"}, {"END"}, {"nothing"}, {"e b", "the bat", "b"}, {"aa", "a."}};
  std::mt19937 rng(7);
  for (const auto& stops : stop_sets) {
    Fed whole = Feed(stops, {text});
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<std::string> pieces;
      size_t pos = 0;
      while (pos < text.size()) {
        size_t len = 1 + rng() % 5;
        pieces.push_back(text.substr(pos, len));
        pos += len;
      }
      Fed cut = Feed(stops, pieces);
      ASSERT_EQ(cut.text, whole.text) << "stops[0]=" << stops[0] << " trial " << trial;
      ASSERT_EQ(cut.stopped, whole.stopped);
      ASSERT_EQ(cut.matched, whole.matched);
    }
  }
  EXPECT_EQ(Feed({"the rat"}, {text}).text, "the cat sat on the mat; the bat ate ");
  EXPECT_EQ(Feed({"nothing"}, {text}).text, text);
}

}  // namespace
}  // namespace moe
