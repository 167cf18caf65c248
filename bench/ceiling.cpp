// The bare ceilings a loader is measured against: a tight libjpeg-turbo (TurboJPEG API) decode
// loop over JPEG bytes already in memory, or a memcpy loop over raw records, on N threads.
// No archive access, no crop, no resize, no batching: the work nobody can avoid.
//
//   shardfeed_ceiling ARCHIVE [--threads N] [--mode decode|memcpy] [--repeat R] [--scale NUM]
//
// Prints one JSON object with images_per_second.
#include <turbojpeg.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "shardfeed/format/archive.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(
        stderr,
        "usage: %s ARCHIVE [--threads N] [--mode decode|memcpy] [--repeat R] [--scale NUM]\n",
        argv[0]);
    return 2;
  }
  std::string path = argv[1], mode = "decode";
  int threads = static_cast<int>(std::thread::hardware_concurrency()), repeat = 1, scale = 8;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--threads")
      threads = std::stoi(argv[i + 1]);
    else if (k == "--mode")
      mode = argv[i + 1];
    else if (k == "--repeat")
      repeat = std::stoi(argv[i + 1]);
    else if (k == "--scale")
      scale = std::stoi(argv[i + 1]);
  }
  auto archive = shardfeed::format::Archive::Open(path);
  if (!archive.ok()) {
    std::fprintf(stderr, "%s\n", archive.status().ToString().c_str());
    return 3;
  }
  // Copy every record into private memory first: the loop then measures decode alone.
  std::vector<std::vector<uint8_t>> records;
  size_t max_pixels = 0;
  for (uint64_t i = 0; i < (*archive)->size(); ++i) {
    auto r = *(*archive)->At(i);
    records.emplace_back(r.data, r.data + r.size);
    max_pixels = std::max(max_pixels, size_t{r.entry->height} * r.entry->width);
  }
  const size_t n = records.size();
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    std::vector<uint8_t> out(max_pixels * 3 + 64);
    tjhandle tj = tjInitDecompress();
    for (;;) {
      size_t k = next.fetch_add(1);
      if (k >= n * repeat) break;
      const auto& rec = records[k % n];
      if (mode == "memcpy") {
        std::memcpy(out.data(), rec.data(), std::min(rec.size(), out.size()));
        continue;
      }
      int w, h, sub, cs;
      if (tjDecompressHeader3(tj, rec.data(), rec.size(), &w, &h, &sub, &cs) != 0) {
        failed = true;
        continue;
      }
      int sw = TJSCALED(w, (tjscalingfactor{scale, 8})),
          sh = TJSCALED(h, (tjscalingfactor{scale, 8}));
      if (tjDecompress2(tj, rec.data(), rec.size(), out.data(), sw, 0, sh, TJPF_RGB, 0) != 0 &&
          tjGetErrorCode(tj) == TJERR_FATAL) {
        failed = true;
      }
    }
    tjDestroy(tj);
  };
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "{\"mode\": \"%s\", \"threads\": %d, \"images\": %zu, \"seconds\": %.4f, "
      "\"images_per_second\": %.1f, \"failed\": %s}\n",
      mode.c_str(), threads, n * repeat, secs, n * repeat / secs, failed ? "true" : "false");
  return failed ? 1 : 0;
}
