// A deterministic corruption sweep: flip random bits in a shard (anywhere, and concentrated in
// the container's own structures at the start of the file), then open the archive and decode
// every sample in a child process. Every outcome is allowed except dying by a signal: a damaged
// archive must be refused or report bad samples, never crash the reader.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "shardfeed/converter/pack.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/reader/transform.h"
#include "test_util.h"

namespace shardfeed {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// Returns how many of `iterations` damaged copies crashed the reader.
int Sweep(const std::string& archive, const std::string& shard_name, int iterations, size_t region,
          uint32_t seed) {
  auto original = testing::ReadBytes(archive + "/" + shard_name);
  std::mt19937 rng(seed);
  int crashes = 0;
  TempDir work;
  for (int it = 0; it < iterations; ++it) {
    std::string copy = work / ("c" + std::to_string(it));
    fs::copy(archive, copy);
    auto data = original;
    const size_t span = std::min(region, data.size());
    for (int k = 0, flips = 1 + static_cast<int>(rng() % 4); k < flips; ++k) {
      data[rng() % span] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    testing::WriteBytes(copy + "/" + shard_name, data);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      auto a = format::Archive::Open(copy);
      if (!a.ok()) _exit(1);
      reader::TransformOptions t;
      t.size = 24;
      reader::SampleDecoder decoder(*a, t);
      std::vector<uint8_t> out(decoder.sample_bytes());
      for (uint64_t i = 0; i < (*a)->size(); ++i) {
        reader::StageTimes times;
        (void)(*a)->VerifyRecord(i);
        (void)decoder.DecodeInto(i, i, out.data(), &times);
      }
      _exit(0);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    if (WIFSIGNALED(status)) {
      ++crashes;
      WARN("iteration " << it << " of " << shard_name << " died by signal " << WTERMSIG(status));
    }
    fs::remove_all(copy);
  }
  return crashes;
}

TEST_CASE("damaged archives never crash the reader") {
  TempDir dir;
  auto src = converter::ScanImageFolder(testing::SampleDir());
  REQUIRE(src.ok());
  for (format::Backend backend : {format::Backend::kLmdb, format::Backend::kHdf5}) {
    for (format::Encoding enc : {format::Encoding::kJpeg, format::Encoding::kZstd}) {
      converter::PackOptions o;
      o.writer.backend = backend;
      o.encoding = enc;
      o.size = enc == format::Encoding::kJpeg ? 0 : 32;
      std::string out = dir / (std::string(format::BackendName(backend)) +
                               std::string(format::EncodingName(enc)));
      converter::PackResult r;
      REQUIRE(converter::Pack(*src, out, o, &r).ok());
      const std::string shard =
          backend == format::Backend::kLmdb ? "shard-00000.mdb" : "shard-00000.h5";
      INFO(out);
      CHECK(Sweep(out, shard, 60, SIZE_MAX, 1) == 0);  // anywhere
      CHECK(Sweep(out, shard, 60, 8192, 2) == 0);      // the container's own pages
    }
  }
}

}  // namespace
}  // namespace shardfeed
