// Exit codes shared by every wsup program, so that the supervisor reads a
// child's exit the same way whichever program it is.
//
// kExitConfig follows sysexits.h EX_CONFIG and systemd's convention: a unit
// with RestartPreventExitStatus=78 stops its restart loop on it. A child
// that exits with a permanent-failure code is not restarted: the same
// command would fail the same way.
#pragma once

namespace wsup {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // transient; a restart may help
inline constexpr int kExitUsage = 2;     // bad flags: the command line is wrong
inline constexpr int kExitRefused = 3;   // the input (checkpoint, fingerprint) was refused
inline constexpr int kExitConfig = 78;   // the configuration cannot work


}  // namespace wsup
