// The one option mechanism (base/option_table.h): strict text forms, stated ranges, and the
// closest name for an unknown one, as the CLI, Python and C++ all see them.
#include "shardfeed/base/option_table.h"

#include "shardfeed/converter/options.h"
#include "shardfeed/reader/options.h"
#include "test_util.h"

namespace shardfeed {
namespace {

TEST_CASE("numbers are read strictly: no space, sign, hex, inf or nan") {
  double d = 0;
  CHECK(ParseNumberText("0.5", &d));
  CHECK(d == 0.5);
  CHECK(ParseNumberText("-2", &d));
  CHECK(ParseNumberText(".5", &d));
  CHECK(ParseNumberText("1e3", &d));
  for (const char* bad : {" 5", "5 ", "+5", "0x10", "nan", "inf", "1e400", "", "-", "1.5.5"}) {
    CHECK_FALSE(ParseNumberText(bad, &d));
  }
  uint64_t v = 0;
  CHECK(ParseCountText("18446744073709551615", &v));
  CHECK(v == UINT64_MAX);
  for (const char* bad : {" 5", "-1", "+1", "18446744073709551616", "99999999999999999999", "",
                          "1.0", "000000000000000000001"}) {
    CHECK_FALSE(ParseCountText(bad, &v));
  }
  CHECK(ParseByteSize("1M", &v));
  CHECK(v == 1024 * 1024);
  for (const char* bad : {" 1M", "-1", "0x10", "nan", "1e30T", "M"})
    CHECK_FALSE(ParseByteSize(bad, &v));
}

TEST_CASE("a count refused names the option, its flag and its range") {
  uint64_t v = 0;
  CHECK(ParseCountOption("rank", "-1", 0, 7, &v).message() ==
        "rank (--rank) must be a whole number in 0..7, not '-1'");
  CHECK(ParseCountOption("seed", "x", 0, UINT64_MAX, &v).message() ==
        "seed (--seed) must be a whole number >= 0, not 'x'");
  double d = 0;
  CHECK(ParseNumberOption("wait_target", "1", {0, 1, true, true}, &d).message() ==
        "wait_target (--wait-target) must be a number in (0, 1), not '1'");
}

TEST_CASE("the closest name is suggested for a typo, never a far one") {
  const std::vector<std::string> names = {"batch_size", "workers", "max_workers", "prefetch",
                                          "chunk_size", "seed",    "size"};
  CHECK(ClosestName("batch_sise", names) == "batch_size");
  CHECK(ClosestName("batch-size", names) == "batch_size");
  CHECK(ClosestName("Batch_Size", names) == "batch_size");
  CHECK(ClosestName("num_workers", names) == "workers");
  CHECK(ClosestName("prefetch_factor", names) == "prefetch");
  CHECK(ClosestName("chunk_bytes", names) == "chunk_size");
  CHECK(ClosestName("worker", names) == "workers");
  CHECK(ClosestName("colour", names).empty());
  CHECK(ClosestName("", names).empty());
}

TEST_CASE("loader and pack tables are one mechanism: Set, Find and Unknown alike") {
  reader::LoaderOptions lo;
  CHECK(reader::SetLoaderOption(&lo, "batch_sise", "8").message() ==
        "unexpected loader option 'batch_sise'; did you mean 'batch_size'?");
  CHECK(reader::SetLoaderOption(&lo, "max_workers", "100000").message() ==
        "max_workers (--max-workers) must be a whole number in 0..4096, not '100000'");
  CHECK(reader::SetLoaderOption(&lo, "rank", "-1").message() ==
        "rank (--rank) must be a whole number in 0..4294967295, not '-1'");
  REQUIRE(reader::SetLoaderOption(&lo, "batch-size", "8").ok());
  CHECK(lo.batch_size == 8);
  lo.max_workers = 100000;  // a C++ caller setting the field directly
  CHECK(!reader::ValidateLoaderOptions(lo).ok());

  converter::PackOptions po;
  CHECK(converter::SetPackOption(&po, "chunk_bytes", "1M").message() ==
        "unexpected pack option 'chunk_bytes'; did you mean 'chunk_size'?");
  for (const char* part : {"0/4294967297", "0/-2", " 0/2", "0/2 ", "1/1", "0/0", "0/100000"}) {
    INFO(part);
    CHECK(converter::SetPackOption(&po, "part", part).message() ==
          std::string("part (--part) must be I/N with 0 <= I < N <= 99999, not '") + part + "'");
  }
  REQUIRE(converter::SetPackOption(&po, "part", "3/99999").ok());
  CHECK((po.part == 3 && po.parts == 99999));
  CHECK(converter::FindPackOption("chunk-size")->kind == OptionKind::kBytes);
  CHECK(std::string(OptionKindName(reader::FindLoaderOption("flip")->kind)) == "bool");
}

}  // namespace
}  // namespace shardfeed
