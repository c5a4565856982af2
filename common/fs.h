// Small file helpers that return Status instead of throwing.
#pragma once

#include <string>

#include "common/status.h"

namespace wsup {

// Reads a whole (small) file. Refuses files larger than max_bytes, naming them.
Result<std::string> ReadFile(const std::string& path, size_t max_bytes = 64 << 20);

// Writes to "<path>.tmp.<pid>", fsyncs, then renames over path, so readers
// never see a half-written file.
Status WriteFileAtomic(const std::string& path, const std::string& contents, int mode = 0644);

// Creates dir (and parents) with the given mode; an existing dir is fine.
Status MakeDirs(const std::string& dir, int mode = 0755);

// MakeDirs(dir, 0700), then makes sure no other user can look inside: a
// folder with group or other bits is tightened to 0700 when this user owns
// it (true: it was; the caller says so), and refused, naming its owner, its
// mode and the fix, when another user does (wsup does not change what it
// does not own). `what` names the setting in errors ("node.state_dir").
Result<bool> MakePrivateDir(const std::string& dir, const std::string& what);

// Directory part and file part of a path ("a/b/c" -> "a/b", "c").
std::string DirName(const std::string& path);
std::string BaseName(const std::string& path);
// Joins two path parts with one slash; an absolute rhs wins.
std::string JoinPath(const std::string& lhs, const std::string& rhs);

}  // namespace wsup
