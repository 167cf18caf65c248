// Indexed JPEG records (pack --jpeg-layout indexed): the re-layout is lossless (pixels bit for
// bit those of the source file), the region index matches the bitstream and verify notices when it
// does not, and a crop decoded from the restart segments it overlaps equals the same crop of a
// full decode at the same DCT scale.
#include <turbojpeg.h>
// clang-format off
#include <cstdio>
#include <jpeglib.h>
// clang-format on
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "jpeg_test_util.h"
#include "shardfeed/codec/codec.h"
#include "test_util.h"

namespace shardfeed::codec {
namespace {

namespace fs = std::filesystem;

// Texture everywhere (gradients, hard edges, noise) so every block has AC and DC energy.
imaging::Image Pattern(uint32_t w, uint32_t h, uint32_t seed) {
  imaging::Image img;
  img.Resize(w, h, 3);
  std::mt19937 rng(seed);
  for (uint32_t y = 0; y < h; ++y) {
    for (uint32_t x = 0; x < w; ++x) {
      uint8_t* p = img.pixels.data() + (size_t{y} * w + x) * 3;
      p[0] = static_cast<uint8_t>(x * 255 / w ^ (rng() & 31));
      p[1] = static_cast<uint8_t>(((x / 13 + y / 7) & 1) ? 200 : 40);
      p[2] = static_cast<uint8_t>(y * 255 / h + (rng() & 63));
    }
  }
  return img;
}

std::vector<uint8_t> Encode(const imaging::Image& img, int subsamp, bool progressive) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  const int flags = progressive ? TJFLAG_PROGRESSIVE : 0;
  REQUIRE(tjCompress2(tj, img.pixels.data(), static_cast<int>(img.width), 0,
                      static_cast<int>(img.height), TJPF_RGB, &buf, &len, subsamp, 88, flags) == 0);
  std::vector<uint8_t> out(buf, buf + len);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

// A baseline JPEG with luma sampled h x v and both chroma components 1 x 1 (sampling TurboJPEG
// does not offer, e.g. 4x2), through the libjpeg API.
std::vector<uint8_t> EncodeSampled(const imaging::Image& img, int h, int v) {
  testing::LibjpegOptions o;
  o.h0 = h, o.v0 = v;
  return testing::EncodeLibjpeg(img.pixels.data(), img.width, img.height, 3, o);
}

// The JPEG with an EXIF APP1 holding `orientation`, right after SOI.
std::vector<uint8_t> WithExif(const std::vector<uint8_t>& jpeg, int orientation) {
  const uint8_t app1[] = {0xFF,
                          0xE1,
                          0,
                          34,
                          'E',
                          'x',
                          'i',
                          'f',
                          0,
                          0,
                          'I',
                          'I',
                          42,
                          0,
                          8,
                          0,
                          0,
                          0,  // TIFF header, IFD at 8
                          1,
                          0,  // one entry
                          0x12,
                          0x01,
                          3,
                          0,
                          1,
                          0,
                          0,
                          0,  // Orientation, SHORT, count 1
                          static_cast<uint8_t>(orientation),
                          0,
                          0,
                          0,
                          0,
                          0,
                          0,
                          0};
  std::vector<uint8_t> out(jpeg.begin(), jpeg.begin() + 2);
  out.insert(out.end(), app1, app1 + sizeof(app1));
  out.insert(out.end(), jpeg.begin() + 2, jpeg.end());
  return out;
}

// A full decode at scale n/8 through libjpeg's own API (the reference: not our code), with its
// defaults (fancy upsampling, the accurate integer IDCT), as TurboJPEG and our decoder use them.
imaging::Image Reference(const uint8_t* jpeg, size_t size, int n) {
  jpeg_decompress_struct d;
  jpeg_error_mgr err;
  d.err = jpeg_std_error(&err);
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, jpeg, static_cast<unsigned long>(size));
  REQUIRE(jpeg_read_header(&d, TRUE) == JPEG_HEADER_OK);
  d.scale_num = static_cast<unsigned>(n), d.scale_denom = 8, d.out_color_space = JCS_RGB;
  jpeg_start_decompress(&d);
  imaging::Image out;
  out.Resize(d.output_width, d.output_height, 3);
  while (d.output_scanline < d.output_height) {
    JSAMPROW row = out.pixels.data() + size_t{d.output_scanline} * out.width * 3;
    REQUIRE(jpeg_read_scanlines(&d, &row, 1) == 1);
  }
  jpeg_finish_decompress(&d);
  jpeg_destroy_decompress(&d);
  return out;
}

struct Record {
  std::vector<uint8_t> payload;
  format::IndexEntry entry{};
  format::RecordView view() const { return {payload.data(), payload.size(), &entry}; }
};

Record Pack(const std::vector<uint8_t>& file, bool indexed) {
  const Codec& codec = **CodecFor(format::Encoding::kJpeg);
  Context ctx;
  EncodeOptions o;
  o.jpeg_indexed = indexed;
  imaging::Bytes payload(file.begin(), file.end());
  Record r;
  bool resized = false;
  REQUIRE(codec.Encode(ctx, o, &payload, &r.entry, &resized).ok());
  r.entry.encoding = static_cast<uint8_t>(format::Encoding::kJpeg);
  r.payload.assign(payload.begin(), payload.end());
  return r;
}

size_t DifferingRows(const Region& a, const imaging::Image& b) {
  size_t differ = 0;
  if (a.width != b.width || a.height != b.height) return ~size_t{0};
  for (uint32_t y = 0; y < a.height; ++y) {
    differ += std::memcmp(a.pixels + y * a.stride, b.pixels.data() + size_t{y} * b.width * 3,
                          size_t{b.width} * 3) != 0;
  }
  return differ;
}

// The DCT scale the reader picks for a stored region and an output size (imaging/image.h).
int ScaleFor(uint32_t rw, uint32_t rh, uint32_t min_w, uint32_t min_h) {
  for (int n : {1, 2, 4}) {
    if ((uint64_t{rw} * n + 7) / 8 >= min_w && (uint64_t{rh} * n + 7) / 8 >= min_h) return n;
  }
  return 8;
}

// Many random crops of `file`, decoded from its indexed record, against a full decode + crop.
void CheckCrops(const std::vector<uint8_t>& file, int orientation, uint32_t seed) {
  const Record indexed = Pack(file, true), original = Pack(file, false);
  REQUIRE((indexed.entry.flags & format::kFlagJpegIndexed) != 0);
  const Codec& codec = **CodecFor(format::Encoding::kJpeg);
  Context ctx;
  REQUIRE(codec.Check(ctx, indexed.view(), {}).ok());
  const uint32_t sw = indexed.entry.width, sh = indexed.entry.height;
  const bool swap = orientation >= 5;
  const uint32_t dw = swap ? sh : sw, dh = swap ? sw : sh;
  std::mt19937 rng(seed);
  size_t synthetic = 0;
  for (int i = 0; i < 84; ++i) {
    CropRect rect;
    const uint32_t kind = i % 6;  // a corner, an edge, or anywhere; tiny to nearly whole
    rect.width = 1 + rng() % (kind == 5 ? dw : std::max<uint32_t>(1, dw / 2));
    rect.height = 1 + rng() % (kind == 5 ? dh : std::max<uint32_t>(1, dh / 2));
    if (i >= 60) rect.width = 1 + rng() % 3, rect.height = 1 + rng() % 3;  // 1-3 px, any edge
    rect.x = kind == 0 ? 0 : kind == 1 ? dw - rect.width : rng() % (dw - rect.width + 1);
    rect.y = kind == 2 ? 0 : kind == 3 ? dh - rect.height : rng() % (dh - rect.height + 1);
    CropDecode how;
    how.out_width = 1 + rng() % 224;
    how.out_height = 1 + rng() % 224;
    const CropRect s = StoredRect(rect, orientation, sw, sh);
    const int n = ScaleFor(s.width, s.height, swap ? how.out_height : how.out_width,
                           swap ? how.out_width : how.out_height);
    const imaging::Image full = Reference(file.data(), file.size(), n);
    const uint32_t x0 = static_cast<uint32_t>(uint64_t{s.x} * n / 8);
    const uint32_t y0 = static_cast<uint32_t>(uint64_t{s.y} * n / 8);
    const uint32_t x1 = std::min<uint32_t>(
        full.width, static_cast<uint32_t>((uint64_t{s.x + s.width} * n + 7) / 8));
    const uint32_t y1 = std::min<uint32_t>(
        full.height, static_cast<uint32_t>((uint64_t{s.y + s.height} * n + 7) / 8));
    imaging::Image want;
    want.Resize(x1 - x0, y1 - y0, 3);
    for (uint32_t y = y0; y < y1; ++y) {
      std::memcpy(want.pixels.data() + size_t{y - y0} * want.width * 3,
                  full.pixels.data() + (size_t{y} * full.width + x0) * 3, size_t{want.width} * 3);
    }
    imaging::ApplyOrientation(&want, orientation);
    Region got;
    INFO("crop " << rect.width << "x" << rect.height << "+" << rect.x << "+" << rect.y << " scale "
                 << n << "/8 of " << sw << "x" << sh << " orientation " << orientation);
    ctx.jpeg.clear();
    REQUIRE(codec.DecodeCrop(ctx, indexed.view(), rect, how, &got).ok());
    // Exact whichever way it was decoded: from its restart segments alone, or (nearly every MCU
    // needed) from the stored JPEG; and so is the original layout's crop.
    synthetic += !ctx.jpeg.empty();
    CHECK(DifferingRows(got, want) == 0);
    Context other;
    Region from_original;
    REQUIRE(codec.DecodeCrop(other, original.view(), rect, how, &from_original).ok());
    CHECK(DifferingRows(from_original, want) == 0);
  }
  CHECK(synthetic >= 20);  // most crops were decoded from their restart segments alone
}

TEST_CASE("an indexed record decodes to the source file's pixels, bit for bit") {
  std::vector<std::string> files;
  for (const char* dir : {"", "/../formats"}) {
    const std::string base = testing::SampleDir() + dir;
    for (const auto& e : fs::recursive_directory_iterator(base)) {
      if (!e.is_regular_file()) continue;
      std::vector<uint8_t> head = testing::ReadBytes(e.path().string());
      if (head.size() > 3 && head[0] == 0xFF && head[1] == 0xD8) {
        files.push_back(e.path().string());
      }
    }
  }
  REQUIRE(files.size() >= 10);
  const Codec& codec = **CodecFor(format::Encoding::kJpeg);
  Context ctx;
  size_t indexed_count = 0;
  for (const std::string& path : files) {
    INFO(path);
    const std::vector<uint8_t> file = testing::ReadBytes(path);
    const Record original = Pack(file, false), indexed = Pack(file, true);
    indexed_count += (indexed.entry.flags & format::kFlagJpegIndexed) != 0;
    imaging::Image a, b;
    const Status sa = codec.Decode(ctx, original.view(), {}, false, &a);
    if (!sa.ok()) continue;  // a damaged file is not this test's business
    REQUIRE(codec.Decode(ctx, indexed.view(), {}, false, &b).ok());
    CHECK(a.width == b.width);
    CHECK(a.height == b.height);
    CHECK(a.pixels == b.pixels);
    CHECK(indexed.entry.orientation == original.entry.orientation);
    CHECK(indexed.entry.flags == (original.entry.flags | (indexed.entry.flags & 2)));
    std::vector<uint8_t> extracted;
    REQUIRE(codec.ExtractFile(ctx, indexed.view(), &extracted).ok());
    CHECK(extracted.size() < indexed.payload.size());  // the JPEG alone, no index
  }
  CHECK(indexed_count >= files.size() * 3 / 4);
}

TEST_CASE("region decode of an indexed record equals full decode + crop, every subsampling") {
  struct Case {
    int subsamp;
    bool progressive;
    uint32_t w, h;
  };
  const Case cases[] = {{TJSAMP_420, false, 203, 157}, {TJSAMP_444, false, 160, 120},
                        {TJSAMP_422, true, 317, 96},   {TJSAMP_GRAY, false, 131, 245},
                        {TJSAMP_440, false, 96, 200},  {TJSAMP_420, true, 64, 48},
                        {TJSAMP_411, false, 250, 66}};
  uint32_t seed = 1;
  for (const Case& c : cases) {
    const std::vector<uint8_t> jpeg = Encode(Pattern(c.w, c.h, seed), c.subsamp, c.progressive);
    CheckCrops(jpeg, 1, seed++);
  }
}

TEST_CASE("region decode equals full decode + crop for unusual sampling factors") {
  // Chroma scaled up in the IDCT yet still upsampled 2x (4x2 at 4/8 and below): libjpeg-turbo
  // 2.1's jpeg_crop_scanline gives such a component half its width.
  uint32_t seed = 200;
  for (const auto& hv : {std::pair{4, 2}, std::pair{2, 4}, std::pair{4, 1}}) {
    INFO("luma sampled " << hv.first << "x" << hv.second);
    CheckCrops(EncodeSampled(Pattern(301, 203, seed), hv.first, hv.second), 1, seed);
    ++seed;
  }
}

TEST_CASE("region decode of an EXIF-rotated indexed record equals full decode + crop") {
  const std::vector<uint8_t> jpeg = Encode(Pattern(221, 149, 7), TJSAMP_420, false);
  for (int orientation = 2; orientation <= 8; ++orientation) {
    CheckCrops(WithExif(jpeg, orientation), orientation, 100 + orientation);
  }
}

TEST_CASE("verify --decode finds a region index that disagrees with the bitstream") {
  const Record good = Pack(Encode(Pattern(300, 200, 3), TJSAMP_420, false), true);
  const Codec& codec = **CodecFor(format::Encoding::kJpeg);
  Context ctx;
  REQUIRE(codec.Check(ctx, good.view(), {}).ok());
  format::JpegRegionIndex t;
  std::memcpy(&t, good.payload.data() + good.payload.size() - sizeof(t), sizeof(t));
  REQUIRE(t.mcu_rows >= 3);
  uint8_t* row2 = const_cast<uint8_t*>(good.payload.data()) + t.jpeg_size + 8;
  uint32_t offset;
  std::memcpy(&offset, row2, 4);
  SECTION("a row offset moved, its checksum recomputed") {
    Record bad = good;
    offset += 1;
    std::memcpy(bad.payload.data() + t.jpeg_size + 8, &offset, 4);
    t.table_checksum = static_cast<uint32_t>(
        XXH3_64bits(bad.payload.data() + t.jpeg_size, size_t{t.mcu_rows} * 4));
    std::memcpy(bad.payload.data() + bad.payload.size() - sizeof(t), &t, sizeof(t));
    const Status s = codec.Check(ctx, bad.view(), {});
    CHECK(s.code() == StatusCode::kCorrupt);
    CHECK(s.message().find("MCU row 2") != std::string::npos);
    Region region;
    CropDecode how;
    how.out_width = how.out_height = 16;
    // The region decode checks each row it enters: no crash, an error naming the index.
    const Status d = codec.DecodeCrop(ctx, bad.view(), {100, 20, 40, 40}, how, &region);
    CHECK(d.code() == StatusCode::kCorrupt);
  }
  SECTION("a row offset changed without its checksum") {
    Record bad = good;
    bad.payload[t.jpeg_size + 8] ^= 1;
    CHECK(codec.Check(ctx, bad.view(), {}).code() == StatusCode::kCorrupt);
  }
  SECTION("a restart marker renumbered in the bitstream") {
    Record bad = good;
    bad.payload[offset - 1] ^= 1;  // RSTn -> RSTn^1
    CHECK(codec.Check(ctx, bad.view(), {}).code() == StatusCode::kCorrupt);
  }
}

}  // namespace
}  // namespace shardfeed::codec
