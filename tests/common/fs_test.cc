#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

TEST_CASE("WriteFileAtomic replaces the whole file and leaves no temporary") {
  test::TempDir dir;
  std::string p = dir.Join("f.txt");
  REQUIRE(WriteFileAtomic(p, "one").ok());
  REQUIRE(WriteFileAtomic(p, "two two").ok());
  auto r = ReadFile(p);
  REQUIRE(r.ok());
  CHECK(*r == "two two");
  struct stat st{};
  CHECK(::stat((p + ".tmp." + std::to_string(::getpid())).c_str(), &st) != 0);
}

TEST_CASE("ReadFile names the file it cannot read and refuses oversized ones") {
  test::TempDir dir;
  auto missing = ReadFile(dir.Join("nope"));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message().find("nope") != std::string::npos);
  REQUIRE(WriteFileAtomic(dir.Join("big"), std::string(100, 'x')).ok());
  auto big = ReadFile(dir.Join("big"), 10);
  REQUIRE_FALSE(big.ok());
  CHECK(big.error().message().find("100 bytes") != std::string::npos);
}

TEST_CASE("MakePrivateDir makes a folder 0700, tightens one of this user, refuses another user's") {
  test::TempDir dir;
  struct stat st{};
  std::string made = dir.Join("new/state");
  auto r = MakePrivateDir(made, "node.state_dir");
  REQUIRE(r.ok());
  REQUIRE(::stat(made.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);

  std::string open = dir.Join("open");
  REQUIRE(::mkdir(open.c_str(), 0755) == 0);
  REQUIRE(::chmod(open.c_str(), 0755) == 0);  // whatever the umask
  auto tightened = MakePrivateDir(open, "node.state_dir");
  REQUIRE(tightened.ok());
  CHECK(*tightened);
  REQUIRE(::stat(open.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  auto again = MakePrivateDir(open, "node.state_dir");
  REQUIRE(again.ok());
  CHECK_FALSE(*again);

  if (::geteuid() != 0) {
    WARN("SKIP: needs root to give a folder to another uid");
    return;
  }
  std::string theirs = dir.Join("theirs");
  REQUIRE(::mkdir(theirs.c_str(), 0755) == 0);
  REQUIRE(::chmod(theirs.c_str(), 0755) == 0);
  REQUIRE(::chown(theirs.c_str(), 65534, 65534) == 0);
  auto refused = MakePrivateDir(theirs, "node.state_dir");
  REQUIRE_FALSE(refused.ok());
  INFO(refused.error().message());
  CHECK(refused.error().message().find("node.state_dir " + theirs) == 0);
  CHECK(refused.error().message().find("0755") != std::string::npos);
  CHECK(refused.error().message().find("uid 65534") != std::string::npos);
  CHECK(refused.error().message().find("chmod 0700") != std::string::npos);
  REQUIRE(::stat(theirs.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0755);  // not ours: left as it is
}

TEST_CASE("MakeDirs creates parents and refuses a file in the way") {
  test::TempDir dir;
  CHECK(MakeDirs(dir.Join("a/b/c")).ok());
  CHECK(MakeDirs(dir.Join("a/b/c")).ok());
  REQUIRE(WriteFileAtomic(dir.Join("file"), "x").ok());
  CHECK_FALSE(MakeDirs(dir.Join("file")).ok());
}

TEST_CASE("Path helpers") {
  CHECK(DirName("a/b/c") == "a/b");
  CHECK(BaseName("a/b/c") == "c");
  CHECK(JoinPath("a", "b") == "a/b");
  CHECK(JoinPath("a/", "/abs") == "/abs");
}

}  // namespace
}  // namespace wsup
