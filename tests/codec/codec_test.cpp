// The codec table (codec/codec.h): every encoding the format names has one codec, and each
// codec's operations agree with each other on real packed records.
#include "shardfeed/codec/codec.h"

#include <cstring>

#include "shardfeed/converter/pack.h"
#include "test_util.h"

namespace shardfeed::codec {
namespace {

TEST_CASE("every encoding has exactly its codec") {
  for (format::Encoding e :
       {format::Encoding::kJpeg, format::Encoding::kRaw, format::Encoding::kZstd}) {
    auto c = CodecFor(e);
    REQUIRE(c.ok());
    CHECK((*c)->encoding() == e);
    CHECK(std::string((*c)->description()).size() > 10);
    CHECK(std::string((*c)->file_extension()).front() == '.');
  }
  CHECK(CodecFor(static_cast<format::Encoding>(7)).status().code() == StatusCode::kCorrupt);
}

TEST_CASE("a codec's whole decode, crop decode, check and extract agree on its records") {
  for (format::Encoding enc :
       {format::Encoding::kJpeg, format::Encoding::kRaw, format::Encoding::kZstd}) {
    testing::TempDir dir;
    auto src = converter::ScanImageFolder(testing::SampleDir());
    REQUIRE(src.ok());
    converter::PackOptions po;
    po.encoding = enc;
    converter::PackResult result;
    REQUIRE(converter::Pack(*src, dir / "a", po, &result).ok());
    auto archive = format::Archive::Open(dir / "a");
    REQUIRE(archive.ok());
    const Codec& codec = **CodecFor(enc);
    Context ctx;
    imaging::Image whole;
    std::vector<uint8_t> file;
    for (uint64_t i = 0; i < (*archive)->size(); ++i) {
      INFO(format::EncodingName(enc) << " sample " << i);
      const format::RecordView r = (*archive)->At(i).ValueOrDie();
      REQUIRE(codec.Check(ctx, r, {}).ok());
      REQUIRE(codec.Decode(ctx, r, {}, true, &whole).ok());
      const bool swap = r.entry->orientation >= 5;
      CHECK(whole.width == (swap ? r.entry->height : r.entry->width));
      CHECK(whole.height == (swap ? r.entry->width : r.entry->height));
      // The whole image as a "crop", decoded at full scale: the same pixels.
      CropDecode how;
      how.out_width = whole.width;
      how.out_height = whole.height;
      Region region;
      REQUIRE(codec.DecodeCrop(ctx, r, {0, 0, whole.width, whole.height}, how, &region).ok());
      REQUIRE(region.width == whole.width);
      REQUIRE(region.height == whole.height);
      size_t differ = 0;
      for (uint32_t y = 0; y < region.height; ++y) {
        differ += std::memcmp(region.pixels + y * region.stride,
                              whole.pixels.data() + size_t{y} * whole.width * 3,
                              size_t{whole.width} * 3) != 0;
      }
      CHECK(differ == 0);
      // extract's file: a JPEG record's bytes as packed; a pixel record's pixels as a PNG that
      // decodes to exactly what Decode gives.
      REQUIRE(codec.ExtractFile(ctx, r, &file).ok());
      if (enc == format::Encoding::kJpeg) {
        CHECK(file == std::vector<uint8_t>(r.data, r.data + r.size));
      } else {
        imaging::Image png;
        REQUIRE(ctx.decoder.Decode(file.data(), file.size(), &png, {}).ok());
        CHECK(png.width == whole.width);
        CHECK(png.height == whole.height);
        CHECK(png.pixels == whole.pixels);
      }
    }
  }
}

}  // namespace
}  // namespace shardfeed::codec
