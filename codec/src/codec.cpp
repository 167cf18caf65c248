#include "shardfeed/codec/codec.h"

#include <zstd.h>

#include <algorithm>

namespace shardfeed::codec {

using format::Encoding;
using format::IndexEntry;
using format::RecordView;

struct Context::Zstd {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_DCtx* d = ZSTD_createDCtx();
  ~Zstd() {
    ZSTD_freeCCtx(c);
    ZSTD_freeDCtx(d);
  }
};

Context::Context() : zstd(std::make_unique<Zstd>()) {}
Context::~Context() = default;

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

Status DecodeForPixels(imaging::Decoder& decoder, const uint8_t* data, size_t size,
                       const EncodeOptions& options, imaging::Image* out, imaging::Image* scratch) {
  if (options.size == 0) return decoder.Decode(data, size, out, options.limits, /*strict=*/true);
  imaging::Image local;
  imaging::Image& full = scratch ? *scratch : local;
  SF_RETURN_IF_ERROR(
      decoder.DecodeAtLeast(data, size, options.size, &full, options.limits, /*strict=*/true));
  imaging::ResizeShortSide(full, options.size, options.center_crop, out);
  return Status::OK();
}

namespace {

// ---- JPEG records: source JPEGs byte for byte, anything else (or over the cap) encoded once --

// The size an image of (w, h) is capped to (EncodeOptions::size): unchanged when the capped
// side is already within the cap. The other side keeps the aspect, rounded to nearest.
void CappedSize(uint32_t w, uint32_t h, const EncodeOptions& o, uint32_t* out_w, uint32_t* out_h) {
  *out_w = w, *out_h = h;
  const uint32_t side = o.max_side ? std::max(w, h) : std::min(w, h);
  if (o.size == 0 || side <= o.size) return;
  auto scaled = [&](uint32_t v) {
    return std::max<uint32_t>(1, static_cast<uint32_t>((uint64_t{v} * o.size + side / 2) / side));
  };
  const bool width_capped = o.max_side ? w >= h : w <= h;
  *out_w = width_capped ? o.size : scaled(w);
  *out_h = width_capped ? scaled(h) : o.size;
}

class JpegCodec final : public Codec {
 public:
  Encoding encoding() const override { return Encoding::kJpeg; }
  const char* description() const override {
    return "JPEG files as packed (decoded, cropped and DCT-scaled at read time)";
  }
  bool FixedShape(const EncodeOptions&, uint32_t*) const override { return false; }
  bool CapsResolution(const EncodeOptions& o) const override { return o.size > 0; }

  Status Encode(Context& ctx, const EncodeOptions& o, imaging::Bytes* payload, IndexEntry* e,
                bool* resized) const override {
    *resized = false;
    const imaging::ImageFormat format = imaging::SniffFormat(payload->data(), payload->size());
    if (format == imaging::ImageFormat::kUnknown) {
      return Status::Unsupported("not an image (unrecognised file signature)");
    }
    if (format == imaging::ImageFormat::kJpeg) {
      SF_ASSIGN_OR_RETURN(imaging::JpegInfo info,
                          imaging::ProbeJpeg(payload->data(), payload->size(),
                                             o.validation != Validation::kNone, o.limits));
      if (o.validation == Validation::kFull) {
        SF_RETURN_IF_ERROR(ctx.decoder.Decode(payload->data(), payload->size(), &ctx.image,
                                              o.limits, /*strict=*/true));
      }
      uint32_t cw = 0, ch = 0;
      CappedSize(info.width, info.height, o, &cw, &ch);
      if (cw == info.width && ch == info.height) {
        e->height = static_cast<uint16_t>(info.height);
        e->width = static_cast<uint16_t>(info.width);
        e->channels = static_cast<uint8_t>(info.components);
        e->orientation = static_cast<uint8_t>(info.orientation);
        e->flags = info.adobe ? format::kFlagAdobe : 0;
        return Status::OK();  // the payload is the file, already in place
      }
    }
    // Not a JPEG, or a JPEG over the size cap: decode under the colour policy (upright), cap,
    // and encode once. The source bytes move aside: the payload receives the new JPEG.
    imaging::Bytes source;
    source.swap(*payload);
    imaging::Image& full = ctx.image;
    if (format == imaging::ImageFormat::kJpeg) {
      SF_ASSIGN_OR_RETURN(imaging::JpegInfo info,
                          imaging::ProbeJpeg(source.data(), source.size(), false, o.limits));
      uint32_t tw = 0, th = 0;
      CappedSize(info.width, info.height, o, &tw, &th);
      SF_RETURN_IF_ERROR(ctx.decoder.DecodeAtLeast(source.data(), source.size(), std::min(tw, th),
                                                   &full, o.limits,
                                                   /*strict=*/true));
    } else {
      SF_RETURN_IF_ERROR(
          ctx.decoder.Decode(source.data(), source.size(), &full, o.limits, /*strict=*/true));
    }
    uint32_t w = 0, h = 0;
    CappedSize(full.width, full.height, o, &w, &h);
    const imaging::Image* img = &full;
    if (w != full.width || h != full.height) {
      ctx.scratch.Resize(w, h, 3);
      imaging::ResizeInto(full.pixels.data(), full.width, full.height, 0, 3,
                          ctx.scratch.pixels.data(), w, h);
      img = &ctx.scratch;
      *resized = true;
    }
    SF_ASSIGN_OR_RETURN(std::vector<uint8_t> jpeg, imaging::EncodeJpeg(*img, o.quality));
    e->height = static_cast<uint16_t>(img->height);
    e->width = static_cast<uint16_t>(img->width);
    e->channels = 3;
    e->orientation = 1;  // upright now
    e->flags = 0;
    payload->assign(jpeg.begin(), jpeg.end());
    return Status::OK();
  }

  Status Decode(Context& ctx, const RecordView& r, const imaging::Limits& limits, bool strict,
                imaging::Image* out) const override {
    // An archive's JPEG record is known to be a JPEG: anything else is damage (kCorrupt).
    SF_RETURN_IF_ERROR(
        ctx.decoder.DecodeJpegRegion(r.data, r.size, {}, out, limits, nullptr, strict));
    imaging::ApplyOrientation(out, r.entry->orientation);
    return Status::OK();
  }

  Status Check(Context& ctx, const RecordView& r, const imaging::Limits& limits) const override {
    imaging::Image& img = ctx.image;
    SF_RETURN_IF_ERROR(
        ctx.decoder.DecodeJpegRegion(r.data, r.size, {}, &img, limits, nullptr, /*strict=*/true));
    if (img.width != r.entry->width || img.height != r.entry->height) {
      return Status::Corrupt("decoded ", img.width, "x", img.height, ", index says ",
                             r.entry->width, "x", r.entry->height);
    }
    return Status::OK();
  }

  const char* file_extension() const override { return ".jpg"; }
  Status ExtractFile(Context&, const RecordView& r, std::vector<uint8_t>* file) const override {
    file->assign(r.data, r.data + r.size);  // the bytes as packed
    return Status::OK();
  }

  Status DecodeCrop(Context& ctx, const RecordView& r, const CropRect& rect, const CropDecode& how,
                    Region* out) const override {
    const IndexEntry& e = *r.entry;
    imaging::Limits limits;
    limits.max_pixels = how.max_pixels;
    imaging::Image& image = ctx.image;
    if (how.cropped) {
      // The crop is in upright coordinates; decode its preimage in the stored image (phone
      // photos are mostly stored rotated), then turn just that region upright.
      const bool swap = e.orientation >= 5 && e.orientation <= 8;
      const CropRect stored = StoredRect(rect, e.orientation, e.width, e.height);
      imaging::JpegRegion region{stored.x, stored.y, stored.width, stored.height, 0, 0};
      if (how.scaled) {
        region.min_width = swap ? how.out_height : how.out_width;
        region.min_height = swap ? how.out_width : how.out_height;
        region.any_scale = how.any_scale;
      }
      if (e.orientation <= 1) {
        // Upright already: resize straight from the rows libjpeg wrote (no row copy).
        imaging::Decoder::RowLayout rows;
        SF_RETURN_IF_ERROR(ctx.decoder.DecodeJpegRegion(r.data, r.size, region, &image, limits,
                                                        nullptr, false, &rows));
        *out = Region{image.pixels.data() + rows.offset, image.width, image.height, rows.stride};
        return Status::OK();
      }
      SF_RETURN_IF_ERROR(ctx.decoder.DecodeJpegRegion(r.data, r.size, region, &image, limits));
      imaging::ApplyOrientation(&image, e.orientation);
      *out = Region{image.pixels.data(), image.width, image.height, size_t{image.width} * 3};
      return Status::OK();
    }
    // Cropped decoding off: decode whole, turn upright, then crop.
    SF_RETURN_IF_ERROR(ctx.decoder.Decode(r.data, r.size, &image, limits));
    const bool swap = e.orientation >= 5 && e.orientation <= 8;
    if (image.width != (swap ? e.height : e.width) || image.height != (swap ? e.width : e.height) ||
        uint64_t{rect.x} + rect.width > image.width ||
        uint64_t{rect.y} + rect.height > image.height) {
      return Status::Corrupt("decoded size differs from the index");
    }
    *out = Region{image.pixels.data() + (size_t{rect.y} * image.width + rect.x) * 3, rect.width,
                  rect.height, size_t{image.width} * 3};
    return Status::OK();
  }
};

// ---- pixel records: decoded RGB, raw or one zstd frame each ---------------------------------

class PixelCodec final : public Codec {
 public:
  explicit PixelCodec(bool compressed) : compressed_(compressed) {}
  Encoding encoding() const override { return compressed_ ? Encoding::kZstd : Encoding::kRaw; }
  const char* description() const override {
    return compressed_ ? "decoded RGB pixels, one zstd frame per record"
                       : "decoded RGB pixels (read straight from the mapping)";
  }
  bool FixedShape(const EncodeOptions& o, uint32_t* side) const override {
    if (o.size == 0 || !o.center_crop) return false;
    *side = o.size;
    return true;
  }
  bool CapsResolution(const EncodeOptions&) const override { return false; }

  Status Encode(Context& ctx, const EncodeOptions& o, imaging::Bytes* payload, IndexEntry* e,
                bool* resized) const override {
    *resized = false;
    if (imaging::SniffFormat(payload->data(), payload->size()) == imaging::ImageFormat::kUnknown) {
      return Status::Unsupported("not an image (unrecognised file signature)");
    }
    imaging::Image& img = ctx.scratch;
    SF_RETURN_IF_ERROR(
        DecodeForPixels(ctx.decoder, payload->data(), payload->size(), o, &img, &ctx.image));
    if (img.width > 65535 || img.height > 65535) {
      return Status::Unsupported("image of ", img.width, "x", img.height,
                                 " is too large for a raw record (pass --size)");
    }
    e->height = static_cast<uint16_t>(img.height);
    e->width = static_cast<uint16_t>(img.width);
    e->channels = 3;
    e->orientation = 1;
    e->flags = 0;
    if (!compressed_) {
      payload->swap(img.pixels);  // buffers trade places: no copy
      return Status::OK();
    }
    payload->resize(ZSTD_compressBound(img.pixels.size()));
    const size_t n = ZSTD_compressCCtx(ctx.zstd->c, payload->data(), payload->size(),
                                       img.pixels.data(), img.pixels.size(), o.level);
    if (ZSTD_isError(n)) return Status::Internal("zstd: ", ZSTD_getErrorName(n));
    payload->resize(n);
    return Status::OK();
  }

  Status Decode(Context& ctx, const RecordView& r, const imaging::Limits&, bool,
                imaging::Image* out) const override {
    out->Resize(r.entry->width, r.entry->height, 3);
    return format::ReadPixelRecord(r, ctx.zstd->d, out->pixels.data());
  }

  Status Check(Context& ctx, const RecordView& r, const imaging::Limits&) const override {
    ctx.pixels.resize(format::PixelBytes(*r.entry));
    return format::ReadPixelRecord(r, ctx.zstd->d, ctx.pixels.data());
  }

  const char* file_extension() const override { return ".png"; }
  Status ExtractFile(Context& ctx, const RecordView& r, std::vector<uint8_t>* file) const override {
    SF_RETURN_IF_ERROR(Decode(ctx, r, {}, true, &ctx.image));
    SF_ASSIGN_OR_RETURN(*file, imaging::EncodePng(ctx.image));
    return Status::OK();
  }

  Status DecodeCrop(Context& ctx, const RecordView& r, const CropRect& rect, const CropDecode&,
                    Region* out) const override {
    const IndexEntry& e = *r.entry;
    // Raw records are resized straight from the map; only zstd needs a decoded copy.
    const uint8_t* pixels = r.data;
    if (compressed_ || e.channels != 3 || r.size != format::PixelBytes(e)) {
      ctx.pixels.resize(format::PixelBytes(e));
      SF_RETURN_IF_ERROR(format::ReadPixelRecord(r, ctx.zstd->d, ctx.pixels.data()));
      pixels = ctx.pixels.data();
    }
    if (uint64_t{rect.x} + rect.width > e.width || uint64_t{rect.y} + rect.height > e.height) {
      return Status::InvalidArgument("crop outside the record");
    }
    *out = Region{pixels + (size_t{rect.y} * e.width + rect.x) * 3, rect.width, rect.height,
                  size_t{e.width} * 3};
    return Status::OK();
  }

 private:
  bool compressed_;
};

}  // namespace

Result<const Codec*> CodecFor(Encoding encoding) {
  static const JpegCodec jpeg;
  static const PixelCodec raw(false), zstd(true);
  switch (encoding) {
    case Encoding::kJpeg:
      return &jpeg;
    case Encoding::kRaw:
      return &raw;
    case Encoding::kZstd:
      return &zstd;
  }
  return Status::Corrupt("unknown encoding ", static_cast<int>(encoding));
}

Result<const Codec*> CodecFor(const IndexEntry& entry) {
  return CodecFor(static_cast<Encoding>(entry.encoding));
}

}  // namespace shardfeed::codec
