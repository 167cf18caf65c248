#include "shardfeed/validate/inspect.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fields_io.h"
#include "sample_context.h"
#include "shardfeed/codec/codec.h"
#include "shardfeed/imaging/image.h"

namespace shardfeed::validate {
namespace {

using nlohmann::json;

struct Summary {
  uint64_t payload = 0, pixels = 0;
  uint32_t min_h = UINT32_MAX, max_h = 0, min_w = UINT32_MAX, max_w = 0;
};

Summary Summarize(const format::Archive& archive) {
  Summary s;
  for (uint64_t i = 0; i < archive.size(); ++i) {
    auto r = archive.At(i);
    if (!r.ok()) continue;  // counted by verify; inspect summarises what can be read
    const format::IndexEntry& e = *r->entry;
    s.payload += e.size;
    s.pixels += uint64_t{e.height} * e.width * 3;
    // Upright (EXIF orientation applied), as the manifest's shape and what a read gives.
    const uint32_t h = format::UprightHeight(e), w = format::UprightWidth(e);
    s.min_h = std::min(s.min_h, h);
    s.max_h = std::max(s.max_h, h);
    s.min_w = std::min(s.min_w, w);
    s.max_w = std::max(s.max_w, w);
  }
  if (archive.size() == 0) s.min_h = s.min_w = 0;
  return s;
}

}  // namespace

std::string Printable(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool valid = len > 0 && i + len <= text.size();
    for (size_t k = 1; valid && k < len; ++k) valid = (text[i + k] & 0xC0) == 0x80;
    uint32_t code = 0;  // the code point, when valid
    if (valid) {
      code = len == 1 ? c : c & (0xFF >> (len + 1));
      for (size_t k = 1; k < len; ++k) code = (code << 6) | (text[i + k] & 0x3F);
    }
    // C1 controls, and the bidirectional formatting characters that reorder what a terminal
    // shows (U+202E makes "gpj.exe" read as "exe.jpg"): shown escaped like C0 controls.
    const bool hidden = (code >= 0x80 && code <= 0x9F) || code == 0x61C || code == 0x200E ||
                        code == 0x200F || (code >= 0x202A && code <= 0x202E) ||
                        (code >= 0x2066 && code <= 0x2069);
    if (!valid || c < 0x20 || c == 0x7F || c == '\\' || hidden) {
      const size_t n = valid && hidden ? len : 1;
      for (size_t k = 0; k < n; ++k) {
        const unsigned char b = static_cast<unsigned char>(text[i + k]);
        char buf[8];
        std::snprintf(buf, sizeof(buf), b == '\\' ? "\\\\" : "\\x%02x", b);
        out += buf;
      }
      i += n;
      continue;
    }
    out.append(text, i, len);
    i += len;
  }
  return out;
}

std::string InspectJson(const format::Archive& archive) {
  const format::Manifest& m = archive.manifest();
  Summary s = Summarize(archive);
  json classes = json::array();
  // Without a class field (COCO: the names of per-box labels) no sample has a class: count null.
  const bool per_sample = archive.schema().label_field() >= 0;
  for (size_t c = 0; c < m.class_names.size(); ++c) {
    classes.push_back(
        {{"label", c},
         {"name", m.class_names[c]},
         {"count", per_sample ? json(c < m.class_counts.size() ? m.class_counts[c] : 0) : json()}});
  }
  json fields = json::array();
  for (const FieldSize& f : FieldSizes(archive)) {
    json v = {{"name", f.name}, {"type", f.type}, {"stored", f.stored}, {"bytes", f.bytes}};
    if (!f.per.empty()) v["per"] = f.per;
    if (f.rows) v["rows"] = f.rows;
    fields.push_back(std::move(v));
  }
  json shards = json::array();
  for (const auto& sh : m.shards) {
    shards.push_back({{"file", sh.file}, {"samples", sh.sample_count}, {"bytes", sh.file_bytes}});
  }
  json j = {
      {"archive", archive.path()},
      {"format_version", m.format_version},
      {"backend", std::string(format::BackendName(m.backend))},
      {"encoding", std::string(format::EncodingName(m.encoding))},
      {"samples", m.sample_count},
      {"classes", classes},
      {"fields", fields},
      {"shape", m.height ? json::array({m.height, m.width, m.channels}) : json(nullptr)},
      {"height_range", {s.min_h, s.max_h}},
      {"width_range", {s.min_w, s.max_w}},
      {"payload_bytes", s.payload},
      {"bytes_on_disk", archive.FileBytes()},
      {"decoded_bytes", s.pixels},
      {"source_bytes", m.source_bytes},
      {"resized_records", m.resized_records ? json(*m.resized_records) : json(nullptr)},
      {"reencoded_records", m.reencoded_records ? json(*m.reencoded_records) : json(nullptr)},
      {"compression_ratio", s.payload ? double(s.pixels) / double(s.payload) : 0.0},
      {"shards", shards},
      {"created_by", m.created_by},
      {"created_at", m.created_at},
  };
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string InspectText(const format::Archive& archive) {
  const format::Manifest& m = archive.manifest();
  Summary s = Summarize(archive);
  std::ostringstream o;
  auto mb = [](uint64_t b) { return double(b) / 1e6; };
  o << "archive:     " << Printable(archive.path()) << "\n";
  o << "format:      shardfeed v" << m.format_version << ", " << format::BackendName(m.backend)
    << ", " << m.shards.size() << " shard(s)\n";
  o << "encoding:    " << format::EncodingName(m.encoding);
  if (auto c = codec::CodecFor(m.encoding); c.ok()) o << " (" << (*c)->description() << ")";
  o << "\n";
  o << "samples:     " << m.sample_count << "\n";
  if (m.height) {
    o << "shape:       " << m.height << "x" << m.width << "x" << m.channels << " (fixed)\n";
  } else {
    o << "shape:       variable, height " << s.min_h << ".." << s.max_h << ", width " << s.min_w
      << ".." << s.max_w << "\n";
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "bytes:       %.2f MB on disk, %.2f MB of records, %.2f MB of source files\n"
                "compression: %.2fx (decoded RGB bytes / record bytes)\n",
                mb(archive.FileBytes()), mb(s.payload), mb(m.source_bytes),
                s.payload ? double(s.pixels) / double(s.payload) : 0.0);
  o << buf;
  if (m.resized_records) {
    // The cap is in the recorded pack options.
    json opts = json::parse(m.options_json.empty() ? "{}" : m.options_json, nullptr, false);
    std::string cap;
    if (opts.is_object() && opts.contains("size") && opts["size"].is_number_unsigned()) {
      const bool long_side = opts.value("max_side", false);
      cap = " (" + std::string(long_side ? "long" : "short") + " side over " +
            std::to_string(opts["size"].get<uint64_t>()) + " px" +
            (opts.contains("quality") ? ", re-encoded at quality " + opts["quality"].dump() : "") +
            ")";
    }
    o << "resized:     " << *m.resized_records << " of " << m.sample_count
      << " records decoded, resized and re-encoded at pack" << cap
      << (m.reencoded_records ? "" : "; the others are the source files' bytes") << "\n";
  }
  if (m.reencoded_records) {
    o << "re-encoded:  " << *m.reencoded_records << " of " << m.sample_count
      << " records decoded and stored again at pack ("
      << (m.encoding == format::Encoding::kJpeg ? "as JPEG, lossy" : "as pixels, lossless")
      << "); the others hold their source files' bytes\n";
  }
  o << "fields:      " << m.schema.size() << "\n";
  for (const FieldSize& f : FieldSizes(archive)) {
    std::snprintf(buf, sizeof(buf), "  %-14s %-16s ", Printable(f.name).c_str(),
                  (f.type + (f.per.empty() ? "" : " per " + f.per)).c_str());
    o << buf;
    if (f.stored == "index") {
      o << "the class field (in the index)\n";
      continue;
    }
    std::snprintf(buf, sizeof(buf), "%10.3f MB in %s, %.1f bytes/sample", mb(f.bytes),
                  f.stored.c_str(), m.sample_count ? double(f.bytes) / m.sample_count : 0.0);
    o << buf;
    if (f.rows) o << ", " << f.rows << " rows";
    o << "\n";
  }
  const bool per_sample = archive.schema().label_field() >= 0;
  o << "classes:     " << m.class_names.size()
    << (per_sample || m.class_names.empty() ? "" : " (names of per-box labels; no class field)")
    << "\n";
  for (size_t c = 0; c < m.class_names.size(); ++c) {
    o << "  " << c << "\t"
      << (!per_sample ? std::string("-")
                      : std::to_string(c < m.class_counts.size() ? m.class_counts[c] : 0))
      << "\t" << Printable(m.class_names[c]) << "\n";
  }
  return o.str();
}

Status DecodeSample(const format::Archive& archive, uint64_t index, imaging::Image* out,
                    uint64_t max_pixels) {
  auto decode = [&]() -> Status {
    // The record's own checksum: its typed fields are not read here (a damaged caption is the
    // error of what reads the caption, as the loader's fields=[] reads the image alone).
    SF_RETURN_IF_ERROR(archive.VerifyRecord(index, /*fields=*/false));
    SF_ASSIGN_OR_RETURN(const format::RecordView r, archive.At(index));
    SF_RETURN_IF_ERROR(format::CheckPixelLimit(*r.entry, max_pixels));
    SF_ASSIGN_OR_RETURN(const codec::Codec* c, codec::CodecFor(*r.entry));
    codec::Context ctx;
    imaging::Limits limits;
    limits.max_pixels = max_pixels;
    return c->Decode(ctx, r, limits, /*strict=*/false, out);
  };
  return ForSample(archive.path(), index, decode());
}

void DrawTile(imaging::Image* sheet, uint32_t x0, uint32_t y0, uint32_t tile,
              const imaging::Image* img, TilePlacement* placed) {
  const bool ok = img != nullptr;
  for (uint32_t y = 0; y < tile; ++y) {
    uint8_t* row = sheet->pixels.data() + (size_t{y0 + y} * sheet->width + x0) * 3;
    for (uint32_t x = 0; x < tile; ++x) {
      row[3 * x] = ok ? 225 : 220;
      row[3 * x + 1] = ok ? 225 : 40;
      row[3 * x + 2] = ok ? 225 : 40;
    }
  }
  if (ok && img->width > 0 && img->height > 0) {
    const double s = std::min(double(tile) / img->width, double(tile) / img->height);
    const uint32_t tw = std::max<uint32_t>(1, static_cast<uint32_t>(img->width * s));
    const uint32_t th = std::max<uint32_t>(1, static_cast<uint32_t>(img->height * s));
    const uint32_t tx = x0 + (tile - tw) / 2, ty = y0 + (tile - th) / 2;
    imaging::ResizeInto(img->pixels.data(), img->width, img->height, 0, 3,
                        sheet->pixels.data() + (size_t{ty} * sheet->width + tx) * 3, tw, th,
                        size_t{sheet->width} * 3);
    if (placed) *placed = {tx, ty, tw, th};
  }
}

namespace {

// Boxes (outlines in a colour per box), the mask (tinted) and the caption of a tile's sample,
// drawn over its thumbnail at `p` (the image was `w` x `h` upright pixels).
void DrawOverlay(imaging::Image* sheet, const TilePlacement& p, uint32_t w, uint32_t h,
                 const SampleOverlay& overlay) {
  if (p.width == 0 || w == 0 || h == 0) return;
  const double sx = double(p.width) / w, sy = double(p.height) / h;
  auto put = [&](int64_t x, int64_t y, const uint8_t* rgb, int alpha) {
    if (x < p.x || y < p.y || x >= int64_t{p.x} + p.width || y >= int64_t{p.y} + p.height) return;
    uint8_t* px = sheet->pixels.data() + (size_t(y) * sheet->width + size_t(x)) * 3;
    for (int c = 0; c < 3; ++c) px[c] = uint8_t((px[c] * (256 - alpha) + rgb[c] * alpha) >> 8);
  };
  if (overlay.mask.size() == size_t{w} * h) {
    static constexpr uint8_t kTint[3] = {255, 0, 255};
    for (uint32_t y = 0; y < p.height; ++y) {
      for (uint32_t x = 0; x < p.width; ++x) {
        const uint32_t mx = std::min<uint32_t>(w - 1, uint32_t(x / sx));
        const uint32_t my = std::min<uint32_t>(h - 1, uint32_t(y / sy));
        if (overlay.mask[size_t{my} * w + mx]) put(p.x + x, p.y + y, kTint, 110);
      }
    }
  }
  static constexpr uint8_t kColours[4][3] = {
      {255, 40, 40}, {40, 200, 40}, {40, 90, 255}, {255, 170, 0}};
  // A pixel coordinate clamped to one pixel beyond the tile on either side (where `put` draws
  // nothing): a box edge at 1e15 or -inf costs a tile's width, not 1e15 steps; NaN draws none.
  auto at = [](double v, int64_t from, uint32_t size) {
    return v < double(from - 1) ? from - 1 : v > double(from + size) ? from + size : int64_t(v);
  };
  for (size_t b = 0; b + 3 < overlay.boxes.size(); b += 4) {
    const uint8_t* rgb = kColours[(b / 4) % 4];
    const float* box = overlay.boxes.data() + b;
    if (!(std::isfinite(box[0]) && std::isfinite(box[1]) && std::isfinite(box[2]) &&
          std::isfinite(box[3]))) {
      continue;
    }
    const int64_t x0 = at(p.x + box[0] * sx, p.x, p.width);
    const int64_t y0 = at(p.y + box[1] * sy, p.y, p.height);
    const int64_t x1 = at(p.x + box[2] * sx - 1, p.x, p.width);
    const int64_t y1 = at(p.y + box[3] * sy - 1, p.y, p.height);
    for (int64_t x = x0; x <= x1; ++x) put(x, y0, rgb, 256), put(x, y1, rgb, 256);
    for (int64_t y = y0; y <= y1; ++y) put(x0, y, rgb, 256), put(x1, y, rgb, 256);
  }
}

// The sheet's rows: a class and its first samples, or (no class field) runs of samples in
// archive order.
struct SheetRow {
  std::string label;
  std::vector<uint64_t> samples;
};

Result<std::vector<SheetRow>> SheetRows(const format::Archive& archive,
                                        const ContactSheetOptions& o) {
  const format::Manifest& m = archive.manifest();
  std::vector<SheetRow> rows;
  // Rows of classes only where samples have one: a COCO archive's class names are its boxes'
  // categories, and every sample went to the first one's row.
  if (m.class_names.empty() || archive.schema().label_field() < 0) {
    const uint64_t n = std::min<uint64_t>(archive.size(), uint64_t{o.per_class} * 8);
    for (uint64_t i = 0; i < n; ++i) {
      if (i % o.per_class == 0) rows.push_back({"#" + std::to_string(i), {}});
      rows.back().samples.push_back(i);
    }
    if (rows.empty()) return Status::InvalidArgument(archive.path(), ": no samples to show");
    return rows;
  }
  const size_t classes = std::min<size_t>(m.class_names.size(), o.max_classes);
  rows.resize(classes);
  for (size_t c = 0; c < classes; ++c) rows[c].label = std::to_string(c) + " " + m.class_names[c];
  // The first per_class samples of each class, in archive order (one pass over the index).
  size_t full = 0;
  for (uint64_t i = 0; i < archive.size() && full < classes; ++i) {
    SF_ASSIGN_OR_RETURN(const format::RecordView r, archive.At(i));
    const size_t label = static_cast<size_t>(r.entry->label);
    if (label < classes && rows[label].samples.size() < o.per_class) {
      rows[label].samples.push_back(i);
      full += rows[label].samples.size() == o.per_class;
    }
  }
  return rows;
}

}  // namespace

Result<imaging::Image> ContactSheet(const format::Archive& archive, const ContactSheetOptions& o) {
  if (o.per_class == 0 || o.per_class > 64) {
    return Status::InvalidArgument("per_class (--per-class) must be in 1..64, not ", o.per_class);
  }
  if (o.tile < 16 || o.tile > 512) {
    return Status::InvalidArgument("size (--size) must be in 16..512, not ", o.tile);
  }
  SF_ASSIGN_OR_RETURN(const std::vector<SheetRow> rows, SheetRows(archive, o));
  // A folder pack's fields (image, label, path) have no caption: its sheet stays as before.
  const bool captions = !archive.schema().legacy() &&
                        archive.schema().ToJson() != format::Schema::ImageFolder().ToJson();
  // Layout: a label column, then tiles with a caption line (or two: index, then text) beneath.
  const uint32_t pad = 6, line = imaging::kTextCellHeight + 2;
  const uint32_t caption = line * (captions ? 2 : 1) + 2;
  size_t longest = 0;
  for (const SheetRow& r : rows) longest = std::max(longest, r.label.size());
  const uint32_t label_w =
      static_cast<uint32_t>(std::min<size_t>(longest, 28) * imaging::kTextCellWidth) + 2 * pad;
  const uint32_t row_h = o.tile + caption + pad;
  imaging::Image sheet;
  sheet.Resize(label_w + o.per_class * (o.tile + pad) + pad,
               static_cast<uint32_t>(rows.size()) * row_h + pad, 3);
  std::fill(sheet.pixels.begin(), sheet.pixels.end(), uint8_t{255});
  const uint8_t black[3] = {0, 0, 0}, grey[3] = {90, 90, 90};
  const size_t chars = o.tile / imaging::kTextCellWidth;
  imaging::Image img;
  for (size_t c = 0; c < rows.size(); ++c) {
    const uint32_t y0 = pad + static_cast<uint32_t>(c) * row_h;
    std::string label = Printable(rows[c].label);
    if (label.size() > 28) label = label.substr(0, 27) + "~";
    imaging::DrawText(&sheet, pad, y0 + (o.tile - imaging::kTextCellHeight) / 2, label, 1, black);
    for (size_t k = 0; k < rows[c].samples.size(); ++k) {
      const uint64_t index = rows[c].samples[k];
      const uint32_t x0 = label_w + static_cast<uint32_t>(k) * (o.tile + pad);
      const bool ok = DecodeSample(archive, index, &img).ok();
      TilePlacement placed;
      DrawTile(&sheet, x0, y0, o.tile, ok ? &img : nullptr, &placed);
      imaging::DrawText(&sheet, x0, y0 + o.tile + 2, "#" + std::to_string(index), 1, grey);
      if (!ok || !captions) continue;
      auto overlay = Overlay(archive, index);
      if (!overlay.ok()) continue;  // the tile shows the image; verify reports the field
      DrawOverlay(&sheet, placed, img.width, img.height, *overlay);
      std::string text = Printable(overlay->caption);
      if (text.size() > chars) text = text.substr(0, chars ? chars - 1 : 0) + "~";
      imaging::DrawText(&sheet, x0, y0 + o.tile + 2 + line, text, 1, black);
    }
  }
  return sheet;
}

}  // namespace shardfeed::validate
