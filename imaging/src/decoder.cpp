// Decoding with explicit per-thread contexts: libjpeg(-turbo) for JPEG (scaled and cropped
// decoding), libpng for PNG, libwebp for WebP, stb_image for BMP/GIF/TGA/PNM.
#include <cstddef>
#include <cstdio>
// clang-format off
#include <jpeglib.h>
// clang-format on
#include <libheif/heif.h>
#include <png.h>
#include <stb/stb_image.h>
#include <tiffio.h>
#include <webp/decode.h>
#include <webp/demux.h>

#include <algorithm>
#include <csetjmp>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "jpeg_errors.h"
#include "jpeg_huffman.h"
#include "jpeg_scale.h"
#include "shardfeed/imaging/image.h"
#include "stb_checks.h"

namespace shardfeed::imaging {

const char* ImageFormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kBmp:
      return "BMP";
    case ImageFormat::kGif:
      return "GIF";
    case ImageFormat::kTiff:
      return "TIFF";
    case ImageFormat::kHeif:
      return "HEIF/AVIF";
    case ImageFormat::kStbOther:
      return "TGA/PNM/PSD";
    case ImageFormat::kUnknown:
      break;
  }
  return "unknown";
}

ImageFormat SniffFormat(const uint8_t* d, size_t n) {
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return ImageFormat::kJpeg;
  if (n >= 8 && std::memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0) return ImageFormat::kPng;
  if (n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0) {
    return ImageFormat::kWebp;
  }
  if (n >= 2 && d[0] == 'B' && d[1] == 'M') return ImageFormat::kBmp;
  if (n >= 6 && (std::memcmp(d, "GIF87a", 6) == 0 || std::memcmp(d, "GIF89a", 6) == 0)) {
    return ImageFormat::kGif;
  }
  if (n >= 4 && (std::memcmp(d, "II*\0", 4) == 0 || std::memcmp(d, "MM\0*", 4) == 0)) {
    return ImageFormat::kTiff;
  }
  if (n >= 12 && std::memcmp(d + 4, "ftyp", 4) == 0) {
    // ISO-BMFF: an image only for the HEIF/AVIF brands (MP4 and MOV videos share the box).
    for (const char* brand :
         {"heic", "heix", "heim", "heis", "hevc", "hevx", "mif1", "msf1", "avif", "avis"}) {
      if (std::memcmp(d + 8, brand, 4) == 0) return ImageFormat::kHeif;
    }
    return ImageFormat::kUnknown;
  }
  if (n >= 4 && std::memcmp(d, "8BPS", 4) == 0) return ImageFormat::kStbOther;
  if (n >= 3 && d[0] == 'P' && d[1] >= '1' && d[1] <= '6' &&
      (d[2] == '\n' || d[2] == ' ' || d[2] == '\r' || d[2] == '\t')) {
    return ImageFormat::kStbOther;
  }
  return ImageFormat::kUnknown;
}

namespace {

inline uint8_t Mul255(unsigned a, unsigned b) { return static_cast<uint8_t>((a * b + 127) / 255); }

// Converts a CMYK row to RGB. Adobe files hold inverted values (255 = no ink).
void CmykToRgb(const uint8_t* in, uint8_t* out, size_t pixels, bool inverted) {
  for (size_t i = 0; i < pixels; ++i, in += 4, out += 3) {
    unsigned c = in[0], m = in[1], y = in[2], k = in[3];
    if (!inverted) c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
    out[0] = Mul255(c, k);
    out[1] = Mul255(m, k);
    out[2] = Mul255(y, k);
  }
}

void CompositeOverWhite(const uint8_t* rgba, size_t pixels, uint8_t* rgb) {
  for (size_t i = 0; i < pixels; ++i, rgba += 4, rgb += 3) {
    unsigned a = rgba[3];
    for (int c = 0; c < 3; ++c)
      rgb[c] = static_cast<uint8_t>((rgba[c] * a + 255 * (255 - a) + 127) / 255);
  }
}

Status CheckPixels(uint64_t w, uint64_t h, const Limits& limits) {
  if (w == 0 || h == 0) return Status::Corrupt("image has zero size");
  if (w * h > limits.max_pixels) {
    return Status::ResourceExhausted("image of ", w, "x", h, " exceeds the limit of ",
                                     limits.max_pixels, " pixels");
  }
  if (w > 65535 || h > 65535) {
    return Status::Unsupported("image of ", w, "x", h, " has a side over 65535 pixels");
  }
  return Status::OK();
}

// libtiff reads from a file-like object; this one is a byte range in memory.
struct MemoryTiff {
  const uint8_t* data;
  size_t size;
  size_t pos;
};

tsize_t TiffRead(thandle_t h, tdata_t buf, tsize_t n) {
  auto* m = static_cast<MemoryTiff*>(h);
  size_t k = std::min<size_t>(static_cast<size_t>(n), m->size - m->pos);
  std::memcpy(buf, m->data + m->pos, k);
  m->pos += k;
  return static_cast<tsize_t>(k);
}
tsize_t TiffWrite(thandle_t, tdata_t, tsize_t) { return -1; }
toff_t TiffSeek(thandle_t h, toff_t off, int whence) {
  auto* m = static_cast<MemoryTiff*>(h);
  uint64_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? m->pos : m->size;
  uint64_t target = base + off;
  if (target > m->size) return static_cast<toff_t>(-1);
  m->pos = static_cast<size_t>(target);
  return m->pos;
}
int TiffClose(thandle_t) { return 0; }
toff_t TiffSize(thandle_t h) { return static_cast<MemoryTiff*>(h)->size; }
int TiffMap(thandle_t h, tdata_t* base, toff_t* size) {
  auto* m = static_cast<MemoryTiff*>(h);
  *base = const_cast<uint8_t*>(m->data);
  *size = m->size;
  return 1;
}
void TiffUnmap(thandle_t, tdata_t, toff_t) {}

// TIFF in any of its photometric forms (gray, palette, RGB, CMYK, YCbCr, 16-bit), first page,
// through libtiff's RGBA interface; alpha composited over white.
Status DecodeTiff(const uint8_t* data, size_t size, Image* out, const Limits& limits) {
  static std::once_flag quiet;
  std::call_once(quiet, [] {
    TIFFSetErrorHandler(nullptr);  // reasons are reported through Status, not stderr
    TIFFSetWarningHandler(nullptr);
  });
  MemoryTiff mem{data, size, 0};
  TIFF* tif = TIFFClientOpen("memory", "rm", &mem, TiffRead, TiffWrite, TiffSeek, TiffClose,
                             TiffSize, TiffMap, TiffUnmap);
  if (!tif) return Status::Corrupt("TIFF header unreadable");
  std::unique_ptr<TIFF, void (*)(TIFF*)> guard(tif, TIFFClose);
  uint32_t w = 0, h = 0;
  TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &w);
  TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &h);
  SF_RETURN_IF_ERROR(CheckPixels(w, h, limits));
  std::vector<uint32_t> raster(size_t{w} * h);
  if (!TIFFReadRGBAImageOriented(tif, w, h, raster.data(), ORIENTATION_TOPLEFT, 0)) {
    return Status::Corrupt("TIFF decode failed");
  }
  out->Resize(w, h, 3);
  uint8_t* dst = out->pixels.data();
  for (size_t i = 0; i < raster.size(); ++i, dst += 3) {
    uint32_t p = raster[i];
    unsigned a = TIFFGetA(p);
    // libtiff's RGBA is premultiplied by alpha: compositing over white adds (255 - a).
    dst[0] = static_cast<uint8_t>(std::min(255u, TIFFGetR(p) + 255 - a));
    dst[1] = static_cast<uint8_t>(std::min(255u, TIFFGetG(p) + 255 - a));
    dst[2] = static_cast<uint8_t>(std::min(255u, TIFFGetB(p) + 255 - a));
  }
  return Status::OK();
}

// PNG through libpng's full API, as Pillow and OpenCV read it: the stored values, no gamma or
// colour-space conversion (libpng's simplified API took 16-bit samples and files with a gAMA
// chunk as linear light and re-encoded them to sRGB: a 16-bit gray 64*257 came out 136), 16-bit
// samples reduced to their high byte, palette and gray expanded to RGB, transparency
// (alpha or tRNS) composited over white.
struct PngSource {
  const uint8_t* data;
  size_t size;
  size_t pos = 0;
  char message[160] = "";
};

void PngReadBytes(png_structp png, png_bytep out, size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > src->size - src->pos) png_error(png, "the file ends early (truncated)");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

[[noreturn]] void PngFail(png_structp png, png_const_charp message) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->message, sizeof(src->message), "%s", message);
  png_longjmp(png, 1);
}

void PngWarn(png_structp, png_const_charp) {}

// The part libpng may longjmp out of: only trivially destructible locals here (the pixels go to
// `out` and `rgba`, owned by the caller). Returns false with src->message set on failure; a size
// over the limits is *limit.
bool ReadPng(png_structp png, png_infop info, PngSource* src, const Limits& limits, Image* out,
             std::vector<uint8_t>* rgba, std::vector<png_bytep>* rows, Status* limit) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_read_fn(png, src, PngReadBytes);
  png_read_info(png, info);
  const uint32_t w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  *limit = CheckPixels(w, h, limits);
  if (!limit->ok()) return true;
  const int color = png_get_color_type(png, info);
  png_set_expand(png);  // palette -> RGB, gray below 8 bits -> 8, tRNS -> alpha
  if (png_get_bit_depth(png, info) == 16) png_set_strip_16(png);
  if (!(color & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t channels = png_get_channels(png, info);
  if ((channels != 3 && channels != 4) || png_get_rowbytes(png, info) != size_t{w} * channels) {
    png_error(png, "unexpected row layout after expansion");
  }
  out->Resize(w, h, 3);
  if (channels == 4) rgba->resize(size_t{w} * h * 4);
  rows->resize(h);
  for (uint32_t y = 0; y < h; ++y) {
    (*rows)[y] =
        channels == 4 ? rgba->data() + size_t{y} * w * 4 : out->pixels.data() + size_t{y} * w * 3;
  }
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  return true;
}

// A libpng reader over `data` for `read(png, info, src, limit)` (ReadPng or ReadPngSamples: only
// trivially destructible locals, as libpng may longjmp out of it): the structs made and freed
// here, a failed read kCorrupt with libpng's message, a size over the limits its error.
template <typename Read>
Status WithPngReader(const uint8_t* data, size_t size, const Read& read) {
  PngSource src{data, size};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, PngFail, PngWarn);
  if (!png) return Status::ResourceExhausted("PNG: cannot allocate a decoder");
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return Status::ResourceExhausted("PNG: cannot allocate a decoder");
  }
  png_set_user_limits(png, 65535, 65535);  // CheckPixels says which limit; this bounds libpng
  png_set_crc_action(png, PNG_CRC_DEFAULT, PNG_CRC_WARN_DISCARD);
  Status limit;
  const bool read_ok = read(png, info, &src, &limit);
  png_destroy_read_struct(&png, &info, nullptr);
  if (!read_ok) return Status::Corrupt("PNG decode failed: ", src.message);
  return limit;
}

Status DecodePng(const uint8_t* data, size_t size, Image* out, const Limits& limits) {
  std::vector<uint8_t> rgba;
  std::vector<png_bytep> rows;
  SF_RETURN_IF_ERROR(WithPngReader(
      data, size, [&](png_structp png, png_infop info, PngSource* src, Status* limit) {
        return ReadPng(png, info, src, limits, out, &rgba, &rows, limit);
      }));
  if (!rgba.empty()) CompositeOverWhite(rgba.data(), rgba.size() / 4, out->pixels.data());
  return Status::OK();
}

// ReadPng for DecodePngSamples: the stored samples, unpacked to a byte each below 8 bits (values
// kept, not scaled), 16-bit ones as two big-endian bytes, palette indices not expanded.
bool ReadPngSamples(png_structp png, png_infop info, PngSource* src, const Limits& limits,
                    PngSamples* out, std::vector<uint8_t>* raw, std::vector<png_bytep>* rows,
                    Status* limit) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_read_fn(png, src, PngReadBytes);
  png_read_info(png, info);
  const uint32_t w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  *limit = CheckPixels(w, h, limits);
  if (!limit->ok()) return true;
  const int depth = png_get_bit_depth(png, info);
  if (depth < 8) png_set_packing(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t channels = png_get_channels(png, info), bytes = depth == 16 ? 2 : 1;
  if (png_get_rowbytes(png, info) != size_t{w} * channels * bytes) {
    png_error(png, "unexpected row layout after unpacking");
  }
  out->width = w, out->height = h, out->channels = static_cast<uint32_t>(channels);
  out->bit_depth = depth;
  out->palette = png_get_color_type(png, info) == PNG_COLOR_TYPE_PALETTE;
  raw->resize(size_t{w} * h * channels * bytes);
  rows->resize(h);
  for (uint32_t y = 0; y < h; ++y) (*rows)[y] = raw->data() + size_t{y} * w * channels * bytes;
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  return true;
}

// HEIF/HEIC (phone photos) and AVIF through libheif: the primary image, its rotation and
// mirroring applied, alpha composited over white.
Status DecodeHeif(const uint8_t* data, size_t size, Image* out, const Limits& limits) {
  std::unique_ptr<heif_context, void (*)(heif_context*)> ctx(heif_context_alloc(),
                                                             heif_context_free);
  heif_error err = heif_context_read_from_memory_without_copy(ctx.get(), data, size, nullptr);
  if (err.code != heif_error_Ok) return Status::Corrupt("HEIF: ", err.message);
  heif_image_handle* handle_raw = nullptr;
  err = heif_context_get_primary_image_handle(ctx.get(), &handle_raw);
  if (err.code != heif_error_Ok) return Status::Corrupt("HEIF: ", err.message);
  std::unique_ptr<heif_image_handle, void (*)(const heif_image_handle*)> handle(
      handle_raw, heif_image_handle_release);
  const int w = heif_image_handle_get_width(handle.get());
  const int h = heif_image_handle_get_height(handle.get());
  SF_RETURN_IF_ERROR(CheckPixels(static_cast<uint64_t>(std::max(w, 0)),
                                 static_cast<uint64_t>(std::max(h, 0)), limits));
  const bool alpha = heif_image_handle_has_alpha_channel(handle.get());
  heif_image* img_raw = nullptr;
  err = heif_decode_image(handle.get(), &img_raw, heif_colorspace_RGB,
                          alpha ? heif_chroma_interleaved_RGBA : heif_chroma_interleaved_RGB,
                          nullptr);
  if (err.code != heif_error_Ok) return Status::Corrupt("HEIF decode failed: ", err.message);
  std::unique_ptr<heif_image, void (*)(const heif_image*)> img(img_raw, heif_image_release);
  int stride = 0;
  const uint8_t* plane =
      heif_image_get_plane_readonly(img.get(), heif_channel_interleaved, &stride);
  const int iw = heif_image_get_width(img.get(), heif_channel_interleaved);
  const int ih = heif_image_get_height(img.get(), heif_channel_interleaved);
  if (!plane || iw <= 0 || ih <= 0) return Status::Corrupt("HEIF decode gave no pixels");
  out->Resize(static_cast<uint32_t>(iw), static_cast<uint32_t>(ih), 3);
  for (int y = 0; y < ih; ++y) {
    const uint8_t* row = plane + size_t(y) * stride;
    uint8_t* dst = out->pixels.data() + size_t(y) * iw * 3;
    if (alpha) {
      CompositeOverWhite(row, size_t(iw), dst);
    } else {
      std::memcpy(dst, row, size_t(iw) * 3);
    }
  }
  return Status::OK();
}

}  // namespace

struct Decoder::JpegState {
  JpegState() {
    err.Install(&cinfo, &progress);
    jpeg_create_decompress(&cinfo);
  }
  ~JpegState() { jpeg_destroy_decompress(&cinfo); }
  jpeg_decompress_struct cinfo;
  JpegErrors err;
  jpeg_progress_mgr progress{};
  internal::FastHuffman huffman;  // the entropy decoder of sequential Huffman scans
  std::vector<uint8_t> row;       // one scanline as libjpeg writes it (RGB or CMYK)
};

Decoder::Decoder() : jpeg_(std::make_unique<JpegState>()) {}
Decoder::~Decoder() = default;

// long: libjpeg's error exit longjmps here; what it may jump over stays in this one frame.
Status Decoder::DecodeJpegRegion(const uint8_t* data, size_t size, const JpegRegion& region,
                                 Image* out, const Limits& limits, int* scale_num, bool strict,
                                 RowLayout* layout) {
  JpegState& s = *jpeg_;
  jpeg_decompress_struct& cinfo = s.cinfo;
  s.err.warnings = 0;
  s.err.message[0] = 0;
  // Everything libjpeg may longjmp over is set up before setjmp, or is plain data.
  if (setjmp(s.err.jump)) {
    jpeg_abort_decompress(&cinfo);
    return Status::Corrupt("JPEG decode failed: ", s.err.message);
  }
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  const uint32_t iw = cinfo.image_width, ih = cinfo.image_height;
  Status limit = CheckPixels(iw, ih, limits);
  if (!limit.ok()) {
    jpeg_abort_decompress(&cinfo);
    return limit;
  }
  uint32_t rx = region.x, ry = region.y, rw = region.width, rh = region.height;
  if (rw == 0 || rh == 0) rx = 0, ry = 0, rw = iw, rh = ih;
  if (rx >= iw || ry >= ih || rw > iw - rx || rh > ih - ry) {
    jpeg_abort_decompress(&cinfo);
    return Status::InvalidArgument("region ", rw, "x", rh, "+", rx, "+", ry, " outside a ", iw, "x",
                                   ih, " JPEG");
  }
  // libjpeg-turbo scales by any n/8 inside the IDCT (see JpegRegion for which n).
  const int n = internal::PickJpegScale(rw, rh, region);
  if (scale_num) *scale_num = n;
  cinfo.scale_num = static_cast<unsigned>(n);
  cinfo.scale_denom = 8;
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  const bool inverted = cinfo.saw_Adobe_marker;
  jpeg_start_decompress(&cinfo);
  if (internal::UseFastHuffman()) s.huffman.Install(&cinfo);
  const uint32_t ow = cinfo.output_width, oh = cinfo.output_height;
  // The region at this scale, clamped to the scaled image.
  uint32_t sx = static_cast<uint32_t>(uint64_t{rx} * n / 8);
  uint32_t sy = static_cast<uint32_t>(uint64_t{ry} * n / 8);
  uint32_t ex = std::min<uint32_t>(ow, static_cast<uint32_t>((uint64_t{rx + rw} * n + 7) / 8));
  uint32_t ey = std::min<uint32_t>(oh, static_cast<uint32_t>((uint64_t{ry + rh} * n + 7) / 8));
  uint32_t sw = std::max<uint32_t>(1, ex - sx), sh = std::max<uint32_t>(1, ey - sy);
  // With `exact`, one more pixel on every side of the region where chroma upsampling reads
  // across block edges (none where libjpeg scaled the chroma up in its IDCT instead): the
  // triangle filter reads the chroma sample next to a pixel's own, which covers that pixel's
  // neighbour, and libjpeg widens the crop to whole iMCUs around it.
  bool across_x = false, across_y = false;
  const bool croppable = internal::CropUpsampling(cinfo, &across_x, &across_y);
  const uint32_t pad_x = region.exact && across_x ? 1 : 0;
  const uint32_t pad_y = region.exact && across_y ? 1 : 0;
  uint32_t cx = sx > pad_x ? sx - pad_x : 0;
  const uint32_t cy = sy > pad_y ? sy - pad_y : 0;
  uint32_t cw = std::min(ow, ex + pad_x) - cx;
  // A crop whose chroma is under 2 samples wide makes libjpeg-turbo switch to plain (box)
  // upsampling (jpeg_crop_scanline re-initialises it): an exact crop is never under
  // kMinExactWidth, widened right, or left at the image's right edge.
  if (pad_x > 0 && cw < internal::kMinExactWidth) {
    cw = std::min(ow - cx, internal::kMinExactWidth);
    if (cw < internal::kMinExactWidth)
      cx = ow > internal::kMinExactWidth ? ow - internal::kMinExactWidth : 0, cw = ow - cx;
  }
  uint32_t col0 = sx;
  if (cw < ow && croppable) {
    JDIMENSION xoff = cx, width = cw;
    jpeg_crop_scanline(&cinfo, &xoff, &width);  // widens to iMCU boundaries
    col0 = sx - xoff;
  }
  if (cy > 0) jpeg_skip_scanlines(&cinfo, cy);
  const int comps = cinfo.output_components;
  const size_t row_bytes = size_t{cinfo.output_width} * comps;
  for (uint32_t y = cy; y < sy; ++y) {  // context rows, decoded and dropped
    s.row.resize(row_bytes);
    JSAMPROW rows[1] = {s.row.data()};
    if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) {
      jpeg_abort_decompress(&cinfo);
      return Status::Corrupt("JPEG decode stopped at row ", y);
    }
  }
  const bool in_place =
      (layout != nullptr || (col0 == 0 && cinfo.output_width == sw)) && comps == 3;
  if (in_place) {
    // libjpeg writes every row straight into the image: no staging row, no copy.
    out->width = sw;
    out->height = sh;
    out->channels = 3;
    out->pixels.resize(row_bytes * sh);
    if (layout) *layout = RowLayout{size_t{col0} * 3, row_bytes};
  } else {
    s.row.resize(row_bytes);
    out->Resize(sw, sh, 3);
    if (layout) *layout = RowLayout{0, size_t{sw} * 3};
  }
  for (uint32_t y = 0; y < sh; ++y) {
    JSAMPROW rows[1] = {in_place ? out->pixels.data() + y * row_bytes : s.row.data()};
    if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) {
      jpeg_abort_decompress(&cinfo);
      return Status::Corrupt("JPEG decode stopped at row ", sy + y);
    }
    if (in_place) continue;
    uint8_t* dst = out->pixels.data() + size_t{y} * sw * 3;
    if (comps == 4) {
      CmykToRgb(s.row.data() + size_t{col0} * 4, dst, sw, inverted);
    } else {
      std::memcpy(dst, s.row.data() + size_t{col0} * 3, size_t{sw} * 3);
    }
  }
  if (sy + sh == oh && sw == ow) {
    jpeg_finish_decompress(&cinfo);  // reads to the end-of-image marker: catches truncation
  } else {
    jpeg_abort_decompress(&cinfo);
  }
  if (strict && s.err.warnings > 0) {
    return Status(StatusCode::kCorrupt, std::string("corrupt JPEG data: ") + s.err.message);
  }
  return Status::OK();
}

Status Decoder::DecodeAtLeast(const uint8_t* data, size_t size, uint32_t min_short_side, Image* out,
                              const Limits& limits, bool strict) {
  ImageFormat format = SniffFormat(data, size);
  if (format != ImageFormat::kJpeg) return DecodeOther(format, data, size, out, limits);
  SF_ASSIGN_OR_RETURN(JpegInfo info, ProbeJpeg(data, size, /*check_end=*/false, limits));
  JpegRegion region;
  if (min_short_side > 0) {
    (info.width <= info.height ? region.min_width : region.min_height) = min_short_side;
  }
  SF_RETURN_IF_ERROR(DecodeJpegRegion(data, size, region, out, limits, nullptr, strict));
  ApplyOrientation(out, info.orientation);
  return Status::OK();
}

Status Decoder::Decode(const uint8_t* data, size_t size, Image* out, const Limits& limits,
                       bool strict) {
  return DecodeAtLeast(data, size, 0, out, limits, strict);
}

namespace {

// An animated WebP: its first frame as shown (the whole canvas, what Pillow's first frame is;
// GIF and TIFF also give their first frame). The canvas size was checked against the limits.
Status DecodeAnimatedWebp(const uint8_t* data, size_t size, Image* out) {
  WebPAnimDecoderOptions options;
  if (!WebPAnimDecoderOptionsInit(&options)) return Status::Internal("libwebp version mismatch");
  options.color_mode = MODE_RGBA;  // not premultiplied: composited over white below
  options.use_threads = 0;
  const WebPData whole{data, size};
  std::unique_ptr<WebPAnimDecoder, void (*)(WebPAnimDecoder*)> decoder(
      WebPAnimDecoderNew(&whole, &options), WebPAnimDecoderDelete);
  if (!decoder) return Status::Corrupt("animated WebP unreadable (truncated or damaged frames)");
  WebPAnimInfo info;
  uint8_t* rgba = nullptr;
  int timestamp = 0;
  if (!WebPAnimDecoderGetInfo(decoder.get(), &info) ||
      !WebPAnimDecoderGetNext(decoder.get(), &rgba, &timestamp)) {
    return Status::Corrupt("animated WebP: its first frame does not decode");
  }
  out->Resize(info.canvas_width, info.canvas_height, 3);
  CompositeOverWhite(rgba, size_t(info.canvas_width) * info.canvas_height, out->pixels.data());
  return Status::OK();
}

}  // namespace

Status Decoder::DecodeOther(ImageFormat format, const uint8_t* data, size_t size, Image* out,
                            const Limits& limits) {
  switch (format) {
    case ImageFormat::kPng:
      return DecodePng(data, size, out, limits);
    case ImageFormat::kWebp: {
      WebPBitstreamFeatures features;
      if (WebPGetFeatures(data, size, &features) != VP8_STATUS_OK) {
        return Status::Corrupt("WebP header unreadable");
      }
      const int w = features.width, h = features.height;  // the canvas, for an animation
      SF_RETURN_IF_ERROR(CheckPixels(static_cast<uint64_t>(w), static_cast<uint64_t>(h), limits));
      if (features.has_animation) return DecodeAnimatedWebp(data, size, out);
      std::vector<uint8_t> rgba(size_t(w) * h * 4);
      if (!WebPDecodeRGBAInto(data, size, rgba.data(), rgba.size(), w * 4)) {
        return Status::Corrupt("WebP decode failed");
      }
      out->Resize(w, h, 3);
      CompositeOverWhite(rgba.data(), size_t(w) * h, out->pixels.data());
      return Status::OK();
    }
    case ImageFormat::kBmp:
    case ImageFormat::kGif:
    case ImageFormat::kStbOther: {
      int w = 0, h = 0, comp = 0;
      if (size > INT32_MAX) return Status::Unsupported("file too large");
      SF_RETURN_IF_ERROR(CheckPnm(data, size));
      SF_RETURN_IF_ERROR(CheckBmp(data, size));
      SF_RETURN_IF_ERROR(CheckGif(data, size));
      if (!stbi_info_from_memory(data, static_cast<int>(size), &w, &h, &comp)) {
        return Status::Corrupt(ImageFormatName(format), " header: ", stbi_failure_reason());
      }
      SF_RETURN_IF_ERROR(CheckPixels(static_cast<uint64_t>(w), static_cast<uint64_t>(h), limits));
      uint8_t* rgba = stbi_load_from_memory(data, static_cast<int>(size), &w, &h, &comp, 4);
      if (!rgba) {
        return Status::Corrupt(ImageFormatName(format), " decode failed: ", stbi_failure_reason());
      }
      out->Resize(w, h, 3);
      CompositeOverWhite(rgba, size_t(w) * h, out->pixels.data());
      stbi_image_free(rgba);
      return Status::OK();
    }
    case ImageFormat::kTiff:
      return DecodeTiff(data, size, out, limits);
    case ImageFormat::kHeif:
      return DecodeHeif(data, size, out, limits);
    case ImageFormat::kJpeg:
      return Decode(data, size, out, limits);
    case ImageFormat::kUnknown:
      break;
  }
  return Status::Unsupported("not an image (unrecognised file signature)");
}

Status DecodePngSamples(const uint8_t* data, size_t size, const Limits& limits, PngSamples* out) {
  if (SniffFormat(data, size) != ImageFormat::kPng) return Status::InvalidArgument("not a PNG");
  std::vector<uint8_t> raw;
  std::vector<png_bytep> rows;
  SF_RETURN_IF_ERROR(WithPngReader(
      data, size, [&](png_structp png, png_infop info, PngSource* src, Status* limit) {
        return ReadPngSamples(png, info, src, limits, out, &raw, &rows, limit);
      }));
  out->values.resize(raw.size() / (out->bit_depth == 16 ? 2 : 1));
  for (size_t i = 0; i < out->values.size(); ++i) {
    out->values[i] =
        out->bit_depth == 16 ? static_cast<uint16_t>(raw[2 * i] << 8 | raw[2 * i + 1]) : raw[i];
  }
  return Status::OK();
}

}  // namespace shardfeed::imaging
