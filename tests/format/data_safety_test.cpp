// Data safety at the library level (docs/DESIGN.md, "Data safety"): limits applied at read time
// to records that pass every checksum, and the writer's lock inside one process. The commands'
// side is in tests/cli/test_data_safety.py.
#include <cstring>

#include "shardfeed/format/archive.h"
#include "shardfeed/reader/transform.h"
#include "shardfeed/validate/verify.h"
#include "test_util.h"

namespace shardfeed {
namespace {

using testing::TempDir;

// A zstd frame that declares `content` bytes and holds one empty raw block: 14 bytes that would
// make a careless reader allocate `content` bytes before finding out.
std::vector<uint8_t> FrameDeclaring(uint64_t content) {
  std::vector<uint8_t> f = {0x28, 0xB5, 0x2F, 0xFD, 0xE0};  // magic; single segment, 8-byte size
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<uint8_t>(content >> (8 * i)));
  f.insert(f.end(), {0x01, 0x00, 0x00});  // last block, raw, 0 bytes
  return f;
}

TEST_CASE("a record declaring 20000x20000 pixels is refused at read, never allocated") {
  TempDir dir;
  format::WriterOptions wo;
  wo.encoding = format::Encoding::kZstd;
  auto w = format::ArchiveWriter::Create(dir / "a", wo);
  REQUIRE(w.ok());
  format::IndexEntry e{};
  e.height = e.width = 20000;
  e.channels = 3;
  e.encoding = static_cast<uint8_t>(format::Encoding::kZstd);
  e.orientation = 1;
  auto frame = FrameDeclaring(uint64_t{20000} * 20000 * 3);
  REQUIRE((*w)->Append(e, frame.data(), frame.size()).ok());
  format::Manifest m;
  m.encoding = format::Encoding::kZstd;
  m.class_names = {"x"};
  REQUIRE((*w)->Finish(m).ok());
  auto archive = format::Archive::Open(dir / "a");
  REQUIRE(archive.ok());  // checksums are all valid: only the declared size is hostile
  CHECK((*archive)->VerifyRecord(0).ok());

  reader::TransformOptions t;
  t.size = 32;
  reader::SampleDecoder decoder(*archive, t);
  std::vector<uint8_t> out(decoder.sample_bytes());
  reader::StageTimes times;
  Status s = decoder.DecodeInto(0, 0, out.data(), &times);
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK(s.message().find("sample 0") != std::string::npos);
  CHECK(s.message().find("max_pixels") != std::string::npos);

  validate::VerifyOptions vo;
  vo.decode = true;
  auto report = validate::Verify(**archive, vo);
  REQUIRE(report.bad_samples.size() == 1);
  CHECK(report.bad_samples[0].reason.find("above the limit") != std::string::npos);
}

TEST_CASE("a record without pixels is refused by the writer") {
  TempDir dir;
  auto w = format::ArchiveWriter::Create(dir / "a", {});
  REQUIRE(w.ok());
  format::IndexEntry e{};
  e.channels = 3;
  e.encoding = static_cast<uint8_t>(format::Encoding::kRaw);
  e.orientation = 1;
  CHECK((*w)->Append(e, nullptr, 0).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a second writer of the same path fails and leaves the first one's work alone") {
  TempDir dir;
  auto first = format::ArchiveWriter::Create(dir / "a", {});
  REQUIRE(first.ok());
  format::IndexEntry e{};
  e.height = e.width = 1;
  e.channels = 3;
  e.encoding = static_cast<uint8_t>(format::Encoding::kJpeg);
  e.orientation = 1;
  const uint8_t payload[4] = {1, 2, 3, 4};
  REQUIRE((*first)->Append(e, payload, sizeof(payload)).ok());
  {
    auto second = format::ArchiveWriter::Create(dir / "a", {});
    REQUIRE(!second.ok());
    CHECK(second.status().message().find("locked") != std::string::npos);
  }  // (before: its destructor removed a.partial and a.lock)
  format::Manifest m;
  m.class_names = {"x"};
  REQUIRE((*first)->Finish(m).ok());
  auto archive = format::Archive::Open(dir / "a");
  REQUIRE(archive.ok());
  CHECK((*archive)->size() == 1);
}

}  // namespace
}  // namespace shardfeed
