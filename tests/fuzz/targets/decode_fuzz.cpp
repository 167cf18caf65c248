// libFuzzer target: the image decoders pack uses (JPEG probe and decode, PNG, WebP, BMP/GIF/PNM/
// PSD/TGA through stb, TIFF, HEIF/AVIF), as pack calls them: sniff, probe, decode with limits,
// and a cropped, DCT-scaled JPEG decode as the reader does.
#include <cstdint>

#include "shardfeed/imaging/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardfeed::imaging;
  Limits limits;
  limits.max_pixels = uint64_t{4} << 20;  // keep each input fast
  Decoder decoder;
  Image image;
  (void)decoder.Decode(data, size, &image, limits, /*strict=*/true);
  auto info = ProbeJpeg(data, size, /*check_end=*/true, limits);
  if (info.ok() && info->width > 2 && info->height > 2) {
    JpegRegion region{1, 1, info->width / 2, info->height / 2, 8, 8};
    (void)decoder.DecodeJpegRegion(data, size, region, &image, limits);
  }
  return 0;
}
