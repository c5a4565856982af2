#include "state/sqlite.h"

#include <sqlite3.h>

#include <utility>

namespace wsup {
namespace {

Error SqliteError(sqlite3* db, const std::string& path, std::string_view what, int rc) {
  std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  int code = db ? sqlite3_extended_errcode(db) : rc;
  std::string fix;
  switch (code & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      fix = "; another process holds the database locked: is a second supervisor running on this state_dir?";
      return Error(Code::kUnavailable, path + ": " + std::string(what) + ": " + msg + fix);
    case SQLITE_CANTOPEN:
      fix = "; check that the folder exists and that this user may write in it (node.state_dir)";
      return Error(Code::kIo, path + ": " + std::string(what) + ": " + msg + fix);
    case SQLITE_READONLY:
    case SQLITE_PERM:
      fix = "; give this user write access to the file and its folder (node.state_dir)";
      return Error(Code::kIo, path + ": " + std::string(what) + ": " + msg + fix);
    case SQLITE_FULL:
      fix = "; the disk is full: free space under node.state_dir";
      return Error(Code::kIo, path + ": " + std::string(what) + ": " + msg + fix);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      fix = "; the file is not a healthy wsup ledger: move it aside (the supervisor starts a new one)";
      return Error(Code::kCorrupt, path + ": " + std::string(what) + ": " + msg + fix);
    case SQLITE_IOERR:
      fix = "; the disk under node.state_dir failed a read or write: check the kernel log";
      return Error(Code::kIo, path + ": " + std::string(what) + ": " + msg + fix);
    case SQLITE_CONSTRAINT:
      return Error(Code::kInvalidArgument, path + ": " + std::string(what) + ": " + msg +
                                               "; a value broke the schema's rules (docs/state.md lists them)");
    default:
      return Error(Code::kIo, path + ": " + std::string(what) + ": " + msg);
  }
}

}  // namespace

Db::~Db() {
  if (db_) sqlite3_close_v2(db_);
}

Db::Db(Db&& o) noexcept : db_(std::exchange(o.db_, nullptr)), path_(std::move(o.path_)) {}

Db& Db::operator=(Db&& o) noexcept {
  if (this != &o) {
    if (db_) sqlite3_close_v2(db_);
    db_ = std::exchange(o.db_, nullptr);
    path_ = std::move(o.path_);
  }
  return *this;
}

Result<Db> Db::Open(const std::string& path, bool create) {
  Db db;
  db.path_ = path;
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (create ? SQLITE_OPEN_CREATE : 0);
  int rc = sqlite3_open_v2(path.c_str(), &db.db_, flags, nullptr);
  if (rc != SQLITE_OK) {
    Error e = SqliteError(db.db_, path, "cannot open the database", rc);
    if (!create && (rc & 0xff) == SQLITE_CANTOPEN)
      e = NotFound(path + ": no ledger here; the supervisor creates it at its first start: check node.state_dir "
                          "in the config (the ledger is <state_dir>/wsup.db)");
    return e;
  }
  sqlite3_extended_result_codes(db.db_, 1);
  return db;
}

Error Db::LastError(std::string_view what) const {
  return SqliteError(db_, path_, what, db_ ? sqlite3_errcode(db_) : SQLITE_MISUSE);
}

Status Db::Exec(std::string_view sql) {
  std::string s(sql);
  char* err = nullptr;
  int rc = sqlite3_exec(db_, s.c_str(), nullptr, nullptr, &err);
  if (err) sqlite3_free(err);
  if (rc != SQLITE_OK) {
    std::string head = s.substr(0, s.find_first_of("(\n"));
    return LastError(head);
  }
  return Status::Ok();
}

Result<Stmt> Db::Prepare(std::string_view sql) {
  sqlite3_stmt* s = nullptr;
  int rc = sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &s, nullptr);
  if (rc != SQLITE_OK) return LastError("prepare " + std::string(sql.substr(0, 60)));
  return Stmt(s, db_, path_);
}

Result<int64_t> Db::QueryInt(std::string_view sql) {
  WSUP_ASSIGN_OR_RETURN(Stmt st, Prepare(sql));
  WSUP_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return Internal(path_ + ": " + std::string(sql) + ": returned no row");
  return st.Int(0);
}

Result<std::string> Db::QueryText(std::string_view sql) {
  WSUP_ASSIGN_OR_RETURN(Stmt st, Prepare(sql));
  WSUP_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return Internal(path_ + ": " + std::string(sql) + ": returned no row");
  return st.Text(0);
}

Stmt::~Stmt() {
  if (stmt_) sqlite3_finalize(stmt_);
}

Stmt::Stmt(Stmt&& o) noexcept
    : stmt_(std::exchange(o.stmt_, nullptr)),
      db_(o.db_),
      path_(std::move(o.path_)),
      bind_status_(std::move(o.bind_status_)) {}

Stmt& Stmt::operator=(Stmt&& o) noexcept {
  if (this != &o) {
    if (stmt_) sqlite3_finalize(stmt_);
    stmt_ = std::exchange(o.stmt_, nullptr);
    db_ = o.db_;
    path_ = std::move(o.path_);
    bind_status_ = std::move(o.bind_status_);
  }
  return *this;
}

Error Stmt::LastError(std::string_view what) const {
  std::string sql = stmt_ ? sqlite3_sql(stmt_) : "";
  return SqliteError(db_, path_, std::string(what) + " " + sql.substr(0, 60), sqlite3_errcode(db_));
}

Stmt& Stmt::Bind(int i, int64_t v) {
  if (sqlite3_bind_int64(stmt_, i, v) != SQLITE_OK && bind_status_.ok()) bind_status_ = LastError("bind");
  return *this;
}

Stmt& Stmt::Bind(int i, std::string_view v) {
  if (sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT) != SQLITE_OK &&
      bind_status_.ok())
    bind_status_ = LastError("bind");
  return *this;
}

Stmt& Stmt::Bind(int i, const std::optional<int64_t>& v) { return v ? Bind(i, *v) : BindNull(i); }

Stmt& Stmt::BindNull(int i) {
  if (sqlite3_bind_null(stmt_, i) != SQLITE_OK && bind_status_.ok()) bind_status_ = LastError("bind");
  return *this;
}

Result<bool> Stmt::Step() {
  if (!bind_status_.ok()) return bind_status_.error();
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  Error e = LastError("step");
  sqlite3_reset(stmt_);
  return e;
}

Status Stmt::Run() {
  WSUP_ASSIGN_OR_RETURN(bool row, Step());
  (void)row;
  return Status::Ok();
}

void Stmt::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
  bind_status_ = Status::Ok();
}

int64_t Stmt::Int(int col) const { return sqlite3_column_int64(stmt_, col); }

std::optional<int64_t> Stmt::OptInt(int col) const {
  if (IsNull(col)) return std::nullopt;
  return Int(col);
}

std::string Stmt::Text(int col) const {
  const unsigned char* t = sqlite3_column_text(stmt_, col);
  int n = sqlite3_column_bytes(stmt_, col);
  return t ? std::string(reinterpret_cast<const char*>(t), static_cast<size_t>(n)) : std::string();
}

bool Stmt::IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

}  // namespace wsup
