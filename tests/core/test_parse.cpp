#include <catch2/catch.hpp>

#include "hetseq/core/error.h"
#include "hetseq/core/parse.h"

using namespace hetseq;

TEST_CASE("parse_double_list accepts HetSeq's spellings", "[parse]") {
  CHECK(parse_double_list("--adam-betas", "(0.9, 0.999)") == std::vector<double>{0.9, 0.999});
  CHECK(parse_double_list("--adam-betas", "0.9,0.999") == std::vector<double>{0.9, 0.999});
  CHECK(parse_double_list("--adam-betas", "[0.9,0.98]") == std::vector<double>{0.9, 0.98});
  CHECK(parse_double_list("--lr", "1e-3") == std::vector<double>{1e-3});
  CHECK(parse_int_list("--update-freq", "1, 3,2") == std::vector<int64_t>{1, 3, 2});
}

TEST_CASE("parse rejects anything that is not plainly a number", "[parse]") {
  for (const char* bad : {"", "abc", "0.9;0.999", "(0.9, )", "0.9,,0.999", "__import__('os')", "1e999", "nan",
                          "0.9 0.999", "(0.9, 0.999"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_double_list("--adam-betas", bad), UsageError);
  }
  CHECK_THROWS_WITH(parse_int("--seed", "12x"), Catch::Contains("--seed") && Catch::Contains("12x"));
  CHECK_THROWS_AS(parse_int("--seed", "99999999999999999999999"), UsageError);
  CHECK_THROWS_AS(parse_int_list("--update-freq", "1,2.5"), UsageError);
}
