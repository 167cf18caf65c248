#include "shardfeed/codec/codec.h"

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>

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

namespace {

// The source of `data` as stored and its orientation (only JPEGs have one: imaging/image.h),
// given `decoded`, its full-size upright decode when it is not a JPEG.
Status SourceFrame(const uint8_t* data, size_t size, const imaging::Image& decoded,
                   const imaging::Limits& limits, Reshape* r) {
  r->kept = false;
  r->orientation = 1;
  r->source_width = decoded.width, r->source_height = decoded.height;
  if (imaging::SniffFormat(data, size) != imaging::ImageFormat::kJpeg) return Status::OK();
  SF_ASSIGN_OR_RETURN(imaging::JpegInfo info, imaging::ProbeJpeg(data, size, false, limits));
  r->source_width = info.width, r->source_height = info.height;
  r->orientation = info.orientation;
  return Status::OK();
}

// The whole of an upright decode of `w` x `h`, uncropped.
void Via(uint32_t w, uint32_t h, Reshape* r) {
  r->via_width = r->crop_width = w;
  r->via_height = r->crop_height = h;
  r->crop_x = r->crop_y = 0;
}

}  // namespace

Status DecodeForPixels(imaging::Decoder& decoder, const uint8_t* data, size_t size,
                       const EncodeOptions& options, imaging::Image* out, imaging::Image* scratch,
                       Reshape* reshape) {
  Reshape local_reshape;
  Reshape& r = reshape ? *reshape : local_reshape;
  if (options.size == 0) {
    SF_RETURN_IF_ERROR(decoder.Decode(data, size, out, options.limits, /*strict=*/true));
    Via(out->width, out->height, &r);
    return SourceFrame(data, size, *out, options.limits, &r);
  }
  imaging::Image local;
  imaging::Image& full = scratch ? *scratch : local;
  SF_RETURN_IF_ERROR(
      decoder.DecodeAtLeast(data, size, options.size, &full, options.limits, /*strict=*/true));
  SF_RETURN_IF_ERROR(SourceFrame(data, size, full, options.limits, &r));
  // The output's size from the source, upright (not the DCT-scaled decode's).
  imaging::ResizeShortSide(full, options.size, options.center_crop, out, r.upright_width(),
                           r.upright_height());
  Via(full.width, full.height, &r);
  if (options.center_crop) {  // ResizeShortSide's crop: the centre square of the short side
    const uint32_t side = std::min(full.width, full.height);
    r.crop_x = (full.width - side) / 2, r.crop_y = (full.height - side) / 2;
    r.crop_width = r.crop_height = side;
  }
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

// A JPEG record's JPEG bytes and, when it is indexed, its region index.
struct JpegPayload {
  const uint8_t* data = nullptr;
  size_t size = 0;
  bool indexed = false;
  imaging::JpegRowIndex index;
};

// Splits an indexed record (layout.h, JpegRegionIndex) into its JPEG and its row table, checking
// the trailer and the table's checksum; any other record is its JPEG as a whole.
Status SplitJpeg(const RecordView& r, JpegPayload* out) {
  *out = JpegPayload{r.data, r.size, false, {}};
  if (!(r.entry->flags & format::kFlagJpegIndexed)) return Status::OK();
  format::JpegRegionIndex t;
  if (r.size < sizeof(t)) return Status::Corrupt("indexed JPEG record too short for its index");
  std::memcpy(&t, r.data + r.size - sizeof(t), sizeof(t));
  const uint64_t table = uint64_t{t.mcu_rows} * 4;
  if (std::memcmp(t.magic, format::kJpegRegionIndexMagic, 4) != 0 || t.reserved != 0 ||
      t.mcu_rows == 0 || t.restart_interval == 0 ||
      uint64_t{t.jpeg_size} + table + sizeof(t) != r.size ||
      uint64_t{t.scan_end} + 2 > t.jpeg_size) {
    return Status::Corrupt("indexed JPEG record has a damaged region index");
  }
  const uint8_t* rows = r.data + t.jpeg_size;
  if (static_cast<uint32_t>(XXH3_64bits(rows, table)) != t.table_checksum) {
    return Status::Corrupt("indexed JPEG record: region index checksum mismatch");
  }
  *out = JpegPayload{r.data, t.jpeg_size, true, {rows, t.mcu_rows, t.restart_interval, t.scan_end}};
  return Status::OK();
}

// Re-lays `payload` (a JPEG) with restart markers and appends its region index. False when
// libjpeg cannot transcode it cleanly: the payload is then left as it was.
bool IndexJpeg(Context& ctx, const imaging::Limits& limits, imaging::Bytes* payload) {
  if (!imaging::RelayoutJpeg(payload->data(), payload->size(), limits, &ctx.jpeg, &ctx.layout)
           .ok()) {
    return false;
  }
  const imaging::JpegRestartLayout& l = ctx.layout;
  format::JpegRegionIndex t{};
  t.jpeg_size = static_cast<uint32_t>(ctx.jpeg.size());
  t.mcu_rows = l.mcu_rows;
  t.scan_end = l.scan_end;
  t.restart_interval = static_cast<uint16_t>(l.restart_interval);
  std::memcpy(t.magic, format::kJpegRegionIndexMagic, 4);
  const size_t table = size_t{l.mcu_rows} * 4;
  payload->resize(ctx.jpeg.size() + table + sizeof(t));
  uint8_t* p = payload->data();
  std::memcpy(p, ctx.jpeg.data(), ctx.jpeg.size());
  std::memcpy(p + ctx.jpeg.size(), l.row_offsets.data(), table);  // little-endian host
  t.table_checksum = static_cast<uint32_t>(XXH3_64bits(p + ctx.jpeg.size(), table));
  std::memcpy(p + ctx.jpeg.size() + table, &t, sizeof(t));
  return true;
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
    ctx.reshape = Reshape{};
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
        if (o.jpeg_indexed && IndexJpeg(ctx, o.limits, payload))
          e->flags |= format::kFlagJpegIndexed;
        return Status::OK();  // the payload is the file (or its re-layout), already in place
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
    Reshape& r = ctx.reshape;
    SF_RETURN_IF_ERROR(SourceFrame(source.data(), source.size(), full, o.limits, &r));
    Via(full.width, full.height, &r);
    const uint32_t upright_w = r.upright_width(), upright_h = r.upright_height();
    uint32_t w = 0, h = 0;  // from the source: a DCT-scaled decode's size rounds differently
    CappedSize(upright_w, upright_h, o, &w, &h);
    const imaging::Image* img = &full;
    if (w != full.width || h != full.height) {
      ctx.scratch.Resize(w, h, 3);
      imaging::ResizeInto(full.pixels.data(), full.width, full.height, 0, 3,
                          ctx.scratch.pixels.data(), w, h);
      img = &ctx.scratch;
    }
    // Smaller than the source: also when DCT scaling at decode did all of it (it used to be
    // counted only when a resize followed).
    *resized = w != upright_w || h != upright_h;
    SF_ASSIGN_OR_RETURN(std::vector<uint8_t> jpeg, imaging::EncodeJpeg(*img, o.quality));
    e->height = static_cast<uint16_t>(img->height);
    e->width = static_cast<uint16_t>(img->width);
    e->channels = 3;
    e->orientation = 1;  // upright now
    e->flags = 0;
    payload->assign(jpeg.begin(), jpeg.end());
    if (o.jpeg_indexed && IndexJpeg(ctx, o.limits, payload)) e->flags |= format::kFlagJpegIndexed;
    return Status::OK();
  }

  Status Decode(Context& ctx, const RecordView& r, const imaging::Limits& limits, bool strict,
                imaging::Image* out) const override {
    // An archive's JPEG record is known to be a JPEG: anything else is damage (kCorrupt).
    JpegPayload j;
    SF_RETURN_IF_ERROR(SplitJpeg(r, &j));
    SF_RETURN_IF_ERROR(
        ctx.decoder.DecodeJpegRegion(j.data, j.size, {}, out, limits, nullptr, strict));
    imaging::ApplyOrientation(out, r.entry->orientation);
    return Status::OK();
  }

  Status Check(Context& ctx, const RecordView& r, const imaging::Limits& limits) const override {
    imaging::Image& img = ctx.image;
    JpegPayload j;
    SF_RETURN_IF_ERROR(SplitJpeg(r, &j));
    SF_RETURN_IF_ERROR(
        ctx.decoder.DecodeJpegRegion(j.data, j.size, {}, &img, limits, nullptr, /*strict=*/true));
    if (img.width != r.entry->width || img.height != r.entry->height) {
      return Status::Corrupt("decoded ", img.width, "x", img.height, ", index says ",
                             r.entry->width, "x", r.entry->height);
    }
    if (!j.indexed) return Status::OK();
    // The stored region index must describe the bitstream exactly.
    imaging::JpegRestartLayout& l = ctx.layout;
    SF_RETURN_IF_ERROR(imaging::ScanRestartLayout(j.data, j.size, &l));
    if (l.mcu_rows != j.index.mcu_rows || l.restart_interval != j.index.restart_interval ||
        l.scan_end != j.index.scan_end) {
      return Status::Corrupt("region index does not match the JPEG (rows, interval or scan end)");
    }
    for (uint32_t row = 0; row < l.mcu_rows; ++row) {
      uint32_t stored;
      std::memcpy(&stored, j.index.row_offsets + 4 * size_t{row}, 4);
      if (stored != l.row_offsets[row]) {
        return Status::Corrupt("region index: MCU row ", row, " starts at byte ",
                               l.row_offsets[row], ", index says ", stored);
      }
    }
    return Status::OK();
  }

  const char* file_extension() const override { return ".jpg"; }
  Status ExtractFile(Context&, const RecordView& r, std::vector<uint8_t>* file) const override {
    JpegPayload j;
    SF_RETURN_IF_ERROR(SplitJpeg(r, &j));
    file->assign(j.data, j.data + j.size);  // the JPEG as packed (without a region index)
    return Status::OK();
  }

  Status DecodeCrop(Context& ctx, const RecordView& r, const CropRect& rect, const CropDecode& how,
                    Region* out) const override {
    const IndexEntry& e = *r.entry;
    imaging::Limits limits;
    limits.max_pixels = how.max_pixels;
    imaging::Image& image = ctx.image;
    JpegPayload j;
    SF_RETURN_IF_ERROR(SplitJpeg(r, &j));
    if (how.cropped) {
      // The crop is in upright coordinates; decode its preimage in the stored image (phone
      // photos are mostly stored rotated), then turn just that region upright.
      const bool swap = e.orientation >= 5 && e.orientation <= 8;
      const CropRect stored = StoredRect(rect, e.orientation, e.width, e.height);
      imaging::JpegRegion region{stored.x, stored.y, stored.width, stored.height, 0, 0};
      region.exact = true;  // a pixel of context a side where chroma upsampling needs it
      if (how.scaled) {
        region.min_width = swap ? how.out_height : how.out_width;
        region.min_height = swap ? how.out_width : how.out_height;
        region.any_scale = how.any_scale;
      }
      const uint8_t* data = j.data;
      size_t size = j.size;
      if (j.indexed) {
        // Entropy-decode only the restart segments the region overlaps: a small JPEG of them,
        // whose decode at the same scale holds the region's pixels bit for bit. A region that
        // needs nearly every MCU the stored decode reads decodes from the stored JPEG as an
        // original-layout record does.
        uint32_t x0 = 0, y0 = 0;
        bool worthwhile = false;
        SF_RETURN_IF_ERROR(imaging::BuildRegionJpeg(j.data, j.size, j.index, region, &ctx.jpeg, &x0,
                                                    &y0, &worthwhile));
        if (worthwhile) {
          data = ctx.jpeg.data(), size = ctx.jpeg.size();
          region.x -= x0, region.y -= y0;
        }
      }
      if (e.orientation <= 1) {
        // Upright already: resize straight from the rows libjpeg wrote (no row copy).
        imaging::Decoder::RowLayout rows;
        SF_RETURN_IF_ERROR(ctx.decoder.DecodeJpegRegion(data, size, region, &image, limits, nullptr,
                                                        false, &rows));
        *out = Region{image.pixels.data() + rows.offset, image.width, image.height, rows.stride};
        return Status::OK();
      }
      SF_RETURN_IF_ERROR(ctx.decoder.DecodeJpegRegion(data, size, region, &image, limits));
      imaging::ApplyOrientation(&image, e.orientation);
      *out = Region{image.pixels.data(), image.width, image.height, size_t{image.width} * 3};
      return Status::OK();
    }
    // Cropped decoding off: decode whole, turn upright, then crop.
    SF_RETURN_IF_ERROR(ctx.decoder.Decode(j.data, j.size, &image, limits));
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
    ctx.reshape = Reshape{};
    SF_RETURN_IF_ERROR(DecodeForPixels(ctx.decoder, payload->data(), payload->size(), o, &img,
                                       &ctx.image, &ctx.reshape));
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
    case Encoding::kAuto:  // a pack-time choice, never stored in a record
      break;
  }
  return Status::Corrupt("unknown encoding ", static_cast<int>(encoding));
}

Result<const Codec*> CodecFor(const IndexEntry& entry) {
  return CodecFor(static_cast<Encoding>(entry.encoding));
}

}  // namespace shardfeed::codec
