#include "shardfeed/reader/transform.h"

#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "failpoint.h"
#include "shardfeed/reader/sampler.h"

namespace shardfeed::reader {
namespace {

using Clock = std::chrono::steady_clock;
using format::Encoding;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

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

CropRect StoredRect(const CropRect& r, int orientation, uint32_t w, uint32_t h) {
  // (w, h) is the stored size; r is in displayed coordinates. Inverse of ApplyOrientation.
  switch (orientation) {
    case 2:
      return {w - r.x - r.width, r.y, r.width, r.height};
    case 3:
      return {w - r.x - r.width, h - r.y - r.height, r.width, r.height};
    case 4:
      return {r.x, h - r.y - r.height, r.width, r.height};
    case 5:
      return {r.y, r.x, r.height, r.width};
    case 6:
      return {r.y, h - r.x - r.width, r.height, r.width};
    case 7:
      return {w - r.y - r.height, h - r.x - r.width, r.height, r.width};
    case 8:
      return {w - r.y - r.height, r.x, r.height, r.width};
    default:
      return r;
  }
}

struct SampleDecoder::Zstd {
  Zstd() : dctx(ZSTD_createDCtx()) {}
  ~Zstd() { ZSTD_freeDCtx(dctx); }
  ZSTD_DCtx* dctx;
};

Status SampleDecoder::OutputShape(const format::Archive& archive, const TransformOptions& o,
                                  uint32_t* height, uint32_t* width) {
  if (o.size > 0) {
    *height = *width = o.size;
    return Status::OK();
  }
  if (o.crop != Crop::kNone) return Status::InvalidArgument("a crop needs an output size");
  const format::Manifest& m = archive.manifest();
  if (m.height == 0) {
    return Status::InvalidArgument(archive.path(),
                                   ": records have different shapes; pass an output size");
  }
  *height = m.height;
  *width = m.width;
  return Status::OK();
}

SampleDecoder::SampleDecoder(std::shared_ptr<const format::Archive> archive,
                             const TransformOptions& options)
    : archive_(std::move(archive)), options_(options), zstd_(std::make_unique<Zstd>()) {
  if (!OutputShape(*archive_, options_, &out_h_, &out_w_).ok()) out_h_ = out_w_ = 0;
}

SampleDecoder::~SampleDecoder() = default;

Status SampleDecoder::DecodeInto(uint64_t index, uint64_t seed, uint8_t* dst, StageTimes* times) {
  if (out_h_ == 0) return Status::InvalidArgument("no output shape (see OutputShape)");
  Status s = DecodeRecord(index, seed, dst, times);
  if (!s.ok()) {
    return Status(s.code(),
                  archive_->path() + ": sample " + std::to_string(index) + ": " + s.message());
  }
  return s;
}

void SampleDecoder::Finish(const uint8_t* src, uint32_t w, uint32_t h, size_t stride, bool flip,
                           uint8_t* dst, StageTimes* times) {
  auto t = Clock::now();
  const bool planar = options_.layout == Layout::kNCHW;
  uint8_t* hwc = dst;
  if (planar) {
    planar_.resize(sample_bytes());
    hwc = planar_.data();
  }
  imaging::ResizeInto(src, w, h, stride, 3, hwc, out_w_, out_h_);
  if (flip) imaging::FlipHorizontal(hwc, out_w_, out_h_, 3, 0);
  if (planar) {
    const size_t plane = size_t{out_w_} * out_h_;
    for (size_t i = 0; i < plane; ++i) {
      dst[i] = hwc[3 * i];
      dst[plane + i] = hwc[3 * i + 1];
      dst[2 * plane + i] = hwc[3 * i + 2];
    }
  }
  times->resize += Since(t);
}

Status SampleDecoder::DecodeRecord(uint64_t index, uint64_t seed, uint8_t* dst, StageTimes* times) {
  if (index >= archive_->size()) return Status::InvalidArgument("index out of range");
  Failpoints& fp = Failpoints::Get();
  if (index == fp.decode_throw) throw std::runtime_error("failpoint decode_throw");
  if (index == fp.decode_hang) std::this_thread::sleep_for(std::chrono::hours(1));
  auto t0 = Clock::now();
  if (options_.verify_checksums) SF_RETURN_IF_ERROR(archive_->VerifyRecord(index));
  SF_ASSIGN_OR_RETURN(const format::RecordView r, archive_->At(index));
  times->label = r.entry->label;
  times->read += Since(t0);
  const format::IndexEntry& e = *r.entry;
  SF_RETURN_IF_ERROR(format::CheckPixelLimit(e, options_.max_pixels));
  Rng rng(seed);
  const uint64_t crop_seed = rng.Next();
  const bool flip = options_.flip && (rng.Next() & 1);
  // Displayed (upright) size: orientations 5..8 swap the axes.
  const bool swap_axes = e.encoding == uint8_t(Encoding::kJpeg) && e.orientation >= 5;
  const uint32_t disp_w = swap_axes ? e.height : e.width;
  const uint32_t disp_h = swap_axes ? e.width : e.height;
  CropRect rect{0, 0, disp_w, disp_h};
  if (options_.crop == Crop::kCenter) rect = CenterCropRect(disp_w, disp_h, options_.center_ratio);
  if (options_.crop == Crop::kRandom)
    rect = RandomResizedCropRect(disp_w, disp_h, options_, crop_seed);

  auto t = Clock::now();
  switch (static_cast<Encoding>(e.encoding)) {
    case Encoding::kJpeg: {
      imaging::Limits limits;
      limits.max_pixels = options_.max_pixels;
      if (options_.cropped_decode) {
        // The crop is in upright coordinates; decode its preimage in the stored image (phone
        // photos are mostly stored rotated), then turn just that region upright.
        const bool swap = e.orientation >= 5 && e.orientation <= 8;
        CropRect stored = StoredRect(rect, e.orientation, e.width, e.height);
        imaging::JpegRegion region{stored.x, stored.y, stored.width, stored.height, 0, 0};
        if (options_.scaled_decode) {
          region.min_width = swap ? out_h_ : out_w_;
          region.min_height = swap ? out_w_ : out_h_;
        }
        SF_RETURN_IF_ERROR(decoder_.DecodeJpegRegion(r.data, r.size, region, &image_, limits));
        imaging::ApplyOrientation(&image_, e.orientation);
        times->decode += Since(t);
        Finish(image_.pixels.data(), image_.width, image_.height, 0, flip, dst, times);
        return Status::OK();
      }
      // Cropped decoding off: decode whole, turn upright, then crop.
      SF_RETURN_IF_ERROR(decoder_.Decode(r.data, r.size, &image_, limits));
      times->decode += Since(t);
      if (image_.width != disp_w || image_.height != disp_h) {
        return Status::Corrupt("decoded size differs from the index");
      }
      const uint8_t* origin = image_.pixels.data() + (size_t{rect.y} * image_.width + rect.x) * 3;
      Finish(origin, rect.width, rect.height, size_t{image_.width} * 3, flip, dst, times);
      return Status::OK();
    }
    case Encoding::kRaw:
    case Encoding::kZstd: {
      // Raw records are resized straight from the map; only zstd needs a decoded copy.
      const uint8_t* pixels = r.data;
      const bool raw_in_place = e.encoding == uint8_t(Encoding::kRaw) && e.channels == 3 &&
                                r.size == format::PixelBytes(e);
      if (!raw_in_place) {
        pixels_.resize(format::PixelBytes(e));
        SF_RETURN_IF_ERROR(format::ReadPixelRecord(r, zstd_->dctx, pixels_.data()));
        pixels = pixels_.data();
      }
      times->decode += Since(t);
      const uint8_t* origin = pixels + (size_t{rect.y} * e.width + rect.x) * 3;
      Finish(origin, rect.width, rect.height, size_t{e.width} * 3, flip, dst, times);
      return Status::OK();
    }
  }
  return Status::Corrupt("unknown encoding ", int{e.encoding});
}

}  // namespace shardfeed::reader
