// Image decoding, encoding and resampling shared by the converter and the reader.
//
// Colour policy (docs/FORMAT.md, "Pixels"): every decoded image ends as 8-bit RGB, HWC.
//  - grayscale is replicated to three channels;
//  - CMYK/YCCK JPEGs are converted naively (R = (255-C)(255-K)/255; Adobe files store inverted
//    values and are handled as such), without ICC profiles;
//  - palette images are expanded; 16-bit samples are reduced to 8 bits;
//  - alpha is composited over white;
//  - EXIF orientation (JPEG APP1) is applied, so pixels come out upright.
// Limits: an image whose header announces more than Limits::max_pixels pixels is refused before
// any pixel is decoded (decompression bombs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardfeed/base/status.h"

namespace shardfeed::imaging {

enum class ImageFormat { kUnknown, kJpeg, kPng, kWebp, kBmp, kGif, kTiff, kStbOther, kHeif };

const char* ImageFormatName(ImageFormat format);
// Identifies a file by its first bytes (never by its name).
ImageFormat SniffFormat(const uint8_t* data, size_t size);

struct Limits {
  uint64_t max_pixels = 178956970;  // the limit Pillow enforces with DecompressionBombError
};

// An allocator that leaves new elements uninitialised: buffers that are about to be overwritten
// by a decoder need no zero-fill (which cost 7% of packing time, measured with callgrind).
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using Bytes = std::vector<uint8_t, UninitializedAllocator<uint8_t>>;

// An 8-bit image, HWC. Owns its pixels; `pixels.size() == height * width * channels`.
struct Image {
  uint32_t width = 0, height = 0, channels = 3;
  Bytes pixels;
  void Resize(uint32_t w, uint32_t h, uint32_t c = 3) {
    width = w;
    height = h;
    channels = c;
    pixels.resize(size_t{w} * h * c);
  }
};

// A progressive JPEG can hold thousands of tiny scans that each cost a pass over the image (a
// "JPEG bomb"); libjpeg-turbo's TurboJPEG API caps them at 500, and so do the probe and decoder.
inline constexpr int kMaxJpegScans = 500;

// What a JPEG's headers say, read without decoding any pixel.
struct JpegInfo {
  uint32_t width = 0, height = 0;  // as stored (before orientation)
  int components = 0;              // 1, 3 or 4
  int orientation = 1;             // EXIF orientation, 1..8
  bool adobe = false;              // has an Adobe APP14 marker
  bool progressive = false;
  bool complete = false;  // an end-of-image marker follows the first scan
  int scans = 0;          // start-of-scan markers seen (all of them when probed with check_end)
};

// Parses markers up to the first scan, then (if `check_end`) looks for the end-of-image marker in
// the entropy-coded data. Fails with kCorrupt for a malformed or truncated file, kUnsupported for
// 12-bit, lossless or DNL-height JPEGs, kResourceExhausted when the image exceeds `limits`.
Result<JpegInfo> ProbeJpeg(const uint8_t* data, size_t size, bool check_end, const Limits& limits);

// Reads `size` bytes of EXIF orientation from an APP1 payload ("Exif\0\0" + TIFF); 1 if absent.
int ParseExifOrientation(const uint8_t* app1, size_t size);

// A region of a JPEG to decode, in stored (pre-orientation) pixel coordinates, and the smallest
// size the decoded region may have. The decoder picks the smallest DCT scale (n/8) whose output
// still covers `min_width` x `min_height`, and decodes only the rows and iMCU columns it needs.
//
// By default n is 1, 2, 4 or 8. libjpeg-turbo also scales by 3/8, 5/8, 6/8 and 7/8
// (`any_scale`), but only 1, 2, 4 and 8 have SIMD IDCTs, and for 4:2:0 images the others also
// run an upscaling 2n x 2n chroma IDCT: measured with libjpeg-turbo 2.1.5 on x86-64, a whole-image
// decode at 6/8 is 1.3-1.4x slower than at 8/8 and 3/8 is slower than 4/8 (docs/BENCHMARKS.md,
// "Decode exactly what is needed"), so the default never picks them.
struct JpegRegion {
  uint32_t x = 0, y = 0, width = 0, height = 0;  // width/height 0: the whole image
  uint32_t min_width = 0, min_height = 0;        // 0: full resolution
  bool any_scale = false;                        // consider every n/8, not only 1, 2, 4, 8
  // Pixels bit for bit those of a whole-image decode at the same scale, cropped: libjpeg-turbo's
  // cropped and skipped decoding treats the crop's edges as image edges in chroma upsampling,
  // so where the scale upsamples chroma across block edges (4:2:0 at 8/8, 4:2:2 at any scale;
  // not 4:2:0 at 1/8, 2/8, 4/8, where libjpeg scales chroma up in the IDCT instead) the decode
  // starts one iMCU further out on those sides (where the image has one).
  bool exact = false;
};

// A decoding context: owns libjpeg state and scratch buffers, reused across images.
// Not thread-safe; give each worker its own.
class Decoder {
 public:
  Decoder();
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Decodes any supported format to RGB, orientation applied. With `strict`, data the decoder
  // had to guess at (a premature end, corrupt entropy data) is an error rather than a warning.
  Status Decode(const uint8_t* data, size_t size, Image* out, const Limits& limits,
                bool strict = false);
  // As Decode, but a JPEG is decoded at the smallest DCT scale whose short side is still at
  // least `min_short_side` (after orientation). Other formats decode at full size.
  Status DecodeAtLeast(const uint8_t* data, size_t size, uint32_t min_short_side, Image* out,
                       const Limits& limits, bool strict = false);
  // Decodes a region of a JPEG to RGB without applying orientation (the caller maps
  // coordinates). `out` holds exactly the region, at the chosen scale; `*scale_num` receives the
  // numerator n of the n/8 scale used.
  //
  // With `rows`, the region's rows are left where libjpeg wrote them, saving a copy of every
  // row (measured: 8-20% of a centre crop's decode time in the loader): out->width x
  // out->height is the region, its first pixel is at out->pixels.data() + rows->offset and
  // its rows are rows->stride bytes apart (out->pixels is then larger than the region;
  // ApplyOrientation and other whole-Image calls do not apply to it).
  struct RowLayout {
    size_t offset = 0, stride = 0;
  };
  Status DecodeJpegRegion(const uint8_t* data, size_t size, const JpegRegion& region, Image* out,
                          const Limits& limits, int* scale_num = nullptr, bool strict = false,
                          RowLayout* rows = nullptr);

 private:
  struct JpegState;
  std::unique_ptr<JpegState> jpeg_;
  Status DecodeOther(ImageFormat format, const uint8_t* data, size_t size, Image* out,
                     const Limits& limits);
};

// A PNG's samples as stored, for label images (masks): no colour policy applied. Samples below 8
// bits unpacked to one value each (not scaled: a 1-bit 1 stays 1), 16-bit ones kept, palette
// indices kept (not expanded to colours, as Pillow's "P" mode gives them), transparency not
// composited (alpha is a channel). `values` holds height * width * channels samples, HWC.
struct PngSamples {
  uint32_t width = 0, height = 0;
  uint32_t channels = 0;  // 1 grey or palette index, 2 grey + alpha, 3 RGB, 4 RGBA
  int bit_depth = 8;      // the file's: 1, 2, 4, 8 or 16
  bool palette = false;
  std::vector<uint16_t> values;
};
// kInvalidArgument for data that is not a PNG, kCorrupt for a damaged one, the limit's error for
// a size over `limits` (checked before any pixel is decoded). Thread-safe (no shared state).
Status DecodePngSamples(const uint8_t* data, size_t size, const Limits& limits, PngSamples* out);

// Encoders. JPEG uses 4:2:0 subsampling at `quality` (1..100); PNG is lossless RGB.
Result<std::vector<uint8_t>> EncodeJpeg(const Image& image, int quality);
Result<std::vector<uint8_t>> EncodePng(const Image& image);

// Resampling. Reductions of 2x or more are antialiased: for 3 channels each such axis is first
// box-reduced by the whole factor floor(src / dst) (a partial last box dropped), other channel
// counts use area averaging; smaller reductions and enlargements use bilinear interpolation
// (ResizeBilinearRgb for 3 channels). `src` and
// `dst` are HWC with the same channel count; strides in bytes (0: tightly packed). With `mirror`
// the output is mirrored left-right (for RGB bilinear at no cost: the samples are written in
// reverse order). Thread-safe: no shared state (per-thread scratch). Sizes of 0 do nothing.
void ResizeInto(const uint8_t* src, uint32_t src_w, uint32_t src_h, size_t src_stride,
                uint32_t channels, uint8_t* dst, uint32_t dst_w, uint32_t dst_h,
                size_t dst_stride = 0, bool mirror = false);
// Bilinear resize of RGB pixels: pixel centres aligned ((d + 0.5) * src / dst - 0.5, edges
// replicated, as OpenCV's INTER_LINEAR and Pillow's BILINEAR without antialiasing), separable,
// in fixed point (14- and 15-bit weights, 7 fraction bits kept between the passes): every value
// is within about half a level of exact bilinear interpolation (OpenCV's is within 0.8). The AVX2
// path (used where the CPU has it) and the portable one compute the same integers, so outputs do
// not depend on the machine; `simd` false forces the portable path (tests). Sizes of 0 do nothing.
void ResizeBilinearRgb(const uint8_t* src, uint32_t src_w, uint32_t src_h, size_t src_stride,
                       uint8_t* dst, uint32_t dst_w, uint32_t dst_h, size_t dst_stride, bool mirror,
                       bool simd = true);
// The size whose short side is `short_side`, keeping aspect (the long side rounds to nearest).
void ShortSideSize(uint32_t w, uint32_t h, uint32_t short_side, uint32_t* out_w, uint32_t* out_h);
// Resizes so the short side is `short_side`; then, with `center_crop`, crops the centre
// `short_side` x `short_side`. The converter's definition of a resized record.
void ResizeShortSide(const Image& src, uint32_t short_side, bool center_crop, Image* out);
// The same, the output's size taken from the image `src` was decoded from, `source_w` x
// `source_h` (upright): a DCT-scaled decode's rounded-up size would round the long side
// differently (301x211 to short side 48: 68 from the source, 69 from a 76x53 decode).
void ResizeShortSide(const Image& src, uint32_t short_side, bool center_crop, Image* out,
                     uint32_t source_w, uint32_t source_h);
// Applies EXIF orientation 1..8 in place (via a scratch copy).
void ApplyOrientation(Image* image, int orientation);
// Boxes (x0, y0, x1, y1 per box, `n` of them, pixel edges of an image stored `w` x `h`) turned
// with ApplyOrientation(orientation): the same pixels, upright; x0 <= x1 and y0 <= y1 kept.
void OrientBoxes(float* boxes, size_t n, uint32_t w, uint32_t h, int orientation);
// Mirrors left-right in place.
void FlipHorizontal(uint8_t* pixels, uint32_t w, uint32_t h, uint32_t channels, size_t stride);

// Writes `text` (printable ASCII; anything else as '?') at (x, y), top-left, in a 6x11 bitmap
// font scaled by `scale`, in colour `rgb`; clipped to the image. Returns the width drawn.
inline constexpr uint32_t kTextCellWidth = 6, kTextCellHeight = 11;
uint32_t DrawText(Image* image, uint32_t x, uint32_t y, std::string_view text, int scale,
                  const uint8_t rgb[3]);

}  // namespace shardfeed::imaging
