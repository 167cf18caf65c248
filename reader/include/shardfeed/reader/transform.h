// Turning one record into one fixed-shape image in a batch slot: decode (JPEG, with DCT scaling
// by any n/8 and cropped decoding), decompress (zstd) or read (raw) straight from the mapping,
// crop, resize, flip, then write it as uint8 or normalised floats, NHWC or NCHW. One
// SampleDecoder per worker: it owns its decoder contexts and scratch.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "shardfeed/base/status.h"
#include "shardfeed/codec/codec.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/format/stats_record.h"
#include "shardfeed/imaging/image.h"
#include "shardfeed/reader/geometry.h"

namespace shardfeed::reader {

enum class Crop {
  // The whole image, never distorted: a fixed-shape archive's records at their stored shape
  // (size 0) or, when they are square, resized to size x size. An archive of mixed shapes has
  // no single output shape: OutputShape() refuses it and names the options that fit.
  kNone,
  kCenter,  // evaluation: the centre square of side center_ratio * short side, resized
  kRandom,  // training: torchvision's RandomResizedCrop(scale, ratio), seeded per sample
  kSquash,  // the whole image resized to size x size, aspect ratio NOT kept (asked by name)
};
// The output side of center, random and squash crops when TransformOptions::size is 0.
inline constexpr uint32_t kDefaultOutputSize = 224;
enum class Layout { kNHWC, kNCHW };

// The element type of a batch. Floats are normalised (TransformOptions::mean/std); float16 is
// IEEE binary16 and bfloat16 the top half of a float32, both rounded to nearest even.
enum class DType : uint8_t { kUint8, kFloat32, kFloat16, kBFloat16 };
const char* DTypeName(DType dtype);  // "uint8", "float32", "float16", "bfloat16"
size_t DTypeSize(DType dtype);       // bytes per element
// Names as the CLI and Python take them; an unknown name is kInvalidArgument listing the valid
// ones.
Result<DType> ParseDType(std::string_view name);
Result<Layout> ParseLayout(std::string_view name);  // "nhwc" | "nchw"
Result<Crop> ParseCrop(std::string_view name);      // "center" | "random" | "none" | "squash"

struct TransformOptions {
  Crop crop = Crop::kCenter;
  // Output side. 0 (the default): kDefaultOutputSize for center/random/squash crops, the
  // stored shape with Crop::kNone.
  uint32_t size = 0;
  bool flip = false;  // random horizontal flip (p = 0.5), seeded per sample
  Layout layout = Layout::kNHWC;
  double center_ratio = 224.0 / 256.0;
  double scale_min = 0.08, scale_max = 1.0;             // RandomResizedCrop scale
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // RandomResizedCrop aspect ratio
  bool scaled_decode = true;   // let libjpeg-turbo decode at 1/2, 1/4, 1/8 when it suffices
  bool any_scale = false;      // with scaled_decode: also 3/8, 5/8, 6/8, 7/8 (imaging::JpegRegion)
  bool cropped_decode = true;  // decode only the crop's rows and iMCU columns (else: whole image)
  // Check each record's XXH3 before decoding it: a damaged record is its sample's error
  // (kChecksumMismatch naming the archive and sample), never trained on. The default; turning
  // it off is unsafe (damage then decodes as wrong pixels, or fails only if the codec notices)
  // and saves about 1% of read time (docs/BENCHMARKS.md).
  bool verify_checksums = true;
  // A record declaring more pixels is that sample's error (kResourceExhausted), never an
  // allocation: the packer's limit by default, so a crafted archive cannot exhaust memory.
  uint64_t max_pixels = imaging::Limits().max_pixels;
  // Output element type. For the float types each value is (x / 255 - mean[c]) / std[c], x the
  // uint8 value of RGB channel c: mean and std are in units of the 0..1 range, as torchvision's
  // Normalize after ToTensor (ImageNet: mean {0.485, 0.456, 0.406}, std {0.229, 0.224, 0.225}).
  // The defaults give x / 255. uint8 output takes no mean/std (ValidateTransform refuses them).
  DType dtype = DType::kUint8;
  std::array<float, 3> mean{0.f, 0.f, 0.f};
  std::array<float, 3> std{1.f, 1.f, 1.f};
  // mean="archive" (or std="archive"): Loader::Create takes mean and std from the archive's
  // stats.json (`shardfeed stats ARCHIVE --save`; format/stats_record.h), refusing a record
  // whose archive changed since.
  bool stats_from_archive = false;
};

// The smallest std accepted (0..1 units): below it outputs grow towards infinity.
inline constexpr float kMinStd = format::kMinStd;
// Checks the options on their own (not against an archive): ratios and scales in range, std
// finite and at least kMinStd, mean finite and at most 1 (0..1 units), mean/std only with a
// float dtype.
Status ValidateTransform(const TransformOptions& options);

// A crop rectangle in displayed (upright) pixel coordinates (codec/codec.h).
using CropRect = codec::CropRect;
using codec::StoredRect;

// torchvision's RandomResizedCrop.get_params, with our generator.
CropRect RandomResizedCropRect(uint32_t width, uint32_t height, const TransformOptions& options,
                               uint64_t seed);
CropRect CenterCropRect(uint32_t width, uint32_t height, double ratio);

struct StageTimes {
  double read = 0;     // record lookup in the map (and checksum, if enabled)
  double decode = 0;   // entropy decode / decompress / read from the map
  double resize = 0;   // crop, resize, flip and layout into the slot
  int32_t label = -1;  // the sample's label, read with its record (-1 until then)
};

class SampleDecoder {
 public:
  SampleDecoder(std::shared_ptr<const format::Archive> archive, const TransformOptions& options);
  ~SampleDecoder();

  // Output geometry: height x width x 3 elements of DTypeSize(dtype) bytes per sample.
  uint32_t out_height() const { return out_h_; }
  uint32_t out_width() const { return out_w_; }
  size_t sample_bytes() const { return size_t{out_h_} * out_w_ * 3 * DTypeSize(options_.dtype); }

  // Decodes sample `index` into `dst` (sample_bytes() bytes, suitably aligned for the dtype, in
  // the configured layout and dtype).
  // `seed` drives the random crop and flip. Errors name the archive and the sample. With
  // `geometry`, how the image was placed there (geometry.h: what boxes and masks follow), set
  // valid only on success.
  Status DecodeInto(uint64_t index, uint64_t seed, uint8_t* dst, StageTimes* times,
                    SampleGeometry* geometry = nullptr);

  // Resolves output geometry from options and the archive; fails for impossible combinations.
  static Status OutputShape(const format::Archive& archive, const TransformOptions& options,
                            uint32_t* height, uint32_t* width);

 private:
  Status DecodeRecord(uint64_t index, uint64_t seed, uint8_t* dst, StageTimes* times,
                      SampleGeometry* geometry);
  void Finish(const uint8_t* src, uint32_t w, uint32_t h, size_t stride, bool flip, uint8_t* dst,
              StageTimes* times);

  std::shared_ptr<const format::Archive> archive_;
  TransformOptions options_;
  uint32_t out_h_ = 0, out_w_ = 0;
  std::unique_ptr<codec::Context> codec_;  // decoder state and buffers (codec/codec.h)
  codec::CropDecode crop_decode_;          // how crops are decoded (fixed by the options)
  imaging::Bytes staging_;  // HWC uint8 crop, when the slot wants another dtype or layout
  std::array<float, 3> scale_{}, bias_{};  // float outputs: x * scale_[c] + bias_[c]
};

}  // namespace shardfeed::reader
