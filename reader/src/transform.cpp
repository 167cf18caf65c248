#include "shardfeed/reader/transform.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "failpoint.h"
#include "pixel_store.h"
#include "shardfeed/reader/sampler.h"

namespace shardfeed::reader {
namespace {

using Clock = std::chrono::steady_clock;
using format::Encoding;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
      return "uint8";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "?";
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
      return 1;
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
  }
  return 1;
}

Result<DType> ParseDType(std::string_view name) {
  for (DType d : {DType::kUint8, DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    if (name == DTypeName(d)) return d;
  }
  return Status::InvalidArgument("dtype must be uint8, float32, float16 or bfloat16, not '",
                                 std::string(name), "'");
}

Result<Layout> ParseLayout(std::string_view name) {
  if (name == "nhwc") return Layout::kNHWC;
  if (name == "nchw") return Layout::kNCHW;
  return Status::InvalidArgument("layout must be nhwc or nchw, not '", std::string(name), "'");
}

Result<Crop> ParseCrop(std::string_view name) {
  if (name == "center") return Crop::kCenter;
  if (name == "random") return Crop::kRandom;
  if (name == "none") return Crop::kNone;
  if (name == "squash") return Crop::kSquash;
  return Status::InvalidArgument("crop must be center, random, none or squash, not '",
                                 std::string(name), "'");
}

Status ValidateTransform(const TransformOptions& o) {
  if (!(o.center_ratio > 0 && o.center_ratio <= 1)) {
    return Status::InvalidArgument("center_ratio must be in (0, 1], not ", o.center_ratio);
  }
  if (!(o.scale_min > 0 && o.scale_min <= o.scale_max && o.scale_max <= 1)) {
    return Status::InvalidArgument("random crop scale must satisfy 0 < min <= max <= 1");
  }
  if (!(o.ratio_min > 0 && o.ratio_min <= o.ratio_max && std::isfinite(o.ratio_max))) {
    return Status::InvalidArgument("random crop ratio must satisfy 0 < min <= max");
  }
  const bool normalised =
      o.mean != std::array<float, 3>{0.f, 0.f, 0.f} || o.std != std::array<float, 3>{1.f, 1.f, 1.f};
  if (o.dtype == DType::kUint8 && normalised) {
    return Status::InvalidArgument(
        "mean/std need a float dtype (float32, float16 or bfloat16); uint8 output is not "
        "normalised");
  }
  for (int c = 0; c < 3; ++c) {
    if (!std::isfinite(o.mean[c])) return Status::InvalidArgument("mean must be finite");
    if (o.mean[c] > 1.f) {  // the mean of 0..1 values never is: 0..255 units
      return Status::InvalidArgument(
          "mean must be in 0..1 units (as torchvision's Normalize "
          "after ToTensor), not ",
          o.mean[c], ": divide 0..255 values of mean and std by 255");
    }
    if (!(std::isfinite(o.std[c]) && o.std[c] >= kMinStd)) {
      return Status::InvalidArgument("std must be finite and at least ", kMinStd,
                                     " (0..1 units; smaller values give infinite outputs), not ",
                                     o.std[c]);
    }
  }
  return Status::OK();
}

CropRect CenterCropRect(uint32_t width, uint32_t height, double ratio) {
  uint32_t side = std::max<uint32_t>(
      1, static_cast<uint32_t>(std::lround(std::min(width, height) * std::clamp(ratio, 0.0, 1.0))));
  side = std::min({side, width, height});
  return {(width - side) / 2, (height - side) / 2, side, side};
}

CropRect RandomResizedCropRect(uint32_t width, uint32_t height, const TransformOptions& o,
                               uint64_t seed) {
  Rng rng(seed);
  const double area = double(width) * height;
  const double log_lo = std::log(o.ratio_min), log_hi = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    double target = area * rng.Uniform(o.scale_min, o.scale_max);
    double aspect = std::exp(rng.Uniform(log_lo, log_hi));
    long w = std::lround(std::sqrt(target * aspect));
    long h = std::lround(std::sqrt(target / aspect));
    if (w > 0 && h > 0 && w <= long(width) && h <= long(height)) {
      uint32_t y = static_cast<uint32_t>(rng.Below(height - h + 1));
      uint32_t x = static_cast<uint32_t>(rng.Below(width - w + 1));
      return {x, y, static_cast<uint32_t>(w), static_cast<uint32_t>(h)};
    }
  }
  // Fallback, as torchvision: the whole image clamped to the allowed aspect range, centred.
  double in_ratio = double(width) / height;
  uint32_t w = width, h = height;
  if (in_ratio < o.ratio_min) {
    h = std::max<uint32_t>(1, static_cast<uint32_t>(std::lround(w / o.ratio_min)));
  } else if (in_ratio > o.ratio_max) {
    w = std::max<uint32_t>(1, static_cast<uint32_t>(std::lround(h * o.ratio_max)));
  }
  w = std::min(w, width);
  h = std::min(h, height);
  return {(width - w) / 2, (height - h) / 2, w, h};
}

Status SampleDecoder::OutputShape(const format::Archive& archive, const TransformOptions& o,
                                  uint32_t* height, uint32_t* width) {
  if (o.crop != Crop::kNone) {
    *height = *width = o.size > 0 ? o.size : kDefaultOutputSize;
    return Status::OK();
  }
  // Crop::kNone never distorts an image.
  const format::Manifest& m = archive.manifest();
  if (m.height == 0) {
    return Status::InvalidArgument(
        archive.path(),
        ": its records have different shapes, so crop 'none' (whole images, undistorted) has no "
        "single output shape; use crop 'center' or 'random' (with a size), or crop 'squash' "
        "with a size to resize every image to size x size without keeping its aspect ratio");
  }
  if (o.size == 0 || (o.size == m.height && o.size == m.width)) {
    *height = m.height;
    *width = m.width;
    return Status::OK();
  }
  if (m.height != m.width) {
    return Status::InvalidArgument(
        archive.path(), ": its records are ", m.height, "x", m.width,
        ", so crop 'none' cannot resize them to ", o.size, "x", o.size,
        " without distorting them; leave the size at 0 (the stored shape), or use crop 'squash' "
        "to distort them by name");
  }
  *height = *width = o.size;
  return Status::OK();
}

SampleDecoder::SampleDecoder(std::shared_ptr<const format::Archive> archive,
                             const TransformOptions& options)
    : archive_(std::move(archive)), options_(options), codec_(std::make_unique<codec::Context>()) {
  if (!OutputShape(*archive_, options_, &out_h_, &out_w_).ok() ||
      !ValidateTransform(options_).ok()) {
    out_h_ = out_w_ = 0;
  }
  crop_decode_.out_width = out_w_;
  crop_decode_.out_height = out_h_;
  crop_decode_.scaled = options_.scaled_decode;
  crop_decode_.any_scale = options_.any_scale;
  crop_decode_.cropped = options_.cropped_decode;
  crop_decode_.max_pixels = options_.max_pixels;
  const internal::Affine a = internal::AffineFor(options_);
  for (int c = 0; c < 3; ++c) scale_[c] = a.scale[c], bias_[c] = a.bias[c];
}

SampleDecoder::~SampleDecoder() = default;

Status SampleDecoder::DecodeInto(uint64_t index, uint64_t seed, uint8_t* dst, StageTimes* times,
                                 SampleGeometry* geometry) {
  if (geometry) geometry->valid = 0;
  if (out_h_ == 0) {
    return Status::InvalidArgument("no output shape (see OutputShape and ValidateTransform)");
  }
  Status s = DecodeRecord(index, seed, dst, times, geometry);
  // A shard truncated on disk while mapped reads as zeros past its new end (never SIGBUS): what
  // was read is garbage, and the reason is the file, not the image.
  if (Status changed = archive_->CheckUnchanged(index); !changed.ok()) {
    if (geometry) geometry->valid = 0;
    return changed;
  }
  // Named once: VerifyRecord's message names the archive and the sample already.
  const std::string prefix = archive_->path() + ": sample " + std::to_string(index) + ": ";
  if (!s.ok() && geometry) geometry->valid = 0;
  if (!s.ok() && s.message().compare(0, prefix.size(), prefix) != 0) {
    return Status(s.code(), prefix + s.message());
  }
  return s;
}

void SampleDecoder::Finish(const uint8_t* src, uint32_t w, uint32_t h, size_t stride, bool flip,
                           uint8_t* dst, StageTimes* times) {
  auto t = Clock::now();
  // uint8 NHWC is resized straight into the slot. Anything else is resized into a small HWC
  // staging image (it stays in cache) and written to the slot in one converting pass.
  const bool direct = options_.dtype == DType::kUint8 && options_.layout == Layout::kNHWC;
  uint8_t* hwc = dst;
  if (!direct) {
    staging_.resize(size_t{out_w_} * out_h_ * 3);
    hwc = staging_.data();
  }
  imaging::ResizeInto(src, w, h, stride, 3, hwc, out_w_, out_h_, 0, flip);
  if (!direct) {
    internal::Affine a;
    for (int c = 0; c < 3; ++c) a.scale[c] = scale_[c], a.bias[c] = bias_[c];
    internal::StorePixels(hwc, size_t{out_w_} * out_h_, options_.layout, options_.dtype, a, dst);
  }
  times->resize += Since(t);
}

Status SampleDecoder::DecodeRecord(uint64_t index, uint64_t seed, uint8_t* dst, StageTimes* times,
                                   SampleGeometry* geometry) {
  if (index >= archive_->size()) return Status::InvalidArgument("index out of range");
  Failpoints& fp = Failpoints::Get();
  if (index == fp.decode_throw) throw std::runtime_error("failpoint decode_throw");
  if (index == fp.decode_hang) std::this_thread::sleep_for(std::chrono::hours(1));
  if (index == fp.decode_gate) fp.WaitAtGate();
  if (index == fp.io_error_once && !fp.io_error_used.exchange(true)) {
    return Status::IOError("failpoint io_error_once: sample ", index);
  }
  auto t0 = Clock::now();
  // The record only: a loader that carries variable fields checks their var blob itself
  // (batch_fields.h), and one that does not never reads it.
  if (options_.verify_checksums) SF_RETURN_IF_ERROR(archive_->VerifyRecord(index, false));
  SF_ASSIGN_OR_RETURN(const format::RecordView r, archive_->At(index));
  times->label = r.entry->label;
  times->read += Since(t0);
  const format::IndexEntry& e = *r.entry;
  SF_RETURN_IF_ERROR(format::CheckPixelLimit(e, options_.max_pixels));
  Rng rng(seed);
  const uint64_t crop_seed = rng.Next();
  const bool flip = options_.flip && (rng.Next() & 1);
  // Displayed (upright) size: orientations 5..8 swap the axes.
  // (Only JPEG records carry an orientation; every other entry holds 1, checked at open.)
  const bool swap_axes = e.orientation >= 5;
  const uint32_t disp_w = swap_axes ? e.height : e.width;
  const uint32_t disp_h = swap_axes ? e.width : e.height;
  CropRect rect{0, 0, disp_w, disp_h};
  if (options_.crop == Crop::kCenter) rect = CenterCropRect(disp_w, disp_h, options_.center_ratio);
  if (options_.crop == Crop::kRandom)
    rect = RandomResizedCropRect(disp_w, disp_h, options_, crop_seed);

  auto t = Clock::now();
  SF_ASSIGN_OR_RETURN(const codec::Codec* c, codec::CodecFor(e));
  codec::Region region;
  SF_RETURN_IF_ERROR(c->DecodeCrop(*codec_, r, rect, crop_decode_, &region));
  times->decode += Since(t);
  Finish(region.pixels, region.width, region.height, region.stride, flip, dst, times);
  if (geometry) {
    geometry->stored_width = e.width;
    geometry->stored_height = e.height;
    geometry->crop = rect;
    geometry->out_width = out_w_;
    geometry->out_height = out_h_;
    geometry->orientation = e.orientation;
    geometry->flip = flip;
    geometry->valid = 1;
  }
  return Status::OK();
}

}  // namespace shardfeed::reader
