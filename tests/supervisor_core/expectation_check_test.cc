// The evidence that stops a node whose probe expects an answer the model
// does not produce (supervisor/expectation_check.h), and the evidence that
// does not: a damaged checkpoint answers wrongly too.
#include "supervisor/expectation_check.h"

#include <catch2/catch.hpp>

#include "tests/supervisor_core/node_toml.h"

namespace wsup {
namespace {

Config IdsConfig() {
  auto c = ParseConfig(test::NodeToml("prompt = \"Hello, world\"\nexpect_token_ids = [1, 2, 3, 4]\nmax_tokens = 4\n"),
                       "/etc/wsup/node.toml");
  REQUIRE(c.ok());
  return *c;
}

ProbeAnswer Answer(std::vector<int64_t> ids, std::string finish = "length") {
  return ProbeAnswer{std::move(ids), "text", std::move(finish)};
}

TEST_CASE("expectation: both engines' same complete, varied answer shows the model does not produce it",
          "[logic]") {
  Config c = IdsConfig();
  auto a = Answer({92, 16, 97, 246});
  auto unmet = UnmetExpectation(c, a, a);
  REQUIRE(unmet);
  INFO(*unmet);
  // Located at the key, with what the model answers and what is expected.
  CHECK(unmet->rfind("/etc/wsup/node.toml:13:20: probe.expect_token_ids: both engines answer", 0) == 0);
  CHECK(unmet->find("[92, 16, 97, 246]") != std::string::npos);
  CHECK(unmet->find("where probe.expect_token_ids is [1, 2, 3, 4]") != std::string::npos);
  CHECK(unmet->find("the checkpoint is damaged") != std::string::npos);
  // An answer the model ended itself is complete too.
  CHECK(UnmetExpectation(c, Answer({7, 8}, "stop"), Answer({7, 8}, "stop")));
}

TEST_CASE("expectation: anything that may be an engine's fault is no evidence", "[logic]") {
  Config c = IdsConfig();
  auto a = Answer({92, 16, 97, 246});
  // The two engines disagree: one of them is broken.
  CHECK_FALSE(UnmetExpectation(c, a, Answer({92, 16, 97, 245})));
  // One token repeated: what NaN weights give (a damaged checkpoint).
  CHECK_FALSE(UnmetExpectation(c, Answer({0, 0, 0, 0}), Answer({0, 0, 0, 0})));
  // Cut short, or with no token ids: not a whole answer.
  CHECK_FALSE(UnmetExpectation(c, Answer({92, 16, 97}), Answer({92, 16, 97})));
  CHECK_FALSE(UnmetExpectation(c, Answer({92, 16, 97, 246}, ""), Answer({92, 16, 97, 246}, "")));
  CHECK_FALSE(UnmetExpectation(c, Answer({}, "stop"), Answer({}, "stop")));
  // The expected answer itself is no wrong answer.
  CHECK_FALSE(UnmetExpectation(c, Answer({1, 2, 3, 4}), Answer({1, 2, 3, 4})));
}

TEST_CASE("expectation: a text expectation is judged the same way, and quoted", "[logic]") {
  auto c = ParseConfig(test::NodeToml("prompt = \"The capital of France is\"\nexpect = \" Lyon\"\nmax_tokens = 2\n"),
                       "n.toml");
  REQUIRE(c.ok());
  ProbeAnswer paris{{6342, 13}, " Paris.", "length"};
  auto unmet = UnmetExpectation(*c, paris, paris);
  REQUIRE(unmet);
  CHECK(unmet->find("probe.expect: both engines answer the probe's prompt with \" Paris.\"") != std::string::npos);
  CHECK(unmet->find("where probe.expect is \" Lyon\"") != std::string::npos);
  ProbeAnswer lyon{{6342, 13}, " Lyon", "length"};
  CHECK_FALSE(UnmetExpectation(*c, lyon, lyon));
}

}  // namespace
}  // namespace wsup
