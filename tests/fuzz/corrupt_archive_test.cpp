// A deterministic corruption sweep over small archives of every encoding on both backends: flip
// random bits in a shard (anywhere, and concentrated in the container's own structures at the
// start of the file), truncate it at many lengths, and do both to the manifest; then open the
// archive, verify and decode every sample in a child process. Every outcome is allowed except
// dying by a signal (outside ASan the child's address space is capped at 4 GiB, so an
// allocation sized from damaged data dies too): a damaged archive must be refused or report bad
// samples, never crash the reader. libFuzzer targets (tests/fuzz/*_fuzz.cpp) search further.
#include <sys/resource.h>
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

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif

enum class Damage { kFlips, kTruncate };

// Returns how many of `iterations` damaged copies of `file` (in `archive`) crashed the reader.
// kFlips: 1-4 random bit flips within the first `region` bytes; kTruncate: cut at lengths
// spread over the file (and around its first pages).
int Sweep(const std::string& archive, const std::string& file, int iterations, size_t region,
          uint32_t seed, Damage damage = Damage::kFlips) {
  auto original = testing::ReadBytes(archive + "/" + file);
  std::mt19937 rng(seed);
  int crashes = 0;
  TempDir work;
  for (int it = 0; it < iterations; ++it) {
    std::string copy = work / ("c" + std::to_string(it));
    fs::copy(archive, copy);
    auto data = original;
    if (damage == Damage::kFlips) {
      const size_t span = std::min(region, data.size());
      for (int k = 0, flips = 1 + static_cast<int>(rng() % 4); k < flips; ++k) {
        data[rng() % span] ^= static_cast<uint8_t>(1u << (rng() % 8));
      }
    } else {
      const size_t cuts[] = {0, 1, 16, 64, 4095, 4096, 4097, 8192};
      data.resize(it < 8 ? std::min(cuts[it], data.size() - 1)
                         : data.size() * static_cast<size_t>(it - 7) / (iterations - 6));
    }
    testing::WriteBytes(copy + "/" + file, data);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      if (!kAsan) {
        rlimit limit{uint64_t{4} << 30, uint64_t{4} << 30};
        setrlimit(RLIMIT_AS, &limit);
      }
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
      WARN("iteration " << it << " of " << file << " died by signal " << WTERMSIG(status));
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
    for (format::Encoding enc :
         {format::Encoding::kJpeg, format::Encoding::kRaw, format::Encoding::kZstd}) {
      converter::PackOptions o;
      o.writer.backend = backend;
      o.writer.chunk_bytes = 8 << 10;  // several chunks, so chunk tables and overflow runs vary
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
      CHECK(Sweep(out, shard, 16, 0, 3, Damage::kTruncate) == 0);
      CHECK(Sweep(out, "manifest.json", 20, SIZE_MAX, 4) == 0);
      CHECK(Sweep(out, "manifest.json", 12, 0, 5, Damage::kTruncate) == 0);
    }
  }
}

}  // namespace
}  // namespace shardfeed
