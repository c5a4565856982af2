// Fuzzes what wsup-front parses itself (client HTTP framing is the http
// fuzzer's): control-socket frames and messages, completion request bodies
// (the stream-resume planning), and engine event streams (the SSE relay),
// split at an input-chosen point so that events cut anywhere are covered.
// The front must neither crash nor throw on any of them, however deeply
// they nest (the corpus holds bodies 70,000 levels deep and some at the
// shared JSON limit of 64 levels).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/json_limits.h"
#include "front/completion.h"
#include "front/control_socket.h"
#include "front/sse_relay.h"
#include "wire/json_frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  size_t split = size > 1 ? data[0] % size : 0;
  if (split > in.size()) split = in.size();

  wsup::FrameDecoder decoder(wsup::front::ControlFrames(4096));
  (void)decoder.Feed(in.data(), split);
  (void)decoder.Feed(in.data() + split, in.size() - split);
  // Every message, and past every bad body, until the frames end or a bad
  // length prefix is all that is left.
  for (;;) {
    auto m = decoder.Next();
    if (m.ok() ? !m->has_value() : decoder.failed()) break;
  }
  (void)wsup::ParseFrameBody(in, wsup::front::ControlFrames());

  wsup::front::CompletionPlan plan;
  if (wsup::front::PlanCompletion(in, 16, &plan)) {
    // Planned means within the shared JSON limit (common/json_limits.h):
    // nothing deeper may reach the parser or the walks over what it builds.
    if (wsup::JsonNestingDepth(in) > wsup::kMaxJsonDepth) __builtin_trap();
    if (plan.resumable) (void)wsup::front::ResumeBody(plan, plan.prompt_ids, {1, 2, 3}, 5);
  }

  for (bool strip : {false, true}) {
    wsup::front::CompletionStream stream(strip);
    std::string out;
    stream.Feed(in.substr(0, split), &out);
    stream.BeginContinuation();
    stream.Feed(in.substr(split), &out);
    out += stream.SynthesizeEnd("length");
  }
  return 0;
}
