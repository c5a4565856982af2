// The logic behind `wsup cache info` and `wsup cache verify`, kept apart
// from the command line so that tests call it directly and the CLI stays a
// thin layer.
//
//   info:   asks a holder what it serves (fingerprint, tensors, bytes,
//           backend, allocations, attached clients, the KV pool's id,
//           bytes and allocations when it has one; for a holder of
//           engine-made layouts, `layout` "engine" and `layouts`: each one's
//           state "writing" or "committed", tensors, bytes, fingerprint,
//           writer or hash).
//   verify: attaches as an inspector (the holder's fingerprint is taken as
//           given: differences are reported, not refused), reads every
//           resident tensor back and compares it byte for byte with the
//           checkpoint on disk (the rank's slice under tensor parallelism).
//           It works against a holder restarted from kept fds, and with a
//           checkpoint folder at another path holding the same files.
//
// Exit codes: 0 all good; 1 a resident tensor differs from the checkpoint
// or is missing from one side; 2 the check could not be made (no holder,
// unreadable checkpoint). Output goes to `out` (stdout) and, for failures
// in text mode, `err` (stderr); with json, one JSON object on `out`.
//
// Blocking; any thread. Every call opens and closes its own connection.
#pragma once

#include <string>

namespace wsup {

struct CommandOutput {
  int exit_code = 0;
  std::string out;
  std::string err;
};

inline constexpr int kCacheExitOk = 0;
inline constexpr int kCacheExitMismatch = 1;
inline constexpr int kCacheExitError = 2;

CommandOutput CacheInfoCommand(const std::string& socket_path, bool json, int timeout_ms = 10'000);
CommandOutput CacheVerifyCommand(const std::string& socket_path, const std::string& model_dir, bool json,
                                 int timeout_ms = 10'000);

}  // namespace wsup
