#include <catch2/catch.hpp>
#include <sys/stat.h>

#include "common/fs.h"
#include "tests/test_util.h"

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
