#include <png.h>
#include <turbojpeg.h>

#include <cstring>

#include "shardfeed/imaging/image.h"

namespace shardfeed::imaging {

Result<std::vector<uint8_t>> EncodeJpeg(const Image& image, int quality) {
  if (quality < 1 || quality > 100)
    return Status::InvalidArgument("JPEG quality ", quality, " not in 1..100");
  if (image.channels != 3) return Status::InvalidArgument("EncodeJpeg takes RGB images");
  tjhandle tj = tjInitCompress();
  if (!tj) return Status::Internal("tjInitCompress: ", tjGetErrorStr2(nullptr));
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  int rc = tjCompress2(tj, image.pixels.data(), static_cast<int>(image.width), 0,
                       static_cast<int>(image.height), TJPF_RGB, &buf, &size, TJSAMP_420, quality,
                       TJFLAG_ACCURATEDCT);
  if (rc != 0) {
    std::string msg = tjGetErrorStr2(tj);
    tjDestroy(tj);
    if (buf) tjFree(buf);
    return Status::Internal("JPEG encode failed: ", msg);
  }
  std::vector<uint8_t> out(buf, buf + size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

Result<std::vector<uint8_t>> EncodePng(const Image& image) {
  png_image img;
  std::memset(&img, 0, sizeof(img));
  img.version = PNG_IMAGE_VERSION;
  img.width = image.width;
  img.height = image.height;
  img.format = image.channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&img, nullptr, &size, 0, image.pixels.data(), 0, nullptr)) {
    return Status::Internal("PNG encode failed: ", img.message);
  }
  std::vector<uint8_t> out(size);
  if (!png_image_write_to_memory(&img, out.data(), &size, 0, image.pixels.data(), 0, nullptr)) {
    return Status::Internal("PNG encode failed: ", img.message);
  }
  out.resize(size);
  return out;
}

}  // namespace shardfeed::imaging
