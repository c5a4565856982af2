#include "state/losses.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "common/fs.h"

namespace wsup {

namespace {

using nlohmann::json;

// The latest error is kept short enough that the record always fits.
constexpr size_t kMaxErrorChars = 1024;

Status WriteAllAt(int fd, const std::string& text, const std::string& path) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::pwrite(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(path + ": cannot write the count of rows the ledger lost", errno);
    }
    done += static_cast<size_t>(n);
  }
  if (::fdatasync(fd) != 0) return ErrnoError(path + ": cannot sync the count of rows the ledger lost", errno);
  return Status::Ok();
}

}  // namespace

void LedgerLosses::Add(const std::string& table, int64_t now_ms, const std::string& why) {
  ++rows;
  ++by_table[table];
  if (first_ms == 0) first_ms = now_ms;
  last_ms = now_ms;
  last_error = why.size() > kMaxErrorChars ? why.substr(0, kMaxErrorChars - 3) + "..." : why;
}

std::string LossFilePath(const std::string& ledger_path) { return ledger_path + "-lost"; }

std::string RenderLosses(const LedgerLosses& l) {
  json by = json::object();
  for (const auto& [table, n] : l.by_table) by[table] = n;
  json j{{"rows", l.rows}, {"by_table", by}, {"first_ms", l.first_ms}, {"last_ms", l.last_ms}};
  std::string err = l.last_error.size() > kMaxErrorChars ? l.last_error.substr(0, kMaxErrorChars) : l.last_error;
  j["last_error"] = err;
  // Invalid UTF-8 in an error (a path) is replaced, never a throw.
  std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() + 1 > kLossFileBytes) {
    j["last_error"] = "";
    text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  text.resize(kLossFileBytes - 1, ' ');
  text += '\n';
  return text;
}

Result<LedgerLosses> ParseLosses(const std::string& path, const std::string& text) {
  const std::string fix = "; move it aside (the count of lost rows then starts again from 0)";
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Corrupt(path + ": not a record of lost ledger rows" + fix);
  LedgerLosses l;
  auto int_field = [&](const char* key, int64_t* out) -> Status {
    if (!j.contains(key)) return Status::Ok();
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < 0)
      return Corrupt(path + ": \"" + key + "\" is not a count or a time" + fix);
    *out = j[key].get<int64_t>();
    return Status::Ok();
  };
  WSUP_RETURN_IF_ERROR(int_field("rows", &l.rows));
  WSUP_RETURN_IF_ERROR(int_field("first_ms", &l.first_ms));
  WSUP_RETURN_IF_ERROR(int_field("last_ms", &l.last_ms));
  if (j.contains("by_table")) {
    if (!j["by_table"].is_object()) return Corrupt(path + ": \"by_table\" is not an object" + fix);
    for (const auto& [table, n] : j["by_table"].items()) {
      if (!n.is_number_integer() || n.get<int64_t>() < 0)
        return Corrupt(path + ": by_table." + table + " is not a count" + fix);
      l.by_table[table] = n.get<int64_t>();
    }
  }
  if (j.contains("last_error")) {
    if (!j["last_error"].is_string()) return Corrupt(path + ": \"last_error\" is not text" + fix);
    l.last_error = j["last_error"].get<std::string>();
  }
  return l;
}

Result<LedgerLosses> ReadLosses(const std::string& ledger_path) {
  const std::string path = LossFilePath(ledger_path);
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) return LedgerLosses{};
  WSUP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, 4 * kLossFileBytes));
  return ParseLosses(path, text);
}

Result<LossFile> LossFile::Open(const std::string& ledger_path, const LedgerLosses& losses) {
  LossFile f;
  f.ledger_path_ = ledger_path;
  f.path_ = LossFilePath(ledger_path);
  f.fd_.Reset(::open(f.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!f.fd_.valid()) {
    return ErrnoError(f.path_ + ": cannot open the count of rows the ledger lost (check that this user may write "
                                "in node.state_dir)",
                      errno);
  }
  struct stat st{};
  if (::fstat(f.fd_.get(), &st) != 0) return ErrnoError(f.path_ + ": cannot stat", errno);
  if ((st.st_mode & 077) != 0 && ::fchmod(f.fd_.get(), st.st_mode & 0700) != 0)
    return ErrnoError(f.path_ + ": cannot make it private (chmod 0600)", errno);
  f.dev_ = st.st_dev;
  f.ino_ = st.st_ino;
  if (static_cast<size_t>(st.st_size) < kLossFileBytes) {
    // Reserved now, while there is room: a later rewrite needs none.
    int rc = ::posix_fallocate(f.fd_.get(), 0, static_cast<off_t>(kLossFileBytes));
    if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL)
      return ErrnoError(f.path_ + ": cannot reserve room for the count of rows the ledger lost", rc);
    WSUP_RETURN_IF_ERROR(WriteAllAt(f.fd_.get(), RenderLosses(losses), f.path_));
  }
  return f;
}

Status LossFile::Save(const LedgerLosses& losses) {
  struct stat st{};
  if (::stat(path_.c_str(), &st) != 0 || st.st_dev != dev_ || st.st_ino != ino_) {
    // Deleted or replaced: a count written to the old file would be gone
    // at the next start.
    WSUP_ASSIGN_OR_RETURN(LossFile again, Open(ledger_path_, losses));
    *this = std::move(again);
  }
  return WriteAllAt(fd_.get(), RenderLosses(losses), path_);
}

}  // namespace wsup
