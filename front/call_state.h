// A proxied call's lifecycle as a table: where the call is (waiting for an
// engine, sent, relaying an answer, continuing a cut stream, done) and the
// events that move it. ProxyCall (front/proxy_call.h) moves only along the
// rows of CallTransitions(); an event with no row is a bug in the call, logged
// and ignored. Each row is tested in-process (tests/front/call_state_test.cc).
//
// The "resume" half mirrors the first: once bytes of a stream reached the
// client, every later attempt continues that stream (its head is never sent
// again), so the call stays on that side until it is done.
#pragma once

#include <optional>
#include <span>

namespace wsup::front {

enum class CallState {
  kNew,           // not on an engine: to be routed (first, or again after a failure)
  kQueued,        // waiting in the proxy's queue for an engine
  kSent,          // an attempt is out; no answer head yet
  kRelaying,      // the answer's head came; its body is relayed (or buffered)
  kResumeNew,     // a cut stream, to be routed to an engine that continues it
  kResumeQueued,  // ... waiting in the queue for one
  kResumeSent,    // the continuation is out; no head yet
  kResuming,      // the continuation's events follow the ones the client has
  kDone,          // answered, cut off, or the client went away
};

enum class CallEvent {
  kQueue,        // no engine now: into the queue
  kSend,         // an attempt goes out to an engine
  kHead,         // the attempt's answer head came (and is taken)
  kRetry,        // the attempt failed before the client saw a byte: routed again
  kResume,       // the stream was cut after tokens reached the client: continued elsewhere
  kAdopt,        // a hedge won before the client saw a byte: its attempt is the call's
  kAdoptResume,  // a hedge that continues the stream won
  kFinish,       // the call ends
};

struct CallTransition {
  CallState from;
  CallEvent event;
  CallState to;
};

std::span<const CallTransition> CallTransitions();
// The state after `e` in `s`; nullopt when no row allows it.
std::optional<CallState> NextCallState(CallState s, CallEvent e);
// The client's head is out: attempts continue its stream.
bool IsResuming(CallState s);
// Waiting in the queue.
bool IsQueued(CallState s);

const char* CallStateName(CallState s);
const char* CallEventName(CallEvent e);

}  // namespace wsup::front
