// shardfeed's entropy decoder (imaging/src/jpeg_huffman.h) against libjpeg-turbo's own, each
// inside the same libjpeg decompressor: every pixel equal at every DCT scale, whole, cropped and
// with rows skipped, for JPEGs of every sampling, colour space, table kind, quality and restart
// interval; and on damaged data (cut short, bytes changed, markers planted) the same outcome and
// pixels, with a warning wherever libjpeg warns (strict decodes must still fail), and no access
// outside the data (the sanitized runs).
#include <cstdio>
// clang-format off
#include <jpeglib.h>
// clang-format on

#include <filesystem>
#include <random>

#include "jpeg_errors.h"
#include "jpeg_huffman.h"
#include "jpeg_scale.h"
#include "jpeg_test_util.h"
#include "test_util.h"

namespace shardfeed::imaging {
namespace {

namespace fs = std::filesystem;

struct Decoded {
  bool ok = false;
  bool fast = false;  // whether shardfeed's decoder took the scan
  int warnings = 0;
  std::string message;  // the first warning or the error
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> pixels;
};

struct Way {
  int scale = 8;      // n of n/8
  bool crop = false;  // the middle third of the columns, the top quarter of the rows skipped
};

// Decodes `jpeg` the way `way` says, with shardfeed's entropy decoder or libjpeg's.
void Run(const std::vector<uint8_t>& jpeg, Way way, bool fast, Decoded* out) {
  jpeg_decompress_struct cinfo;
  JpegErrors err;
  err.Install(&cinfo, nullptr);
  jpeg_create_decompress(&cinfo);
  auto huffman = std::make_unique<internal::FastHuffman>();
  std::vector<uint8_t> row;
  if (setjmp(err.jump)) {
    out->ok = false;
    out->warnings = err.warnings;
    out->message = err.message;
    jpeg_destroy_decompress(&cinfo);
    return;
  }
  jpeg_mem_src(&cinfo, jpeg.data(), static_cast<unsigned long>(jpeg.size()));
  jpeg_read_header(&cinfo, TRUE);
  cinfo.scale_num = static_cast<unsigned>(way.scale);
  cinfo.scale_denom = 8;
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    cinfo.out_color_space = JCS_CMYK;
  }
  jpeg_start_decompress(&cinfo);
  out->fast = fast && huffman->Install(&cinfo);
  uint32_t skip = 0;
  if (way.crop && cinfo.output_width >= 3) {
    // As DecodeJpegRegion: files libjpeg-turbo 2.1 crops wrongly (4x2 luma at 3/8, 7/8) skip
    // rows only.
    bool across_x, across_y;
    if (internal::CropUpsampling(cinfo, &across_x, &across_y)) {
      JDIMENSION x = cinfo.output_width / 3, w = cinfo.output_width / 3;
      jpeg_crop_scanline(&cinfo, &x, &w);
    }
    skip = cinfo.output_height / 4;
    if (skip > 0) jpeg_skip_scanlines(&cinfo, skip);
  }
  const size_t row_bytes = size_t{cinfo.output_width} * cinfo.output_components;
  row.resize(row_bytes);
  out->width = cinfo.output_width;
  out->height = cinfo.output_height - skip;
  out->pixels.reserve(row_bytes * out->height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW rows[1] = {row.data()};
    if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) break;
    out->pixels.insert(out->pixels.end(), row.begin(), row.end());
  }
  if (way.crop) {
    jpeg_abort_decompress(&cinfo);
  } else {
    jpeg_finish_decompress(&cinfo);
  }
  out->ok = true;
  out->warnings = err.warnings;
  out->message = err.message;
  jpeg_destroy_decompress(&cinfo);
}

// Texture everywhere (gradients, hard edges, noise): every block has AC and DC energy.
std::vector<uint8_t> Pattern(uint32_t w, uint32_t h, int comps, uint32_t seed) {
  std::vector<uint8_t> px(size_t{w} * h * comps);
  std::mt19937 rng(seed);
  for (uint32_t y = 0; y < h; ++y) {
    for (uint32_t x = 0; x < w; ++x) {
      uint8_t* p = px.data() + (size_t{y} * w + x) * comps;
      const uint8_t v[4] = {static_cast<uint8_t>(x * 255 / w ^ (rng() & 31)),
                            static_cast<uint8_t>(((x / 13 + y / 7) & 1) ? 200 : 40),
                            static_cast<uint8_t>(y * 255 / h + (rng() & 63)),
                            static_cast<uint8_t>(rng() & 255)};
      for (int c = 0; c < comps; ++c) p[c] = v[c];
    }
  }
  return px;
}

struct Kind {
  uint32_t w, h;
  int comps;     // 1 gray, 3 YCbCr, 4 CMYK
  int h0, v0;    // luma (first component) sampling; the others 1 x 1
  int quality;   // 1-100
  bool optimal;  // optimised Huffman tables, else the standard ones
  int restart;   // MCUs a restart segment, 0 for none, -1 for one MCU row
};

std::vector<uint8_t> Encode(const Kind& k, uint32_t seed) {
  testing::LibjpegOptions o;
  o.quality = k.quality, o.h0 = k.h0, o.v0 = k.v0, o.optimal = k.optimal, o.restart = k.restart;
  return testing::EncodeLibjpeg(Pattern(k.w, k.h, k.comps, seed).data(), k.w, k.h, k.comps, o);
}

// Both decoders on `jpeg` in `way`: the same outcome, the same pixels (unless `pixels` is
// false), a warning from both or from neither (a strict decode accepts what it accepted), but
// for one named exception with `damaged`: "N extraneous bytes before marker" depends on how far
// each decoder had read ahead when a desynchronised segment ended (libjpeg reports the bytes
// its marker reader skips, not those in its bit buffer; ours buffers up to 63 bits, libjpeg up
// to 57-64 by another schedule). Returns whether ours took the scan.
bool Same(const std::vector<uint8_t>& jpeg, Way way, bool pixels = true, bool damaged = false) {
  Decoded theirs, ours;
  Run(jpeg, way, false, &theirs);
  Run(jpeg, way, true, &ours);
  INFO("scale " << way.scale << "/8, crop " << way.crop << "; libjpeg's: " << theirs.message
                << "; ours: " << ours.message);
  CHECK(ours.ok == theirs.ok);
  if (ours.ok && theirs.ok) {
    CHECK(ours.width == theirs.width);
    CHECK(ours.height == theirs.height);
    if (pixels) CHECK(ours.pixels == theirs.pixels);
  }
  if ((ours.warnings > 0) != (theirs.warnings > 0)) {
    const std::string& said = ours.warnings > 0 ? ours.message : theirs.message;
    CHECK((damaged && said.find("extraneous bytes before marker") != std::string::npos));
  }
  return ours.fast;
}

std::vector<Kind> Kinds() {
  std::vector<Kind> kinds;
  const uint32_t sizes[][2] = {{1, 1}, {8, 8}, {17, 9}, {203, 157}, {96, 250}};
  const int sampling[][2] = {{1, 1}, {2, 1}, {2, 2}, {1, 2}, {4, 1}, {4, 2}};
  const int qualities[] = {3, 50, 90, 100};
  const int restarts[] = {0, 1, 5, -1};
  std::mt19937 rng(7);
  for (int i = 0; i < 48; ++i) {
    Kind k{};
    const auto& size = sizes[rng() % 5];
    k.w = size[0], k.h = size[1];
    const int space = static_cast<int>(rng() % 6);
    k.comps = space == 0 ? 1 : space == 1 ? 4 : 3;
    const auto& s = sampling[k.comps == 1 ? 0 : rng() % (k.comps == 4 ? 4 : 6)];  // <= 10 blocks
    k.h0 = s[0], k.v0 = s[1];
    k.quality = qualities[rng() % 4];
    k.optimal = rng() % 2 == 0;
    k.restart = restarts[i % 4];
    kinds.push_back(k);
  }
  return kinds;
}

TEST_CASE("shardfeed's entropy decoder gives libjpeg's pixels, every sampling, scale, crop") {
  uint32_t seed = 1;
  int taken = 0;
  for (const Kind& k : Kinds()) {
    INFO(k.w << "x" << k.h << " comps " << k.comps << " sampling " << k.h0 << "x" << k.v0
             << " quality " << k.quality << " optimal " << k.optimal << " restart " << k.restart);
    const std::vector<uint8_t> jpeg = Encode(k, seed++);
    for (int scale : {1, 2, 3, 4, 6, 8}) {
      for (bool crop : {false, true}) taken += Same(jpeg, Way{scale, crop});
    }
  }
  CHECK(taken == 48 * 12);  // every one of these is a sequential Huffman scan
}

TEST_CASE("shardfeed's entropy decoder gives libjpeg's pixels for the sample files") {
  int files = 0, taken = 0;
  for (const char* dir : {"", "/../formats"}) {
    for (const auto& e : fs::recursive_directory_iterator(testing::SampleDir() + dir)) {
      if (!e.is_regular_file()) continue;
      const std::vector<uint8_t> bytes = testing::ReadBytes(e.path().string());
      if (bytes.size() < 3 || bytes[0] != 0xFF || bytes[1] != 0xD8) continue;
      INFO(e.path().string());
      ++files;
      for (int scale : {1, 4, 8}) taken += Same(bytes, Way{scale, scale == 4});
    }
  }
  CHECK(files >= 10);
  CHECK(taken >= files);  // progressive and arithmetic-coded files stay libjpeg's
}

TEST_CASE("shardfeed's entropy decoder: padding before the end marker, as its rule says") {
  // A few bytes between the last MCU and EOI (some writers pad): libjpeg-turbo passes one or
  // two silently, so pack's strict validation took such files; the first version of ours warned
  // of "extraneous bytes" and a strict decode refused them. Ours: under 4 bytes pass, 4 or more
  // are reported (libjpeg's own threshold moves with its read-ahead; see EndOfSegment).
  const Kind kinds[] = {{203, 157, 3, 2, 2, 90, false, 0},
                        {160, 120, 3, 1, 1, 80, true, 4},
                        {96, 250, 1, 1, 1, 50, true, 0}};
  uint32_t seed = 300;
  for (const Kind& k : kinds) {
    const std::vector<uint8_t> jpeg = Encode(k, seed++);
    for (size_t pad = 1; pad <= 8; ++pad) {
      std::vector<uint8_t> padded(jpeg.begin(), jpeg.end() - 2);
      padded.insert(padded.end(), pad, uint8_t{0x5A});
      padded.insert(padded.end(), {0xFF, 0xD9});
      INFO("kind " << &k - kinds << ", " << pad << " bytes before EOI");
      Decoded ours;
      Run(padded, Way{8, false}, true, &ours);
      CHECK(ours.ok);
      if (pad < 4) {
        CHECK(ours.warnings == 0);
      } else {
        CHECK(ours.message.find(std::to_string(pad) + " extraneous bytes before marker 0xd9") !=
              std::string::npos);
      }
      // libjpeg's own warning here depends on its read-ahead (it warns of some 6-byte paddings).
      Same(padded, Way{8, false}, true, true);
      Same(padded, Way{4, true}, true, true);
    }
  }
}

TEST_CASE("shardfeed's entropy decoder on damaged JPEGs: libjpeg's outcome and warnings") {
  std::mt19937 rng(11);
  const Kind kinds[] = {{203, 157, 3, 2, 2, 90, false, 0},
                        {203, 157, 3, 2, 2, 90, true, 4},
                        {96, 250, 1, 1, 1, 50, true, -1},
                        {160, 120, 3, 1, 1, 100, false, 1},
                        {64, 64, 4, 1, 1, 75, true, 0}};
  uint32_t seed = 100;
  for (const Kind& k : kinds) {
    const std::vector<uint8_t> jpeg = Encode(k, seed++);
    size_t sos = 0;  // the entropy-coded data starts after the SOS segment
    for (size_t i = 2; i + 3 < jpeg.size(); ++i) {
      if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xDA) {
        sos = i + 2 + (size_t{jpeg[i + 2]} << 8 | jpeg[i + 3]);
        break;
      }
    }
    REQUIRE(sos > 0);
    const size_t data = jpeg.size() - 2 - sos;
    for (int t = 0; t < 200; ++t) {
      std::vector<uint8_t> bad = jpeg;
      const size_t at = sos + rng() % data;
      const int what = t % 5;
      INFO("kind " << &k - kinds << ", damage " << what << " at " << at);
      if (what == 0) {
        bad.resize(at);  // cut short
      } else if (what == 1) {
        bad.resize(at);  // cut short, then the end-of-image marker
        bad.insert(bad.end(), {0xFF, 0xD9});
      } else if (what == 2) {
        bad[at] ^= static_cast<uint8_t>(1u << (rng() % 8));  // a bit flipped
      } else if (what == 3) {
        for (int i = 0; i < 8; ++i) bad[sos + rng() % data] = static_cast<uint8_t>(rng());
      } else {
        const uint8_t marker = static_cast<uint8_t>(0xD0 + rng() % 10);  // RST0-7, SOI, EOI
        bad.insert(bad.begin() + static_cast<std::ptrdiff_t>(at), {0xFF, marker});
      }
      // FF FF 00 (fill bytes before a stuffed zero, which T.81 does not allow) is an FF data byte
      // to both decoders, but libjpeg-turbo's fast path first decodes the MCU as if a marker were
      // there and keeps the coefficients that decode wrote where its second, right decode writes
      // none: its pixels for that MCU are neither decode's. Ours are the right decode's.
      bool fill = false;
      for (size_t i = sos; i + 1 < bad.size(); ++i) fill |= bad[i] == 0xFF && bad[i + 1] == 0xFF;
      for (int scale : {2, 8}) Same(bad, Way{scale, t % 2 == 1}, !fill, true);
    }
  }
}

}  // namespace
}  // namespace shardfeed::imaging
