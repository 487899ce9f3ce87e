// Stop strings over a stream of text pieces, for one choice. Text that might still turn out to be
// the start of a stop string is held back until the next piece decides it, so nothing of a stop
// string is ever emitted, even when it spans several tokens.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace moe {

class StopMatcher {
 public:
  struct Result {
    std::string text;     // safe to emit now; on a match, everything before the stop string
    bool stopped = false;  // a stop string matched: end the choice with finish_reason "stop"
  };

  // Empty stop strings are ignored (the protocol layer refuses them).
  explicit StopMatcher(std::vector<std::string> stops);

  // Pieces are whole UTF-8 characters (as IncrementalDetokenizer gives them); held-back text then
  // always starts at a character boundary, because it starts where a stop string starts.
  // When several stop strings occur, the one that ends first wins (ties: the one starting first),
  // which is what feeding the text one byte at a time would find: the result does not depend on
  // how the text is cut into pieces. After a match, pushes return nothing.
  Result Push(std::string_view piece);

  // The held-back text at the end of a stream that did not stop; empty after a match.
  std::string Flush();

  bool stopped() const { return stopped_; }
  // The stop string that matched; empty while none has.
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace moe
