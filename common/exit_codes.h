// Exit codes: the one table for every wsup program (wsup, wsup-holder,
// wsup-engine, wsup-front), so that the supervisor reads a child's exit the
// same way whichever program it is.
//
// kExitConfig follows sysexits.h EX_CONFIG and systemd's convention: a unit
// with RestartPreventExitStatus=78 stops its restart loop on it. A child
// that exits with a permanent-failure code is not restarted: the same
// command would fail the same way.
//
// Who says a refused input how:
//   wsup-holder   kExitRefused (3): the checkpoint, the fingerprint or a kept
//                 record was refused; kExitConfig for a config that cannot work.
//   wsup-engine   kExitConfig (78) for every permanent refusal (a bad or
//                 unsupported checkpoint, a fingerprint mismatch in daemon
//                 mode): 78 is what third-party engine commands are asked to
//                 use (docs/config.md), so the reference engine uses it too.
//   wsup          kExitConfig when the node's config cannot work.
// The supervisor treats kExitUsage, kExitRefused and kExitConfig of a
// holder, and kExitUsage and kExitConfig of an engine, as permanent.
#pragma once

namespace wsup {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // transient; a restart may help
inline constexpr int kExitUsage = 2;     // bad flags: the command line is wrong
inline constexpr int kExitRefused = 3;   // the input (checkpoint, fingerprint) was refused
inline constexpr int kExitConfig = 78;   // the configuration cannot work


}  // namespace wsup
