// The front's control socket in its own words: the bounds and refusals of
// its frames and of its server, on the one JSON socket (wire/json_socket.h)
// that the supervisor's control socket uses too.
//
// Where it differs from the node's control socket (wsup.sock): a message is
// at most 64 KiB; every complete length prefix is checked as it arrives,
// so the messages that came whole before a bad one are still answered
// before the client is dropped; a bad message gets an error reply
// {"ok":false,"error":...} (a body that is not a JSON object keeps the
// client, a bad length prefix drops it after the reply); a client that
// reads neither replies nor events is dropped once 1 MiB waits for it; and
// there is no uid check: the socket's mode 0600 lets only the front's user
// (and root) connect. Refusals name the --control flag.
//
// Values; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "wire/json_frame.h"
#include "wire/json_socket.h"

namespace wsup::front {

// Control messages are a few hundred bytes; 64 KiB leaves room for a status
// reply with many backends without letting a peer make us buffer megabytes.
inline constexpr uint32_t kMaxControlMessageBytes = 64 * 1024;
inline constexpr size_t kMaxControlClients = 64;
inline constexpr size_t kMaxControlQueuedBytes = 1 << 20;

// {"ok":false,"error":message}: every error reply of the front's control socket.
nlohmann::json ErrorReply(const std::string& message);

// The control socket's frames, bounded by max_bytes.
FrameDialect ControlFrames(uint32_t max_bytes = kMaxControlMessageBytes);

// The control socket's server: its frames, limits and words.
JsonServerOptions ControlSocketOptions();

}  // namespace wsup::front
