// IndexCheck::kLazy (archive.h): Open reads the manifest only; a shard is opened on first use and
// each index entry is checked as it is read, so a rank of a large job pays for what it touches.
// Damage stays an error at the access that meets it, never a fault; full checks remain verify's.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <thread>

#include "shardfeed/format/archive.h"
#include "shardfeed/reader/loader.h"
#include "test_util.h"

namespace shardfeed::format {
namespace {

using testing::TempDir;

// 3 shards x 3000 JPEG-encoded records of arbitrary bytes (Open does not decode them); record i
// is 16 bytes of i, label i % 3.
std::string WriteShards(const TempDir& dir, Backend backend) {
  WriterOptions wo;
  wo.backend = backend;
  wo.chunk_bytes = 4096;
  auto w = ArchiveWriter::Create(dir / "a", wo);
  REQUIRE(w.ok());
  for (uint64_t i = 0; i < 9000; ++i) {
    if (i % 3000 == 0 && i) REQUIRE((*w)->NextShard().ok());
    IndexEntry e{};
    e.label = static_cast<int32_t>(i % 3);
    e.height = e.width = 4;
    e.channels = 3;
    e.encoding = static_cast<uint8_t>(Encoding::kJpeg);
    e.orientation = 1;
    std::vector<uint8_t> payload(16);
    for (size_t b = 0; b < 16; ++b) payload[b] = static_cast<uint8_t>(i >> (b % 8 * 8));
    REQUIRE((*w)->Append(e, payload.data(), payload.size()).ok());
  }
  Manifest m;
  m.class_names = {"a", "b", "c"};
  REQUIRE((*w)->Finish(m).ok());
  return dir / "a";
}

TEST_CASE("a lazy archive opens shards on first use, and reads like a fully checked one") {
  for (Backend backend : {Backend::kLmdb, Backend::kHdf5}) {
    INFO(BackendName(backend));
    TempDir dir;
    const std::string path = WriteShards(dir, backend);
    auto full = Archive::Open(path, IndexCheck::kFull);
    auto lazy = Archive::Open(path, IndexCheck::kLazy);
    REQUIRE(full.ok());
    REQUIRE(lazy.ok());
    CHECK((*full)->OpenedShards() == 3);
    CHECK((*lazy)->OpenedShards() == 0);
    CHECK((*lazy)->lazy());
    auto r = (*lazy)->At(4500);
    REQUIRE(r.ok());
    CHECK((*lazy)->OpenedShards() == 1);
    for (uint64_t i = 0; i < 9000; i += 7) {
      auto a = (*full)->At(i), b = (*lazy)->At(i);
      REQUIRE(a.ok());
      REQUIRE(b.ok());
      REQUIRE(a->size == b->size);
      REQUIRE(std::equal(a->data, a->data + a->size, b->data));
      REQUIRE((*lazy)->Label(i) == static_cast<int32_t>(i % 3));
    }
    CHECK((*lazy)->OpenedShards() == 3);
    // The automatic choice: full for an archive this small.
    auto automatic = Archive::Open(path);
    REQUIRE(automatic.ok());
    CHECK(!(*automatic)->lazy());
  }
}

// Rewrites every copy of sample `index`'s index entry (found by its checksum) so its chunk
// number points past the shard's chunks.
void DamageEntry(const std::string& archive, uint64_t index, const std::string& shard_file) {
  auto a = Archive::Open(archive, IndexCheck::kFull);
  REQUIRE(a.ok());
  const uint64_t checksum = (*a)->At(index).ValueOrDie().entry->checksum;
  a->reset();
  auto bytes = testing::ReadBytes(archive + "/" + shard_file);
  size_t found = 0;
  for (size_t at = 0; at + 32 <= bytes.size(); ++at) {
    if (std::memcmp(bytes.data() + at, &checksum, 8) == 0) {
      bytes[at + 8] = 0xFF;
      bytes[at + 9] = 0xFF;
      ++found;
    }
  }
  REQUIRE(found > 0);
  testing::WriteBytes(archive + "/" + shard_file, bytes);
}

TEST_CASE("damage in a lazy archive is an error at the access that meets it") {
  for (Backend backend : {Backend::kLmdb, Backend::kHdf5}) {
    INFO(BackendName(backend));
    TempDir dir;
    const std::string path = WriteShards(dir, backend);
    const std::string ext = backend == Backend::kLmdb ? ".mdb" : ".h5";
    DamageEntry(path, 6123, "shard-00002" + ext);
    CHECK(!Archive::Open(path, IndexCheck::kFull).ok());  // the index checksum
    auto lazy = Archive::Open(path, IndexCheck::kLazy);
    REQUIRE(lazy.ok());
    CHECK((*lazy)->At(10).ok());    // other shards
    CHECK((*lazy)->At(6000).ok());  // other entries of the same shard
    for (int again = 0; again < 2; ++again) {
      auto bad = (*lazy)->At(6123);
      REQUIRE(!bad.ok());
      CHECK(bad.status().code() == StatusCode::kCorrupt);
      CHECK(bad.status().message().find("sample 6123") != std::string::npos);
      CHECK(bad.status().message().find("shard-00002") != std::string::npos);
    }
    CHECK((*lazy)->Label(6123) == -1);
    CHECK((*lazy)->VerifyRecord(6123).code() == StatusCode::kCorrupt);
    // A shard that cannot be opened at all: its samples fail, the others read.
    testing::WriteBytes(path + "/shard-00001" + ext, {1, 2, 3});
    auto again = Archive::Open(path, IndexCheck::kLazy);
    REQUIRE(again.ok());
    CHECK((*again)->At(0).ok());
    auto gone = (*again)->At(3500);
    REQUIRE(!gone.ok());
    CHECK(gone.status().message().find("shard-00001") != std::string::npos);
    CHECK(!(*again)->At(3600).ok());  // the verdict is kept, not retried
  }
}

TEST_CASE("threads meeting unopened shards at once agree") {
  TempDir dir;
  const std::string path = WriteShards(dir, Backend::kLmdb);
  for (int round = 0; round < 5; ++round) {
    auto lazy = Archive::Open(path, IndexCheck::kLazy);
    REQUIRE(lazy.ok());
    std::vector<std::thread> threads;
    std::vector<int> wrong(4);
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (uint64_t i = t; i < 9000; i += 13) {
          auto r = (*lazy)->At(i);
          if (!r.ok() || r->entry->label != static_cast<int32_t>(i % 3)) ++wrong[t];
        }
      });
    }
    for (auto& t : threads) t.join();
    CHECK(wrong == std::vector<int>(4, 0));
    CHECK((*lazy)->OpenedShards() == 3);
  }
}

}  // namespace
}  // namespace shardfeed::format
