// Region decode of indexed JPEG records against the same archive's original bytes and against a
// full-decode loop, in CPU time: each case runs on one thread over every record (bytes already
// in memory for the full-decode loop, the mapped archive for the reader's path), timed with the
// thread's CPU clock, so a machine shared with other jobs changes little but its caches. The
// reader's path is reader::SampleDecoder::DecodeInto, exactly what each loader worker runs per
// sample (crop, DCT-scaled region decode, resize to 224, flip), uint8 output.
//
//   region_bench ORIGINAL INDEXED [--rounds 3] [--size 224]
//
// ORIGINAL: an archive packed with --jpeg-layout original; INDEXED: the same files with
// --jpeg-layout indexed. Prints one JSON object: images per CPU-second of each case (median of
// the rounds, cases interleaved within a round) and each one's ratio to the full-decode loop.
#include <time.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "shardfeed/format/archive.h"
#include "shardfeed/reader/transform.h"

namespace {

using shardfeed::format::Archive;
namespace reader = shardfeed::reader;

double ThreadSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// Images per CPU-second of `one` over `n` samples.
double Rate(size_t n, const std::function<bool(size_t)>& one) {
  const double t0 = ThreadSeconds();
  for (size_t i = 0; i < n; ++i) {
    if (!one(i)) {
      std::fprintf(stderr, "sample %zu failed\n", i);
      std::exit(1);
    }
  }
  return n / (ThreadSeconds() - t0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ORIGINAL INDEXED [--rounds R] [--size S]\n", argv[0]);
    return 2;
  }
  int rounds = 3;
  uint32_t size = 224;
  std::string only;  // --only CASE: that case alone (for a profiler)
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--rounds") rounds = std::stoi(argv[i + 1]);
    if (k == "--size") size = static_cast<uint32_t>(std::stoi(argv[i + 1]));
    if (k == "--only") only = argv[i + 1];
  }
  auto original = Archive::Open(argv[1]);
  auto indexed = Archive::Open(argv[2]);
  if (!original.ok() || !indexed.ok()) {
    std::fprintf(stderr, "%s\n",
                 (original.ok() ? indexed.status() : original.status()).ToString().c_str());
    return 3;
  }
  const size_t n = (*original)->size();
  // The full-decode loops read from memory; the indexed records as stored (TurboJPEG stops at
  // their EOI, before the index).
  std::vector<std::vector<uint8_t>> records, relaid;
  size_t max_pixels = 0;
  for (size_t i = 0; i < n; ++i) {
    auto r = *(*original)->At(i);
    records.emplace_back(r.data, r.data + r.size);
    max_pixels = std::max(max_pixels, size_t{r.entry->height} * r.entry->width);
    auto x = *(*indexed)->At(i);
    relaid.emplace_back(x.data, x.data + x.size);
  }
  std::vector<uint8_t> pixels(max_pixels * 3 + 64);
  tjhandle tj = tjInitDecompress();
  const std::vector<std::vector<uint8_t>>* source = &records;
  auto full_decode = [&](size_t i) {
    int w, h, sub, cs;
    const auto& rec = (*source)[i];
    if (tjDecompressHeader3(tj, rec.data(), rec.size(), &w, &h, &sub, &cs) != 0) return false;
    return tjDecompress2(tj, rec.data(), rec.size(), pixels.data(), w, 0, h, TJPF_RGB, 0) == 0;
  };
  struct Case {
    std::string name;
    std::shared_ptr<Archive> archive;
    reader::Crop crop;
  };
  const std::vector<Case> cases = {
      {"center_original", *original, reader::Crop::kCenter},
      {"center_indexed", *indexed, reader::Crop::kCenter},
      {"random_original", *original, reader::Crop::kRandom},
      {"random_indexed", *indexed, reader::Crop::kRandom},
  };
  std::map<std::string, std::vector<double>> rates;
  for (int round = 0; round < rounds; ++round) {
    if (!only.empty()) rates["full_decode"].push_back(1);
    if (!only.empty()) goto cases;
    source = &records;
    rates["full_decode"].push_back(Rate(n, full_decode));
    source = &relaid;
    rates["full_decode_indexed"].push_back(Rate(n, full_decode));
  cases:
    for (const Case& c : cases) {
      if (!only.empty() && c.name != only) continue;
      reader::TransformOptions o;
      o.crop = c.crop;
      o.size = size;
      o.flip = c.crop == reader::Crop::kRandom;
      reader::SampleDecoder decoder(c.archive, o);
      std::vector<uint8_t> out(decoder.sample_bytes());
      reader::StageTimes times;
      rates[c.name].push_back(Rate(n, [&](size_t i) {
        return decoder.DecodeInto(i, 1234567 + i * 7919 + round, out.data(), &times).ok();
      }));
    }
  }
  tjDestroy(tj);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double ceiling = median(rates["full_decode"]);
  std::printf("{\"images\": %zu, \"rounds\": %d", n, rounds);
  for (const auto& [name, v] : rates) {
    std::printf(", \"%s\": {\"images_per_cpu_second\": %.1f, \"vs_full_decode\": %.3f}",
                name.c_str(), median(v), median(v) / ceiling);
  }
  std::printf("}\n");
  return 0;
}
