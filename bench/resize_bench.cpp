// The reader's resize (imaging::ResizeInto: our fixed-point bilinear, and a whole-factor box
// reduce first for reductions of 2x or more) against OpenCV's cv::resize (INTER_LINEAR below 2x,
// INTER_AREA from 2x, what ResizeInto called before), RGB to 224x224, on one thread, from the
// sizes a crop of a ~460x400 photo or a DCT-scaled camera photo leaves. Prints one JSON object:
// microseconds per resize (best of 5 rounds) and the ratio. (How close each is to exact
// interpolation is tested in tests/imaging/image_test.cpp.)
//
//   resize_bench
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <vector>

#include "shardfeed/imaging/image.h"

namespace {

template <typename F>
double BestMicros(F f) {
  double best = 1e9;
  for (int r = 0; r < 5; ++r) {
    const auto t = std::chrono::steady_clock::now();
    for (int i = 0; i < 100; ++i) f();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count() / 100);
  }
  return best * 1e6;
}

}  // namespace

int main() {
  cv::setNumThreads(0);
  std::mt19937 rng(1);
  const int sizes[][2] = {{350, 350}, {262, 262}, {420, 380}, {150, 120}, {460, 340}, {900, 700}};
  std::printf("{");
  const char* sep = "";
  for (const auto& s : sizes) {
    std::vector<uint8_t> in(size_t(s[0]) * s[1] * 3), a(224 * 224 * 3), b(a.size());
    for (auto& v : in) v = static_cast<uint8_t>(rng());
    const bool area = s[0] >= 448 || s[1] >= 448;
    cv::Mat mi(s[1], s[0], CV_8UC3, in.data()), mo(224, 224, CV_8UC3, b.data());
    const double ours = BestMicros(
        [&] { shardfeed::imaging::ResizeInto(in.data(), s[0], s[1], 0, 3, a.data(), 224, 224); });
    const double theirs = BestMicros(
        [&] { cv::resize(mi, mo, mo.size(), 0, 0, area ? cv::INTER_AREA : cv::INTER_LINEAR); });
    std::printf(
        "%s\"%dx%d\": {\"ours_us\": %.1f, \"opencv_us\": %.1f, \"opencv\": \"%s\", "
        "\"speedup\": %.2f}",
        sep, s[0], s[1], ours, theirs, area ? "INTER_AREA" : "INTER_LINEAR", theirs / ours);
    sep = ", ";
  }
  std::printf("}\n");
  return 0;
}
