// Region decode of indexed JPEG records against the same archive's original bytes and against a
// full-decode loop, in CPU time: each case runs on one thread over every record (bytes already
// in memory for the full-decode loop, the mapped archive for the reader's path), timed with the
// thread's CPU clock, so a machine shared with other jobs changes little but its caches. The
// reader's path is reader::SampleDecoder::DecodeInto, exactly what each loader worker runs per
// sample (crop, DCT-scaled region decode, resize to 224, flip), uint8 output.
//
//   region_bench ORIGINAL INDEXED [--rounds 3] [--size 224] [--also ARCHIVE]...
//
// ORIGINAL: an archive packed with --jpeg-layout original; INDEXED: the same files with
// --jpeg-layout indexed. Prints one JSON object: images per CPU-second of each case (median of
// the rounds; within a round the cases take turns image by image) and each one's ratio to the
// full-decode loop. --also adds the crop cases for another packing of the same files (e.g. an
// indexed archive made with another restart interval), named center_also1, random_also1, ...
// The *_libjpeg_entropy cases are the same crops with libjpeg-turbo's own Huffman decoder in
// place of shardfeed's (imaging/src/jpeg_huffman.h): the before and after of that decoder.
#include <time.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "jpeg_huffman.h"  // imaging/src: which entropy decoder a case uses
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ORIGINAL INDEXED [--rounds R] [--size S]\n", argv[0]);
    return 2;
  }
  int rounds = 3;
  uint32_t size = 224;
  std::string only;               // --only CASE: that case alone (for a profiler)
  std::vector<std::string> also;  // --also ARCHIVE: more layouts of the same files, as cases
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--rounds") rounds = std::stoi(argv[i + 1]);
    if (k == "--size") size = static_cast<uint32_t>(std::stoi(argv[i + 1]));
    if (k == "--only") only = argv[i + 1];
    if (k == "--also") also.push_back(argv[i + 1]);
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
    bool libjpeg_entropy = false;  // libjpeg-turbo's Huffman decoder, not shardfeed's
  };
  std::vector<Case> cases = {
      {"center_original", *original, reader::Crop::kCenter},
      {"center_indexed", *indexed, reader::Crop::kCenter},
      {"random_original", *original, reader::Crop::kRandom},
      {"random_indexed", *indexed, reader::Crop::kRandom},
      {"center_original_libjpeg_entropy", *original, reader::Crop::kCenter, true},
      {"center_indexed_libjpeg_entropy", *indexed, reader::Crop::kCenter, true},
      {"random_original_libjpeg_entropy", *original, reader::Crop::kRandom, true},
      {"random_indexed_libjpeg_entropy", *indexed, reader::Crop::kRandom, true},
  };
  for (size_t a = 0; a < also.size(); ++a) {
    auto extra = Archive::Open(also[a]);
    if (!extra.ok() || (*extra)->size() != n) {
      std::fprintf(stderr, "%s: not an archive of the same %zu records\n", also[a].c_str(), n);
      return 3;
    }
    const std::string tag = "_also" + std::to_string(a + 1);
    cases.push_back({"center" + tag, *extra, reader::Crop::kCenter});
    cases.push_back({"random" + tag, *extra, reader::Crop::kRandom});
  }
  // Cases interleaved image by image (each image decoded by every case in turn), so a change
  // in the machine's load during a round falls on every case alike.
  std::map<std::string, std::vector<double>> rates;
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::unique_ptr<reader::SampleDecoder>> decoders;
    std::vector<std::vector<uint8_t>> outs;
    std::vector<double> secs(cases.size(), 0.0);
    double full_secs = 0, full_indexed_secs = 0;
    for (const Case& c : cases) {
      reader::TransformOptions o;
      o.crop = c.crop;
      o.size = size;
      o.flip = c.crop == reader::Crop::kRandom;
      decoders.push_back(std::make_unique<reader::SampleDecoder>(c.archive, o));
      outs.emplace_back(decoders.back()->sample_bytes());
    }
    reader::StageTimes times;
    for (size_t i = 0; i < n; ++i) {
      auto timed = [&](double* total, const std::function<bool()>& one) {
        const double t0 = ThreadSeconds();
        if (!one()) {
          std::fprintf(stderr, "sample %zu failed\n", i);
          std::exit(1);
        }
        *total += ThreadSeconds() - t0;
      };
      if (only.empty()) {
        source = &records;
        timed(&full_secs, [&] { return full_decode(i); });
        source = &relaid;
        timed(&full_indexed_secs, [&] { return full_decode(i); });
      }
      for (size_t c = 0; c < cases.size(); ++c) {
        if (!only.empty() && cases[c].name != only) continue;
        shardfeed::imaging::internal::SetUseFastHuffman(!cases[c].libjpeg_entropy);
        timed(&secs[c], [&] {
          return decoders[c]
              ->DecodeInto(i, 1234567 + i * 7919 + round, outs[c].data(), &times)
              .ok();
        });
      }
    }
    rates["full_decode"].push_back(only.empty() ? n / full_secs : 1);
    if (only.empty()) rates["full_decode_indexed"].push_back(n / full_indexed_secs);
    for (size_t c = 0; c < cases.size(); ++c) {
      if (only.empty() || cases[c].name == only) rates[cases[c].name].push_back(n / secs[c]);
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
