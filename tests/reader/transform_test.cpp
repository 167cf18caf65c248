#include "shardfeed/reader/transform.h"

#include <cmath>
#include <map>
#include <numeric>

#include "shardfeed/converter/pack.h"
#include "shardfeed/reader/loader.h"
#include "test_util.h"

namespace shardfeed::reader {
namespace {

using format::Archive;
using testing::TempDir;

std::shared_ptr<Archive> PackSample(const std::string& out,
                                    format::Encoding enc = format::Encoding::kJpeg,
                                    uint32_t size = 0) {
  auto src = converter::ScanImageFolder(testing::SampleDir());
  REQUIRE(src.ok());
  converter::PackOptions opt;
  opt.encoding = enc;
  opt.size = size;
  converter::PackResult result;
  REQUIRE(converter::Pack(*src, out, opt, &result).ok());
  auto a = Archive::Open(out);
  REQUIRE(a.ok());
  return *a;
}

// Reference: full decode (upright), crop, resize: what the loader must reproduce.
std::vector<uint8_t> Reference(const Archive& a, uint64_t i, const CropRect& rect, uint32_t size) {
  imaging::Decoder d;
  imaging::Image img;
  auto r = a.At(i).ValueOrDie();
  REQUIRE(d.Decode(r.data, r.size, &img, {}).ok());
  std::vector<uint8_t> out(size_t{size} * size * 3);
  const uint8_t* origin = img.pixels.data() + (size_t{rect.y} * img.width + rect.x) * 3;
  imaging::ResizeInto(origin, rect.width, rect.height, size_t{img.width} * 3, 3, out.data(), size,
                      size);
  return out;
}

double MeanAbsDiff(const uint8_t* a, const uint8_t* b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += std::abs(int(a[i]) - int(b[i]));
  return s / n;
}

TEST_CASE("center crop equals a reference decode of the same image") {
  TempDir dir;
  auto a = PackSample(dir / "a");
  TransformOptions o;
  o.crop = Crop::kCenter;
  o.size = 40;
  o.scaled_decode = false;
  SampleDecoder exact(a, o);
  o.scaled_decode = true;
  SampleDecoder scaled(a, o);
  std::vector<uint8_t> got(exact.sample_bytes()), got_scaled(scaled.sample_bytes());
  for (uint64_t i = 0; i < a->size(); ++i) {
    StageTimes t;
    REQUIRE(exact.DecodeInto(i, 0, got.data(), &t).ok());
    REQUIRE(scaled.DecodeInto(i, 0, got_scaled.data(), &t).ok());
    const auto& e = *a->At(i).ValueOrDie().entry;
    uint32_t w = e.orientation >= 5 ? e.height : e.width,
             h = e.orientation >= 5 ? e.width : e.height;
    auto want = Reference(*a, i, CenterCropRect(w, h, o.center_ratio), 40);
    INFO("sample " << i);
    // Region decode of the same pixels: identical up to libjpeg's upsampling at crop edges.
    CHECK(MeanAbsDiff(got.data(), want.data(), want.size()) < 0.5);
    CHECK(MeanAbsDiff(got_scaled.data(), want.data(), want.size()) < 6.0);
  }
}

TEST_CASE("raw records are copied exactly; NCHW is the transpose of NHWC") {
  TempDir dir;
  auto a = PackSample(dir / "a", format::Encoding::kZstd, 32);
  TransformOptions o;
  o.crop = Crop::kCenter;
  o.center_ratio = 1.0;
  o.size = 32;
  SampleDecoder nhwc(a, o);
  o.layout = Layout::kNCHW;
  SampleDecoder nchw(a, o);
  std::vector<uint8_t> x(nhwc.sample_bytes()), y(nchw.sample_bytes());
  for (uint64_t i = 0; i < a->size(); ++i) {
    StageTimes t;
    REQUIRE(nhwc.DecodeInto(i, 0, x.data(), &t).ok());
    REQUIRE(nchw.DecodeInto(i, 0, y.data(), &t).ok());
    // Centre square of a 32-short-side image, at 32: a pure copy of the record's centre.
    for (uint32_t p = 0; p < 32 * 32; ++p)
      for (int c = 0; c < 3; ++c) REQUIRE(y[c * 32 * 32 + p] == x[p * 3 + c]);
  }
}

TEST_CASE("random crops and flips are reproducible per (seed, epoch, sample)") {
  TempDir dir;
  auto a = PackSample(dir / "a");
  LoaderOptions o;
  o.batch_size = 12;
  o.shuffle = true;
  o.seed = 77;
  o.transform.crop = Crop::kRandom;
  o.transform.flip = true;
  o.transform.size = 48;
  auto read = [&](int workers, uint64_t epoch) {
    o.workers = workers;
    auto loader = Loader::Create(a, o);
    REQUIRE(loader.ok());
    REQUIRE((*loader)->StartEpoch(epoch).ok());
    std::map<uint64_t, std::vector<uint8_t>> by_index;
    while (true) {
      auto b = (*loader)->Next();
      REQUIRE(b.ok());
      if (!*b) break;
      size_t per = b->image_bytes() / b->size();
      for (uint32_t j = 0; j < b->size(); ++j)
        by_index[b->indices()[j]].assign(b->images() + j * per, b->images() + (j + 1) * per);
    }
    return by_index;
  };
  auto e0 = read(1, 0);
  CHECK(e0 == read(2, 0));
  auto e1 = read(2, 1);
  int differing = 0;
  for (auto& [i, px] : e0) differing += px != e1[i];
  CHECK(differing > 30);  // new crops every epoch
}

TEST_CASE("crops of EXIF-rotated JPEGs decode only their region, for all 8 orientations") {
  // One stored JPEG; its orientation tag rewritten 1..8. A crop taken in upright coordinates
  // must equal full decode + orientation + crop, whatever the orientation.
  imaging::Image img;
  img.Resize(160, 96);
  for (uint32_t y = 0; y < 96; ++y)
    for (uint32_t x = 0; x < 160; ++x) {
      uint8_t* p = &img.pixels[(size_t{y} * 160 + x) * 3];
      p[0] = static_cast<uint8_t>(x * 255 / 159);
      p[1] = static_cast<uint8_t>(y * 255 / 95);
      p[2] = static_cast<uint8_t>(((x / 16) + (y / 16)) % 2 ? 220 : 30);
    }
  auto plain = imaging::EncodeJpeg(img, 95);
  REQUIRE(plain.ok());
  // APP1 Exif with one IFD entry (Orientation), inserted after SOI.
  auto with_orientation = [&](uint8_t o) {
    const uint8_t app1[] = {0xFF, 0xE1, 0x00, 0x22, 'E', 'x', 'i', 'f', 0,    0,    'I', 'I',
                            42,   0,    8,    0,    0,   0,   1,   0,   0x12, 0x01, 3,   0,
                            1,    0,    0,    0,    o,   0,   0,   0,   0,    0,    0,   0};
    std::vector<uint8_t> out(plain->begin(), plain->begin() + 2);
    out.insert(out.end(), app1, app1 + sizeof(app1));
    out.insert(out.end(), plain->begin() + 2, plain->end());
    return out;
  };
  for (uint8_t o = 1; o <= 8; ++o) {
    auto jpeg = with_orientation(o);
    auto info = imaging::ProbeJpeg(jpeg.data(), jpeg.size(), true, {});
    REQUIRE(info.ok());
    REQUIRE(info->orientation == o);
    const uint32_t dw = o >= 5 ? 96 : 160, dh = o >= 5 ? 160 : 96;
    CropRect rect{dw / 5, dh / 7, dw / 2, dh / 2};
    CropRect stored = StoredRect(rect, o, 160, 96);
    imaging::Decoder d;
    imaging::Image region, full;
    REQUIRE(d.DecodeJpegRegion(jpeg.data(), jpeg.size(),
                               {stored.x, stored.y, stored.width, stored.height, 0, 0}, &region, {})
                .ok());
    imaging::ApplyOrientation(&region, o);
    REQUIRE(d.Decode(jpeg.data(), jpeg.size(), &full, {}).ok());
    REQUIRE(full.width == dw);
    REQUIRE(region.width == rect.width);
    REQUIRE(region.height == rect.height);
    double diff = 0;
    for (uint32_t y = 0; y < rect.height; ++y)
      for (uint32_t x = 0; x < rect.width * 3; ++x)
        diff += std::abs(int(region.pixels[y * rect.width * 3 + x]) -
                         int(full.pixels[(size_t{y + rect.y} * dw + rect.x) * 3 + x]));
    INFO("orientation " << int(o));
    CHECK(diff / (rect.width * rect.height * 3) < 1.0);
  }
}

TEST_CASE("random-resized-crop rectangles follow torchvision's bounds") {
  TransformOptions o;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    CropRect r = RandomResizedCropRect(500, 375, o, seed);
    REQUIRE(r.width >= 1);
    REQUIRE(r.x + r.width <= 500);
    REQUIRE(r.y + r.height <= 375);
    double area = double(r.width) * r.height / (500.0 * 375);
    REQUIRE(area <= 1.0);
  }
  CropRect c = CenterCropRect(300, 200, 0.875);
  CHECK(c.width == 175);
  CHECK(c.height == 175);
  CHECK(c.x == 62);
}

}  // namespace
}  // namespace shardfeed::reader

namespace shardfeed::reader {
namespace {

// A photo-like test image: smooth gradients, a few edges, fine texture and noise.
imaging::Image PhotoLike(uint32_t w, uint32_t h) {
  imaging::Image img;
  img.Resize(w, h);
  uint32_t state = 12345;
  for (uint32_t y = 0; y < h; ++y)
    for (uint32_t x = 0; x < w; ++x) {
      state = state * 1664525u + 1013904223u;
      const double noise = ((state >> 24) & 15) - 7.5;
      uint8_t* p = &img.pixels[(size_t{y} * w + x) * 3];
      const double t = 40 * std::sin(x * 0.05) * std::cos(y * 0.031);
      const bool edge = (x / 97 + y / 61) % 2;
      p[0] = static_cast<uint8_t>(std::clamp(90 + 120.0 * x / w + t + noise, 0.0, 255.0));
      p[1] = static_cast<uint8_t>(std::clamp(60 + 140.0 * y / h - t + noise, 0.0, 255.0));
      p[2] = static_cast<uint8_t>(std::clamp((edge ? 180 : 70) + t / 2 + noise, 0.0, 255.0));
    }
  return img;
}

double MeanAbsoluteError(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::abs(int(a[i]) - int(b[i]));
  return sum / double(a.size());
}

TEST_CASE("DCT-scaled decoding at every n/8 stays close to full decode + resize") {
  // The scaled path (decode at n/8, then resize the rest of the way) against the reference
  // (decode at full size, then resize): docs/BENCHMARKS.md states the bound checked here.
  auto jpeg = imaging::EncodeJpeg(PhotoLike(640, 480), 90);
  REQUIRE(jpeg.ok());
  imaging::Decoder d;
  const CropRect crop = CenterCropRect(640, 480, 224.0 / 256.0);  // 420 x 420
  const uint32_t out = 112;
  imaging::Image full;
  REQUIRE(d.DecodeJpegRegion(jpeg->data(), jpeg->size(),
                             {crop.x, crop.y, crop.width, crop.height, 0, 0}, &full, {})
              .ok());
  std::vector<uint8_t> want(size_t{out} * out * 3), got(want.size());
  imaging::ResizeInto(full.pixels.data(), full.width, full.height, 0, 3, want.data(), out, out);
  for (int n = 2; n <= 7; ++n) {
    // The smallest size that makes n the smallest covering scale.
    const uint32_t need = (crop.width * uint32_t(n - 1) + 7) / 8 + 1;
    imaging::JpegRegion region{crop.x, crop.y, crop.width, crop.height, need, need};
    region.any_scale = true;
    imaging::Image scaled;
    int used = 0;
    REQUIRE(d.DecodeJpegRegion(jpeg->data(), jpeg->size(), region, &scaled, {}, &used).ok());
    CHECK(used == n);
    CHECK(scaled.width >= need);
    CHECK(scaled.width <= (crop.width * uint32_t(n) + 7) / 8 + 1);
    imaging::ResizeInto(scaled.pixels.data(), scaled.width, scaled.height, 0, 3, got.data(), out,
                        out);
    const double mae = MeanAbsoluteError(got, want);
    INFO("scale " << n << "/8: mean absolute error " << mae);
    CHECK(mae < 2.5);
    // Without any_scale the same request is served by the next power of two.
    region.any_scale = false;
    REQUIRE(d.DecodeJpegRegion(jpeg->data(), jpeg->size(), region, &scaled, {}, &used).ok());
    CHECK(used == (n <= 2 ? 2 : n <= 4 ? 4 : 8));
  }
}

}  // namespace
}  // namespace shardfeed::reader
