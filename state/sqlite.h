// Db and Stmt: thin owners of a SQLite connection and a prepared statement,
// turning SQLite's result codes into wsup Errors that name the database file
// and the statement.
//
// Ownership: a Db owns its sqlite3 handle and closes it on destruction; a
// Stmt owns its sqlite3_stmt and must be destroyed before the Db it came
// from (moving the Db is fine).
// Thread-safety: one Db (and its Stmts) per thread; SQLite is built
// thread-safe, but a connection is never shared across threads here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace wsup {

class Stmt;

class Db {
 public:
  Db() = default;
  ~Db();
  Db(Db&& o) noexcept;
  Db& operator=(Db&& o) noexcept;
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  // Opens (create: and creates) the file. Errors name the path and the fix.
  static Result<Db> Open(const std::string& path, bool create);

  // Runs one or more statements that return no rows.
  Status Exec(std::string_view sql);
  Result<Stmt> Prepare(std::string_view sql);
  // The first column of the first row of a query that returns one integer.
  Result<int64_t> QueryInt(std::string_view sql);
  Result<std::string> QueryText(std::string_view sql);

  sqlite3* get() const { return db_; }
  const std::string& path() const { return path_; }
  // "PATH: what SQLite said" for the current error on this connection.
  Error LastError(std::string_view what) const;

 private:
  sqlite3* db_ = nullptr;
  std::string path_;
};

class Stmt {
 public:
  Stmt() = default;
  ~Stmt();
  Stmt(Stmt&& o) noexcept;
  Stmt& operator=(Stmt&& o) noexcept;
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  // Parameters are 1-based, as in SQLite.
  Stmt& Bind(int i, int64_t v);
  Stmt& Bind(int i, std::string_view v);
  Stmt& Bind(int i, const std::optional<int64_t>& v);
  Stmt& BindNull(int i);

  // Advances: true with a row, false when done.
  Result<bool> Step();
  // Step() that expects no row (INSERT, UPDATE).
  Status Run();
  void Reset();

  // Columns are 0-based, as in SQLite.
  int64_t Int(int col) const;
  std::optional<int64_t> OptInt(int col) const;
  std::string Text(int col) const;
  bool IsNull(int col) const;

 private:
  friend class Db;
  Stmt(sqlite3_stmt* s, sqlite3* db, std::string path) : stmt_(s), db_(db), path_(std::move(path)) {}
  Error LastError(std::string_view what) const;
  sqlite3_stmt* stmt_ = nullptr;
  sqlite3* db_ = nullptr;  // not owned
  std::string path_;
  Status bind_status_;  // the first failed Bind, reported by Step()
};

}  // namespace wsup
