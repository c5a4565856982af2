// ControlClient: a blocking client of a JSON control socket (the
// supervisor's and the front's), for tests and benchmarks, which need more
// than one call (wire/json_call.h): one connection kept across calls, the
// events the socket pushes ({"type":"event"}, the front's) kept apart from
// the replies and waited for, raw bytes for tests of hostile peers, and the
// moment the peer closes. It speaks the frames of wire/json_frame.h (the one
// codec), so a reply is decoded exactly as the product decodes it.
//
// Connecting and sending are wire's Channel (wire/protocol.h), whose errors
// name the socket and the peer. Reading is not: Channel's reader also takes
// the holder protocol's fds and binary parts and stops at a refused frame,
// while a test of a hostile peer reads on to the peer's close; so replies
// go through a FrameDecoder of the default dialect, read from the
// channel's fd here.
//
// Every wait is bounded: connecting and each send by 5 s, replies and
// events by their limit. A failed send or read closes the connection; the
// next Call() connects again to the same path.
//
// One thread at a time.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "wire/json_frame.h"
#include "wire/protocol.h"

namespace wsup::test {

class ControlClient {
 public:
  ControlClient() = default;
  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;

  Status Connect(const std::string& path);
  void Close();
  bool connected() const { return channel_.connected(); }

  Status SendRaw(std::string_view bytes);
  Status Send(const nlohmann::json& msg);
  // The next message that is not an event (events are kept in events()).
  Result<nlohmann::json> Reply(std::chrono::milliseconds limit = std::chrono::seconds(5));
  // Send() then Reply(), connecting first when not connected.
  Result<nlohmann::json> Call(const nlohmann::json& msg, std::chrono::milliseconds limit = std::chrono::seconds(5));
  // An event of this kind (already received or arriving within limit); with
  // `field`, only one whose field equals `value`.
  Result<nlohmann::json> WaitEvent(const std::string& kind, const std::string& field = "",
                                   const std::string& value = "",
                                   std::chrono::milliseconds limit = std::chrono::seconds(5));
  // True once the peer closed this connection within limit.
  bool WaitClosed(std::chrono::milliseconds limit = std::chrono::seconds(5));

  const std::vector<nlohmann::json>& events() const { return events_; }
  // The events received so far, oldest first; clears them.
  std::vector<nlohmann::json> TakeEvents();

 private:
  // The next message of any kind; an error on timeout, EOF or a bad frame.
  Result<nlohmann::json> Next(std::chrono::steady_clock::time_point deadline);
  // Reads what the socket has within the deadline into decoder_.
  Status Fill(std::chrono::steady_clock::time_point deadline);

  Channel channel_;
  std::string path_;
  FrameDecoder decoder_;
  bool eof_ = false;
  std::vector<nlohmann::json> events_;
};

// A blocking call on a Unix socket that answers one line-oriented command
// (HAProxy's stats socket): a connection per command, the whole answer.
Result<std::string> HaproxyCommand(const std::string& socket, const std::string& command,
                                   std::chrono::milliseconds limit = std::chrono::seconds(2));

}  // namespace wsup::test
