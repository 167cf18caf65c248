#include "shardfeed/format/archive.h"

#include <filesystem>
#include <fstream>
#include <random>

#include "test_util.h"

namespace shardfeed::format {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

// Deterministic payload of sample i: its size varies from tiny to several chunks' worth.
std::vector<uint8_t> Payload(uint64_t i) {
  std::mt19937 rng(static_cast<uint32_t>(i * 7919 + 1));
  size_t size = 1 + (rng() % 3000) + (i % 17 == 0 ? 70000 : 0);
  std::vector<uint8_t> p(size);
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  return p;
}

IndexEntry EntryFor(uint64_t i) {
  IndexEntry e{};
  e.label = static_cast<int32_t>(i % 3);
  e.height = static_cast<uint16_t>(10 + i % 5);
  e.width = static_cast<uint16_t>(20 + i % 7);
  e.channels = 3;
  // Payloads are arbitrary bytes: stored as JPEG records, which Open does not decode (a raw
  // record's size must equal height x width x 3).
  e.encoding = static_cast<uint8_t>(Encoding::kJpeg);
  e.orientation = 1;
  return e;
}

void WriteArchive(const std::string& path, uint64_t n, WriterOptions opt = {}) {
  auto w = ArchiveWriter::Create(path, opt);
  REQUIRE(w.ok());
  for (uint64_t i = 0; i < n; ++i) {
    auto p = Payload(i);
    REQUIRE((*w)->Append(EntryFor(i), p.data(), p.size()).ok());
  }
  Manifest m;
  m.encoding = Encoding::kJpeg;
  m.class_names = {"a", "b", "c"};
  REQUIRE((*w)->Finish(m).ok());
}

// Finds the first occurrence of `needle` in a file; returns its offset.
size_t FindInFile(const std::string& file, const std::vector<uint8_t>& needle) {
  auto bytes = testing::ReadBytes(file);
  auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  REQUIRE(it != bytes.end());
  return static_cast<size_t>(it - bytes.begin());
}

void FlipByte(const std::string& file, size_t offset) {
  auto bytes = testing::ReadBytes(file);
  bytes[offset] ^= 0x5A;
  testing::WriteBytes(file, bytes);
}

TEST_CASE("records round-trip through chunks and shards with O(1) access") {
  TempDir dir;
  const uint64_t n = 500;
  WriterOptions opt;
  opt.chunk_bytes = 16 << 10;
  opt.shard_bytes = 200 << 10;
  WriteArchive(dir / "a", n, opt);
  auto archive = Archive::Open(dir / "a");
  REQUIRE(archive.ok());
  const Archive& a = **archive;
  REQUIRE(a.size() == n);
  CHECK(a.manifest().shards.size() > 2);  // shard_bytes split the archive
  CHECK(a.manifest().class_names == std::vector<std::string>{"a", "b", "c"});
  CHECK(a.manifest().class_counts == std::vector<uint64_t>{167, 167, 166});
  // Random order: every record is reachable directly.
  std::vector<uint64_t> order(n);
  for (uint64_t i = 0; i < n; ++i) order[i] = (i * 263) % n;
  for (uint64_t i : order) {
    RecordView r = a.At(i).ValueOrDie();
    auto want = Payload(i);
    REQUIRE(r.size == want.size());
    REQUIRE(std::equal(want.begin(), want.end(), r.data));
    REQUIRE(r.entry->label == EntryFor(i).label);
    REQUIRE(r.entry->height == EntryFor(i).height);
    REQUIRE(a.VerifyRecord(i).ok());
  }
  for (size_t s = 0; s < a.manifest().shards.size(); ++s) CHECK(a.VerifyShard(s).ok());
  CHECK(!a.At(n).ok());
}

TEST_CASE("views stay valid while the archive is referenced, and only that long") {
  // Before, this test held the archive in `keep` and checked the view: true whatever the code
  // did. Now it checks what the contract says: any one reference keeps the mapping (the view
  // reads sample 7's bytes, not another sample's), and the last one closes it (nothing hidden,
  // such as a cache of open archives, keeps it mapped).
  TempDir dir;
  WriteArchive(dir / "a", 20);
  RecordView r;
  std::vector<uint8_t> want = Payload(7), other = Payload(8);
  std::weak_ptr<Archive> watch;
  {
    auto archive = Archive::Open(dir / "a");
    REQUIRE(archive.ok());
    std::shared_ptr<Archive> keep = *archive;
    watch = keep;
    r = keep->At(7).ValueOrDie();
    archive = Status::Cancelled("drop the Result's reference");
    REQUIRE(watch.use_count() == 1);  // `keep` alone holds it now
    REQUIRE(r.size == want.size());
    REQUIRE(std::equal(want.begin(), want.end(), r.data));
    REQUIRE(!(other.size() == r.size && std::equal(other.begin(), other.end(), r.data)));
  }
  CHECK(watch.expired());
}

TEST_CASE("a flipped payload byte is caught and names the sample") {
  TempDir dir;
  WriteArchive(dir / "a", 60);
  std::string shard = dir / "a/shard-00000.mdb";
  auto p = Payload(41);
  FlipByte(shard, FindInFile(shard, p) + p.size() / 2);
  auto archive = Archive::Open(dir / "a");
  REQUIRE(archive.ok());  // the index is intact; only payload checks can see this
  Status s = (*archive)->VerifyRecord(41);
  CHECK(s.code() == StatusCode::kChecksumMismatch);
  CHECK(s.message().find("sample 41") != std::string::npos);
  CHECK((*archive)->VerifyRecord(40).ok());
  CHECK((*archive)->VerifyShard(0).code() == StatusCode::kChecksumMismatch);
}

TEST_CASE("a damaged index or manifest is refused at open with a reason") {
  TempDir dir;
  WriteArchive(dir / "a", 200);
  SECTION("index byte flipped") {
    auto archive = Archive::Open(dir / "a");
    REQUIRE(archive.ok());
    // Locate the index through its first entry's bytes.
    const IndexEntry& e0 = *(*archive)->At(0).ValueOrDie().entry;
    std::vector<uint8_t> first(reinterpret_cast<const uint8_t*>(&e0),
                               reinterpret_cast<const uint8_t*>(&e0) + sizeof(IndexEntry));
    archive = Status::Cancelled("close");
    std::string shard = dir / "a/shard-00000.mdb";
    FlipByte(shard, FindInFile(shard, first) + 3);
    auto reopened = Archive::Open(dir / "a");
    REQUIRE(!reopened.ok());
    CHECK(reopened.status().code() == StatusCode::kChecksumMismatch);
    CHECK(reopened.status().message().find("index") != std::string::npos);
  }
  SECTION("manifest missing") {
    fs::remove(dir / "a/manifest.json");
    auto reopened = Archive::Open(dir / "a");
    REQUIRE(!reopened.ok());
    CHECK(reopened.status().message().find("manifest.json") != std::string::npos);
  }
  SECTION("manifest not JSON") {
    std::ofstream(dir / "a/manifest.json") << "{ not json";
    CHECK(Archive::Open(dir / "a").status().code() == StatusCode::kCorrupt);
  }
  SECTION("shard truncated") {
    fs::resize_file(dir / "a/shard-00000.mdb", 8192);
    CHECK(!Archive::Open(dir / "a").ok());
  }
  SECTION("shard replaced by garbage") {
    testing::WriteBytes(dir / "a/shard-00000.mdb", std::vector<uint8_t>(100000, 0xAB));
    CHECK(!Archive::Open(dir / "a").ok());
  }
}

TEST_CASE("an unfinished writer leaves nothing that looks like an archive") {
  TempDir dir;
  {
    auto w = ArchiveWriter::Create(dir / "a", {});
    REQUIRE(w.ok());
    auto p = Payload(1);
    REQUIRE((*w)->Append(EntryFor(1), p.data(), p.size()).ok());
    CHECK(fs::exists(dir / "a.partial"));
    CHECK(!fs::exists(dir / "a"));
  }
  CHECK(!fs::exists(dir / "a"));
  CHECK(!fs::exists(dir / "a.partial"));
  CHECK(Archive::Open(dir / "a").status().code() == StatusCode::kNotFound);
}

TEST_CASE("an existing archive is only replaced on request, and atomically") {
  TempDir dir;
  WriteArchive(dir / "a", 10);
  CHECK(ArchiveWriter::Create(dir / "a", {}).status().code() == StatusCode::kInvalidArgument);
  WriterOptions opt;
  opt.overwrite = true;
  WriteArchive(dir / "a", 30, opt);
  auto archive = Archive::Open(dir / "a");
  REQUIRE(archive.ok());
  CHECK((*archive)->size() == 30);
  CHECK(!fs::exists(dir / "a.old"));
}

TEST_CASE("the manifest round-trips through JSON and rejects other versions") {
  Manifest m;
  m.encoding = Encoding::kZstd;
  m.sample_count = 5;
  m.class_names = {"x", "y"};
  m.class_counts = {2, 3};
  m.height = m.width = 32;
  m.channels = 3;
  m.options_json = R"({"size":32})";
  ShardInfo s;
  s.file = "shard-00000.mdb";
  s.sample_count = 5;
  s.chunk_count = 1;
  s.content_hash = 0x0123456789abcdefull;
  m.shards.push_back(s);
  auto back = Manifest::FromJson(m.ToJson(), "test");
  REQUIRE(back.ok());
  CHECK(back->encoding == Encoding::kZstd);
  CHECK(back->class_counts == m.class_counts);
  CHECK(back->height == 32);
  CHECK(back->shards[0].content_hash == s.content_hash);
  const std::string next = "\"format_version\": " + std::to_string(kFormatVersion + 1);
  std::string newer = m.ToJson();
  newer.replace(newer.find("\"format_version\": " + std::to_string(kFormatVersion)), next.size(),
                next);
  auto refused = Manifest::FromJson(newer, "test");
  CHECK(refused.status().code() == StatusCode::kUnsupported);
  CHECK(refused.status().message().find("version " + std::to_string(kFormatVersion + 1)) !=
        std::string::npos);
  CHECK(refused.status().message().find("versions 1 to " + std::to_string(kFormatVersion)) !=
        std::string::npos);
}

}  // namespace
}  // namespace shardfeed::format
