// Geometry follows the image (reader/geometry.h): boxes and masks given in stored pixels land on
// the same pixels of the output image as the image itself, through EXIF orientation, centre
// crop, random-resized crop, squash and flip. The image-based cases decode real JPEGs (one per
// EXIF orientation) whose only bright pixels are a rectangle that is exactly the box and the mask.
#include "shardfeed/reader/geometry.h"

#include <algorithm>
#include <catch.hpp>
#include <cmath>
#include <random>

#include "shardfeed/codec/codec.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/reader/transform.h"
#include "test_util.h"

namespace shardfeed::reader {
namespace {

using testing::TempDir;

SampleGeometry Geometry(uint32_t sw, uint32_t sh, codec::CropRect crop, uint32_t ow, uint32_t oh,
                        int orientation = 1, bool flip = false) {
  SampleGeometry g;
  g.stored_width = sw, g.stored_height = sh;
  g.crop = crop;
  g.out_width = ow, g.out_height = oh;
  g.orientation = static_cast<uint8_t>(orientation);
  g.flip = flip;
  g.valid = 1;
  return g;
}

TEST_CASE("MapBoxes: identity, crop and scale, flip") {
  const float in[] = {10, 20, 30, 45, 0.5f, 1.25f, 99.75f, 50};
  float out[8];
  uint32_t rows[2];
  // Identity (crop none at the stored shape): bit-exact.
  auto id = Geometry(100, 50, {0, 0, 100, 50}, 100, 50);
  REQUIRE(MapBoxes(id, in, 2, out, rows) == 2);
  for (int i = 0; i < 8; ++i) CHECK(out[i] == in[i]);
  // Crop (10, 10, 40x20) scaled 2x into 80x40.
  auto g = Geometry(100, 50, {10, 10, 40, 20}, 80, 40);
  REQUIRE(MapBoxes(g, in, 1, out, rows) == 1);
  CHECK(out[0] == 0.f);   // x0 10 -> 0
  CHECK(out[1] == 20.f);  // y0 20 -> (20 - 10) * 2
  CHECK(out[2] == 40.f);  // x1 30 -> 40
  CHECK(out[3] == 40.f);  // y1 45 -> 70, clipped to 40
  g.flip = 1;
  REQUIRE(MapBoxes(g, in, 1, out, rows) == 1);
  CHECK(out[0] == 40.f);
  CHECK(out[2] == 80.f);
}

TEST_CASE("MapBoxes drops boxes left with less than kMinBoxSide, and keeps row numbers") {
  const float in[] = {
      0,   0,  10,    10,  // kept
      50,  50, 60,    60,  // outside the crop: dropped
      5,   5,  5,     9,   // no width: dropped
      9,   9,  2,     2,   // inverted: dropped
      NAN, 0,  4,     4,   // not a number: dropped
      20,  0,  20.6f, 10,  // 0.6 px wide: dropped (min side 1)
      3,   3,  7,     7,   // kept
  };
  float out[7 * 4];
  uint32_t rows[7];
  auto g = Geometry(100, 100, {0, 0, 40, 40}, 40, 40);
  REQUIRE(MapBoxes(g, in, 7, out, rows) == 2);
  CHECK(rows[0] == 0);
  CHECK(rows[1] == 6);
  CHECK(out[4] == 3.f);
  g.valid = 0;
  CHECK(MapBoxes(g, in, 7, out, rows) == 0);
}

// The pixels whose centres lie inside a box.
std::vector<uint8_t> BoxPixels(const float* b, uint32_t w, uint32_t h) {
  std::vector<uint8_t> p(size_t{w} * h, 0);
  for (uint32_t i = 0; i < h; ++i) {
    for (uint32_t j = 0; j < w; ++j) {
      p[size_t{i} * w + j] = j + 0.5 > b[0] && j + 0.5 < b[2] && i + 0.5 > b[1] && i + 0.5 < b[3];
    }
  }
  return p;
}

double IoU(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  size_t both = 0, any = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    both += a[i] && b[i];
    any += a[i] || b[i];
  }
  return any ? double(both) / any : 1.0;
}

TEST_CASE("MapMask of a rectangle matches MapBoxes of it, for every orientation and flip") {
  std::mt19937 rng(7);
  for (int orientation = 1; orientation <= 8; ++orientation) {
    for (int trial = 0; trial < 40; ++trial) {
      const uint32_t sw = 60 + rng() % 100, sh = 60 + rng() % 100;
      const uint32_t x0 = rng() % (sw / 2), y0 = rng() % (sh / 2);
      const uint32_t x1 = x0 + 20 + rng() % (sw - x0 - 20), y1 = y0 + 20 + rng() % (sh - y0 - 20);
      std::vector<uint8_t> mask(size_t{sw} * sh, 0);
      for (uint32_t y = y0; y < y1; ++y) {
        std::fill(mask.begin() + y * sw + x0, mask.begin() + y * sw + x1, 1);
      }
      const uint32_t uw = orientation >= 5 ? sh : sw, uh = orientation >= 5 ? sw : sh;
      auto below = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
      const codec::CropRect crop{below(uw / 4), below(uh / 4), uw / 2 + below(uw / 4),
                                 uh / 2 + below(uh / 4)};
      auto g = Geometry(sw, sh, crop, 48, 32, orientation, trial % 2);
      const float box[4] = {float(x0), float(y0), float(x1), float(y1)};
      float out[4];
      std::vector<uint8_t> mapped(48 * 32);
      MapMask(g, mask.data(), mapped.data());
      if (MapBoxes(g, box, 1, out, nullptr) == 0) {
        CHECK(std::count(mapped.begin(), mapped.end(), 1) <= 48);  // at most a sliver
        continue;
      }
      if (out[2] - out[0] < 6 || out[3] - out[1] < 6) continue;  // IoU is coarse on tiny boxes
      INFO("orientation " << orientation << " trial " << trial);
      CHECK(IoU(mapped, BoxPixels(out, 48, 32)) >= 0.8);
    }
  }
}

// ---- Real JPEGs, decoded by the reader --------------------------------------------------------

// `jpeg` with an EXIF APP1 segment giving `orientation`, right after SOI.
std::vector<uint8_t> WithOrientation(const std::vector<uint8_t>& jpeg, int orientation) {
  const uint8_t app1[] = {0xFF,
                          0xE1,
                          0,
                          34,
                          'E',
                          'x',
                          'i',
                          'f',
                          0,
                          0,  // APP1, 34 bytes
                          'I',
                          'I',
                          42,
                          0,
                          8,
                          0,
                          0,
                          0,  // TIFF, IFD0 at 8
                          1,
                          0,  // one entry
                          0x12,
                          0x01,
                          3,
                          0,
                          1,
                          0,
                          0,
                          0,  // Orientation, SHORT, 1
                          static_cast<uint8_t>(orientation),
                          0,
                          0,
                          0,  // its value
                          0,
                          0,
                          0,
                          0};  // no next IFD
  std::vector<uint8_t> out(jpeg.begin(), jpeg.begin() + 2);
  out.insert(out.end(), std::begin(app1), std::end(app1));
  out.insert(out.end(), jpeg.begin() + 2, jpeg.end());
  return out;
}

struct Scene {
  uint32_t w, h;
  uint32_t x0, y0, x1, y1;  // the bright rectangle: exactly the box
};

// An archive of one JPEG per EXIF orientation 1..8 (sample o - 1), each dark with a bright
// rectangle; the scenes' rectangles in stored pixels.
std::shared_ptr<format::Archive> SceneArchive(const std::string& path, std::vector<Scene>* scenes) {
  auto w = format::ArchiveWriter::Create(path, {});
  REQUIRE(w.ok());
  const codec::Codec* jpeg = codec::CodecFor(format::Encoding::kJpeg).ValueOrDie();
  codec::Context ctx;
  for (int o = 1; o <= 8; ++o) {
    Scene s{160,
            120,
            uint32_t(20 + 7 * o),
            uint32_t(10 + 5 * o),
            uint32_t(90 + 6 * o),
            uint32_t(70 + 4 * o)};
    imaging::Image img;
    img.Resize(s.w, s.h);
    for (uint32_t y = 0; y < s.h; ++y) {
      for (uint32_t x = 0; x < s.w; ++x) {
        const bool in = x >= s.x0 && x < s.x1 && y >= s.y0 && y < s.y1;
        std::fill_n(img.pixels.begin() + (size_t{y} * s.w + x) * 3, 3, in ? 235 : 20);
      }
    }
    auto encoded = imaging::EncodeJpeg(img, 98);
    REQUIRE(encoded.ok());
    const std::vector<uint8_t> file = WithOrientation(*encoded, o);
    imaging::Bytes payload(file.begin(), file.end());
    format::IndexEntry e{};
    e.encoding = static_cast<uint8_t>(format::Encoding::kJpeg);
    e.orientation = 1;
    bool resized = false;
    REQUIRE(jpeg->Encode(ctx, {}, &payload, &e, &resized).ok());
    REQUIRE(e.orientation == o);
    REQUIRE((*w)->Append(e, payload.data(), payload.size()).ok());
    scenes->push_back(s);
  }
  format::Manifest m;
  m.encoding = format::Encoding::kJpeg;
  m.class_names = {"a"};
  REQUIRE((*w)->Finish(m).ok());
  return format::Archive::Open(path).ValueOrDie();
}

TEST_CASE("boxes and masks follow real images through orientation, crops and flips") {
  TempDir dir;
  std::vector<Scene> scenes;
  auto archive = SceneArchive(dir / "a", &scenes);
  struct Mode {
    const char* name;
    Crop crop;
    bool flip;
  };
  const Mode modes[] = {{"center", Crop::kCenter, false},
                        {"random+flip", Crop::kRandom, true},
                        {"squash+flip", Crop::kSquash, true}};
  constexpr uint32_t kOut = 64;
  for (const Mode& mode : modes) {
    TransformOptions t;
    t.crop = mode.crop;
    t.flip = mode.flip;
    t.size = kOut;
    SampleDecoder decoder(archive, t);
    std::vector<uint8_t> image(kOut * kOut * 3), mask_out(kOut * kOut);
    for (uint64_t i = 0; i < scenes.size(); ++i) {
      const Scene& s = scenes[i];
      std::vector<uint8_t> mask(size_t{s.w} * s.h, 0);
      for (uint32_t y = s.y0; y < s.y1; ++y) {
        std::fill(mask.begin() + y * s.w + s.x0, mask.begin() + y * s.w + s.x1, 1);
      }
      const float box[4] = {float(s.x0), float(s.y0), float(s.x1), float(s.y1)};
      for (uint64_t seed = 0; seed < 40; ++seed) {
        INFO(mode.name << ", orientation " << i + 1 << ", seed " << seed);
        StageTimes times;
        SampleGeometry g;
        REQUIRE(decoder.DecodeInto(i, seed, image.data(), &times, &g).ok());
        REQUIRE(g.valid);
        std::vector<uint8_t> bright(kOut * kOut);
        for (size_t p = 0; p < bright.size(); ++p) {
          bright[p] = image[3 * p] + image[3 * p + 1] + image[3 * p + 2] > 3 * 128;
        }
        const size_t lit = std::count(bright.begin(), bright.end(), 1);
        MapMask(g, mask.data(), mask_out.data());
        float out[4];
        if (MapBoxes(g, box, 1, out, nullptr) == 0) {
          CHECK(lit <= 2 * kOut);  // the crop holds at most a sliver of the rectangle
          continue;
        }
        // The box encloses every bright pixel (with one output pixel of slack for the resize
        // filter and JPEG's blur at the edge).
        size_t outside = 0;
        for (uint32_t y = 0; y < kOut; ++y) {
          for (uint32_t x = 0; x < kOut; ++x) {
            outside += bright[y * kOut + x] && (x + 0.5 < out[0] - 1 || x + 0.5 > out[2] + 1 ||
                                                y + 0.5 < out[1] - 1 || y + 0.5 > out[3] + 1);
          }
        }
        CHECK(outside == 0);
        // Away from tiny boxes (both sides at least 12 output pixels): the box's pixels, the
        // mapped mask and the bright pixels agree to IoU >= 0.85 (edges are where they differ).
        if (out[2] - out[0] >= 12 && out[3] - out[1] >= 12) {
          const auto boxed = BoxPixels(out, kOut, kOut);
          CHECK(IoU(bright, boxed) >= 0.85);
          CHECK(IoU(mask_out, bright) >= 0.85);
          CHECK(IoU(mask_out, boxed) >= 0.85);
        }
      }
    }
  }
}

TEST_CASE("a geometry is recorded only for a decoded sample") {
  TempDir dir;
  std::vector<Scene> scenes;
  auto archive = SceneArchive(dir / "a", &scenes);
  TransformOptions t;
  t.size = 32;
  SampleDecoder decoder(archive, t);
  std::vector<uint8_t> image(32 * 32 * 3);
  StageTimes times;
  SampleGeometry g;
  REQUIRE(decoder.DecodeInto(5, 1, image.data(), &times, &g).ok());
  CHECK(g.valid == 1);
  CHECK(g.orientation == 6);
  CHECK(g.out_width == 32);
  CHECK_FALSE(decoder.DecodeInto(99, 1, image.data(), &times, &g).ok());
  CHECK(g.valid == 0);
}

}  // namespace
}  // namespace shardfeed::reader
