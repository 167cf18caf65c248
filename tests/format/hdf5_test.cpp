#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "shardfeed/converter/convert.h"
#include "shardfeed/converter/pack.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/reader/loader.h"
#include "shardfeed/validate/verify.h"
#include "test_util.h"

namespace shardfeed::format {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

std::shared_ptr<Archive> PackAs(const std::string& out, Backend backend, Encoding enc,
                                uint32_t size = 0, bool crop = false, uint64_t shard_bytes = 0) {
  auto src = converter::ScanImageFolder(testing::SampleDir());
  REQUIRE(src.ok());
  converter::PackOptions o;
  o.encoding = enc;
  o.size = size;
  o.center_crop = crop;
  o.writer.backend = backend;
  o.writer.shard_bytes = shard_bytes;
  converter::PackResult r;
  Status s = converter::Pack(*src, out, o, &r);
  INFO(s.ToString());
  REQUIRE(s.ok());
  auto a = Archive::Open(out);
  INFO(a.status().ToString());
  REQUIRE(a.ok());
  return *a;
}

std::vector<uint8_t> Epoch(std::shared_ptr<Archive> a,
                           reader::WorkerMode mode = reader::WorkerMode::kThreads) {
  reader::LoaderOptions o;
  o.batch_size = 7;
  o.shuffle = true;
  o.seed = 4;
  o.workers = 2;
  o.mode = mode;
  o.transform.crop = reader::Crop::kRandom;
  o.transform.flip = true;
  o.transform.size = 40;
  auto loader = reader::Loader::Create(a, o);
  REQUIRE(loader.ok());
  std::vector<uint8_t> all;
  for (;;) {
    auto b = (*loader)->Next();
    REQUIRE(b.ok());
    if (!*b) break;
    all.insert(all.end(), b->images(), b->images() + b->image_bytes());
    const auto* l = reinterpret_cast<const uint8_t*>(b->labels());
    all.insert(all.end(), l, l + b->size() * sizeof(int64_t));
  }
  return all;
}

TEST_CASE("LMDB and HDF5 archives of one folder give the same samples through the reader") {
  TempDir dir;
  struct Case {
    Encoding enc;
    uint32_t size;
    bool crop;
  };
  for (Case c : {Case{Encoding::kJpeg, 0, false}, Case{Encoding::kZstd, 48, true},
                 Case{Encoding::kRaw, 48, true}, Case{Encoding::kZstd, 48, false}}) {
    std::string tag = std::string(EncodingName(c.enc)) + (c.crop ? "c" : "");
    auto lmdb = PackAs(dir / ("l" + tag), Backend::kLmdb, c.enc, c.size, c.crop);
    auto hdf5 = PackAs(dir / ("h" + tag), Backend::kHdf5, c.enc, c.size, c.crop, 300000);
    CHECK(hdf5->manifest().backend == Backend::kHdf5);
    // file_bytes is the shard as written, manifest attribute included (a remote read fetches
    // exactly that many bytes; it was the size before the attribute).
    for (const ShardInfo& info : hdf5->manifest().shards) {
      CHECK(std::filesystem::file_size(std::filesystem::path(dir / ("h" + tag)) / info.file) ==
            info.file_bytes);
    }
    REQUIRE(lmdb->size() == hdf5->size());
    for (uint64_t i = 0; i < lmdb->size(); ++i) {
      auto a = lmdb->At(i).ValueOrDie(), b = hdf5->At(i).ValueOrDie();
      REQUIRE(a.size == b.size);
      REQUIRE(std::equal(a.data, a.data + a.size, b.data));
      REQUIRE(a.entry->label == b.entry->label);
      REQUIRE(hdf5->VerifyRecord(i).ok());
    }
    CHECK(Epoch(lmdb) == Epoch(hdf5));
    validate::VerifyOptions vo;
    vo.decode = true;
    CHECK(validate::Verify(*hdf5, vo).ok());
  }
}

TEST_CASE("convert round-trips between backends without changing a record") {
  TempDir dir;
  auto original = PackAs(dir / "a", Backend::kLmdb, Encoding::kJpeg, 0, false, 100000);
  REQUIRE(original->manifest().shards.size() > 1);
  auto h = converter::Convert(*original, dir / "h", Backend::kHdf5);
  REQUIRE(h.ok());
  auto back = converter::Convert(**Archive::Open(dir / "h"), dir / "l", Backend::kLmdb);
  REQUIRE(back.ok());
  auto hdf5 = *Archive::Open(dir / "h");
  auto lmdb = *Archive::Open(dir / "l");
  REQUIRE(hdf5->manifest().shards.size() == original->manifest().shards.size());
  for (size_t s = 0; s < original->manifest().shards.size(); ++s) {
    CHECK(lmdb->manifest().shards[s].content_hash == original->manifest().shards[s].content_hash);
    CHECK(hdf5->manifest().shards[s].sample_count == original->manifest().shards[s].sample_count);
  }
  for (uint64_t i = 0; i < original->size(); ++i) {
    REQUIRE(hdf5->At(i).ValueOrDie().entry->checksum ==
            original->At(i).ValueOrDie().entry->checksum);
    REQUIRE(lmdb->At(i).ValueOrDie().entry->checksum ==
            original->At(i).ValueOrDie().entry->checksum);
  }
  CHECK(lmdb->manifest().class_names == original->manifest().class_names);

  // Fixed-shape zstd: HDF5 stores it as /images; converting back regroups the records.
  auto z = PackAs(dir / "z", Backend::kHdf5, Encoding::kZstd, 24, true);
  REQUIRE(converter::Convert(*z, dir / "zl", Backend::kLmdb).ok());
  auto zl = *Archive::Open(dir / "zl");
  for (uint64_t i = 0; i < z->size(); ++i)
    REQUIRE(zl->At(i).ValueOrDie().entry->checksum == z->At(i).ValueOrDie().entry->checksum);
}

TEST_CASE("a flipped byte in an HDF5 chunk is caught by verify") {
  TempDir dir;
  std::vector<uint8_t> record;
  {
    auto a = PackAs(dir / "a", Backend::kHdf5, Encoding::kJpeg);
    auto r = a->At(20).ValueOrDie();
    record.assign(r.data, r.data + r.size);
  }
  std::string shard = dir / "a/shard-00000.h5";
  auto bytes = testing::ReadBytes(shard);
  auto at = std::search(bytes.begin(), bytes.end(), record.begin(), record.end());
  REQUIRE(at != bytes.end());
  at[record.size() / 2] ^= 0x10;
  testing::WriteBytes(shard, bytes);
  auto a = Archive::Open(dir / "a");
  REQUIRE(a.ok());
  validate::VerifyReport report = validate::Verify(**a, {});
  REQUIRE(report.bad_samples.size() == 1);
  CHECK(report.bad_samples[0].index == 20);
  CHECK(report.bad_shards.size() == 1);
}

TEST_CASE("damaged HDF5 shards are refused at open") {
  TempDir dir;
  PackAs(dir / "a", Backend::kHdf5, Encoding::kJpeg);
  std::string shard = dir / "a/shard-00000.h5";
  SECTION("truncated") {
    fs::resize_file(shard, fs::file_size(shard) / 2);
    CHECK(!Archive::Open(dir / "a").ok());
  }
  SECTION("not HDF5") {
    testing::WriteBytes(shard, std::vector<uint8_t>(5000, 7));
    auto r = Archive::Open(dir / "a");
    REQUIRE(!r.ok());
    CHECK(r.status().message().find("not an HDF5 file") != std::string::npos);
  }
}

TEST_CASE("HDF5 archives read correctly from threads and forked processes at once") {
  TempDir dir;
  auto a = PackAs(dir / "a", Backend::kHdf5, Encoding::kJpeg);  // opened before fork
  auto read_all = [&a]() {
    imaging::Decoder d;
    imaging::Image img;
    for (int pass = 0; pass < 5; ++pass) {
      for (uint64_t i = 0; i < a->size(); ++i) {
        if (!a->VerifyRecord(i).ok()) return false;
        auto r = a->At(i).ValueOrDie();
        if (!d.DecodeJpegRegion(r.data, r.size, {}, &img, {}).ok()) return false;
        if (img.width != r.entry->width) return false;
      }
    }
    return true;
  };
  std::vector<pid_t> children;
  for (int c = 0; c < 2; ++c) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) _exit(read_all() ? 0 : 1);
    children.push_back(pid);
  }
  bool ok1 = false, ok2 = false;
  std::thread t1([&] { ok1 = read_all(); });
  std::thread t2([&] { ok2 = read_all(); });
  t1.join();
  t2.join();
  CHECK(ok1);
  CHECK(ok2);
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  // And the loader's worker processes on the same archive.
  CHECK(Epoch(a, reader::WorkerMode::kProcesses) == Epoch(a, reader::WorkerMode::kThreads));
}

}  // namespace
}  // namespace shardfeed::format
