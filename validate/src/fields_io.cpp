#include "fields_io.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "shardfeed/imaging/image.h"

namespace shardfeed::validate {
namespace {

using format::FieldKind;
using format::FieldSpec;
using format::FieldView;
using nlohmann::json;

bool Stored(const format::Schema& schema, size_t f) {
  return static_cast<int>(f) != schema.image_field() && static_cast<int>(f) != schema.label_field();
}

Status FieldStatus(const FieldSpec& spec, const Status& s) {
  if (s.ok() || s.message().find("'" + spec.name + "'") != std::string::npos) return s;
  return Status(s.code(), "field '" + spec.name + "': " + s.message());
}

uint64_t Elements(const FieldView& v) {
  uint64_t n = 1;
  for (uint32_t d = 0; d < v.ndim; ++d) n *= v.dims[d];
  return n;
}

// Element e of an array view as a JSON number (the view may be unaligned: memcpy); NaN and
// infinities as they are (nlohmann writes them as null).
json Number(const FieldSpec& spec, const uint8_t* p, uint64_t e) {
  switch (spec.elem) {
    case format::ElemType::kUint8:
      return p[e];
    case format::ElemType::kInt32: {
      int32_t v;
      std::memcpy(&v, p + 4 * e, 4);
      return v;
    }
    case format::ElemType::kInt64: {
      int64_t v;
      std::memcpy(&v, p + 8 * e, 8);
      return v;
    }
    case format::ElemType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * e, 2);
      const int exp = (h >> 10) & 0x1F, man = h & 0x3FF;
      double v = exp == 0    ? std::ldexp(man, -24)
                 : exp == 31 ? (man ? NAN : INFINITY)
                             : std::ldexp(man + 1024, exp - 25);
      return (h & 0x8000) ? -v : v;
    }
    case format::ElemType::kFloat32: {
      float v;
      std::memcpy(&v, p + 4 * e, 4);
      return v;
    }
    case format::ElemType::kFloat64: {
      double v;
      std::memcpy(&v, p + 8 * e, 8);
      return v;
    }
  }
  return nullptr;
}

// Element e as JSON: a number, or for a float that is not finite the text "NaN", "Infinity" or
// "-Infinity", which the JSONL importer reads back (JSON has no such numbers, and null read
// back as NaN: an infinity came back NaN, and a NaN in a list was refused).
json Element(const FieldSpec& spec, const uint8_t* p, uint64_t e) {
  json v = Number(spec, p, e);
  if (!v.is_number_float() || std::isfinite(v.get<double>())) return v;
  const double d = v.get<double>();
  return std::isnan(d) ? "NaN" : d > 0 ? "Infinity" : "-Infinity";
}

// Nested lists of an array view, dims from the view (or the type's, for fixed fields).
json Nested(const FieldSpec& spec, const FieldView& v, uint32_t dim, uint64_t* e) {
  json out = json::array();
  for (uint32_t k = 0; k < v.dims[dim]; ++k) {
    out.push_back(dim + 1 == v.ndim ? Element(spec, v.data, (*e)++) : Nested(spec, v, dim + 1, e));
  }
  return out;
}

std::string Base64(const uint8_t* p, size_t n) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t b = (uint32_t{p[i]} << 16) | (i + 1 < n ? uint32_t{p[i + 1]} << 8 : 0) |
                       (i + 2 < n ? p[i + 2] : 0);
    out += kAlphabet[(b >> 18) & 63];
    out += kAlphabet[(b >> 12) & 63];
    out += i + 1 < n ? kAlphabet[(b >> 6) & 63] : '=';
    out += i + 2 < n ? kAlphabet[b & 63] : '=';
  }
  return out;
}

// The view of a fixed field carries no dims: give it the type's.
FieldView WithTypeDims(const FieldSpec& spec, FieldView v) {
  if (spec.kind == FieldKind::kArray && v.ndim == 0) {
    v.ndim = static_cast<uint32_t>(spec.dims.size());
    for (size_t d = 0; d < spec.dims.size(); ++d) v.dims[d] = static_cast<uint32_t>(spec.dims[d]);
  }
  return v;
}

}  // namespace

Status CheckSampleFields(const format::Archive& archive, uint64_t i, uint64_t max_pixels) {
  const format::Schema& schema = archive.schema();
  if (schema.legacy()) return Status::OK();
  SF_ASSIGN_OR_RETURN(const format::RecordView r, archive.At(i));
  std::vector<int64_t> box_rows(schema.size(), -1);  // rows of each boxes field
  std::vector<uint8_t> pixels;
  for (size_t f = 0; f < schema.size(); ++f) {
    if (!Stored(schema, f)) continue;
    const FieldSpec& spec = schema.fields()[f];
    // The first field checked verifies the var blob's checksum; the others read it again.
    auto view = archive.Field(i, f, /*verify=*/schema.VarSlot(f) == 0);
    if (!view.ok()) return FieldStatus(spec, view.status());
    const FieldView& v = *view;
    // What a writer refuses (UTF-8, JSON syntax and depth, finite boxes, shapes, per-box rows,
    // a mask's dims) is damage here: convert and extract would refuse it. A per field's boxes
    // field is declared before it: checked already, its rows known.
    if (spec.kind == FieldKind::kBoxes) box_rows[f] = v.dims[0];
    const int64_t rows = spec.per.empty() ? -1 : box_rows[schema.Find(spec.per)];
    if (Status st = format::CheckStoredValue(spec, v, r.entry->height, r.entry->width, rows);
        !st.ok()) {
      return Status::Corrupt(st.message());
    }
    if (spec.kind == FieldKind::kMask) {
      SF_RETURN_IF_ERROR(format::CheckPixelLimit(*r.entry, max_pixels));
      pixels.resize(size_t{v.dims[0]} * v.dims[1]);
      SF_RETURN_IF_ERROR(FieldStatus(spec, format::DecodeMask(v, pixels.data())));
    }
  }
  return Status::OK();
}

std::vector<FieldSize> FieldSizes(const format::Archive& archive) {
  const format::Schema& schema = archive.schema();
  std::vector<FieldSize> out;
  for (size_t f = 0; f < schema.size(); ++f) {
    const FieldSpec& spec = schema.fields()[f];
    FieldSize s{spec.name, spec.TypeName(), spec.per, "", 0, 0};
    if (static_cast<int>(f) == schema.image_field()) {
      s.stored = "records";
      for (uint64_t i = 0; i < archive.size(); ++i) {
        if (auto r = archive.At(i); r.ok()) s.bytes += r->size;
      }
    } else if (static_cast<int>(f) == schema.label_field()) {
      s.stored = "index";
    } else if (spec.fixed()) {
      s.stored = "column";
      s.bytes = spec.item_bytes() * archive.size();
    } else {
      s.stored = "blob";
      for (uint64_t i = 0; i < archive.size(); ++i) {
        auto v = archive.Field(i, f);
        if (!v.ok()) continue;  // verify reports it; inspect sums what reads
        s.bytes += v->size;
        if (spec.kind == FieldKind::kBoxes || !spec.per.empty()) s.rows += v->dims[0];
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

Result<json> FieldJson(const format::Archive& archive, uint64_t i, size_t f,
                       const MaskWriter& mask_file) {
  const format::Schema& schema = archive.schema();
  const FieldSpec& spec = schema.fields()[f];
  if (static_cast<int>(f) == schema.label_field()) {
    SF_ASSIGN_OR_RETURN(const format::RecordView r, archive.At(i));
    return json(r.entry->label);
  }
  auto view = archive.Field(i, f, /*verify=*/schema.VarSlot(f) == 0);
  if (!view.ok()) return FieldStatus(spec, view.status());
  const FieldView v = WithTypeDims(spec, *view);
  switch (spec.kind) {
    case FieldKind::kInt64:
    case FieldKind::kFloat32:
    case FieldKind::kFloat64:
      return Element(spec, v.data, 0);
    case FieldKind::kStr:
      return json(std::string(reinterpret_cast<const char*>(v.data), v.size));
    case FieldKind::kJson: {
      if (format::JsonDepth(v.data, v.size) > format::kMaxJsonDepth) {  // dump would recurse
        return Status::Corrupt("field '", spec.name, "': JSON nested deeper than ",
                               format::kMaxJsonDepth, " levels");
      }
      json j = json::parse(v.data, v.data + v.size, nullptr, false);
      if (j.is_discarded()) return Status::Corrupt("field '", spec.name, "': not valid JSON");
      return j;
    }
    case FieldKind::kBytes:
      return json{{"base64", Base64(v.data, v.size)}};
    case FieldKind::kMask: {
      std::vector<uint8_t> pixels(size_t{v.dims[0]} * v.dims[1]);
      SF_RETURN_IF_ERROR(FieldStatus(spec, format::DecodeMask(v, pixels.data())));
      return mask_file(f, pixels.data(), v.dims[0], v.dims[1]);
    }
    default: {
      uint64_t e = 0;
      if (Elements(v) == 0 || v.ndim == 0) return json::array();
      return Nested(spec, v, 0, &e);
    }
  }
}

namespace {

// min, max and mean of the finite values added one at a time; NaN and infinities are counted
// apart ("non_finite"): JSON has no number for them (nlohmann writes null, and a reader of the
// figures then fails), and one inf would make the mean inf.
struct Span {
  double min = INFINITY, max = -INFINITY, sum = 0;
  uint64_t n = 0, non_finite = 0;
  void Add(double v) {
    if (!std::isfinite(v)) {
      ++non_finite;
      return;
    }
    min = std::min(min, v), max = std::max(max, v), sum += v, ++n;
  }
  json Json() const {
    if (n == 0 && non_finite == 0) return nullptr;
    json j = n == 0 ? json::object() : json{{"min", min}, {"max", max}, {"mean", sum / double(n)}};
    if (non_finite) j["non_finite"] = non_finite;
    return j;
  }
};

}  // namespace

json FieldSummaries(const format::Archive& archive, const std::vector<bool>& left_out) {
  const format::Schema& schema = archive.schema();
  json out = json::object();
  for (size_t f = 0; f < schema.size(); ++f) {
    if (!Stored(schema, f)) continue;
    const FieldSpec& spec = schema.fields()[f];
    const bool numeric = spec.kind == FieldKind::kInt64 || spec.kind == FieldKind::kFloat32 ||
                         spec.kind == FieldKind::kFloat64 || spec.kind == FieldKind::kArray ||
                         spec.kind == FieldKind::kBoxes;
    const bool rowed =
        spec.kind == FieldKind::kBoxes || (spec.kind == FieldKind::kArray && !spec.fixed());
    Span rows, values, bytes;
    uint64_t samples = 0, errors = 0;
    for (uint64_t i = 0; i < archive.size(); ++i) {
      if (i < left_out.size() && left_out[i]) continue;
      auto view = archive.Field(i, f, /*verify=*/true);
      if (!view.ok()) {
        ++errors;
        continue;
      }
      const FieldView v = WithTypeDims(spec, *view);
      ++samples;
      if (rowed) rows.Add(v.dims[0]);
      if (numeric) {
        const uint64_t n = v.ndim ? Elements(v) : 1;
        for (uint64_t e = 0; e < n; ++e) values.Add(Number(spec, v.data, e).get<double>());
      } else {
        bytes.Add(double(v.size));
      }
    }
    json j = {{"type", spec.TypeName()}, {"samples", samples}};
    if (rowed) j["rows"] = rows.Json();
    if (numeric) j["values"] = values.Json();
    if (!numeric) j["bytes"] = bytes.Json();
    if (errors) j["errors"] = errors;
    out[spec.name] = std::move(j);
  }
  return out;
}

Result<SampleOverlay> Overlay(const format::Archive& archive, uint64_t i) {
  const format::Schema& schema = archive.schema();
  SampleOverlay out;
  if (schema.legacy()) return out;
  SF_ASSIGN_OR_RETURN(const format::RecordView r, archive.At(i));
  const format::IndexEntry& e = *r.entry;
  for (size_t f = 0; f < schema.size(); ++f) {
    if (!Stored(schema, f)) continue;
    const FieldSpec& spec = schema.fields()[f];
    const bool boxes = spec.kind == FieldKind::kBoxes && out.boxes.empty();
    const bool mask = spec.kind == FieldKind::kMask && out.mask.empty();
    const bool caption = spec.kind == FieldKind::kStr && out.caption.empty() &&
                         (spec.name == "caption" || spec.name == "captions" ||
                          spec.name == "text" || spec.name == "title");
    if (!boxes && !mask && !caption) continue;
    auto view = archive.Field(i, f, /*verify=*/true);
    if (!view.ok()) return FieldStatus(spec, view.status());
    const FieldView& v = *view;
    if (boxes) {
      out.boxes.resize(size_t{v.dims[0]} * 4);
      if (!out.boxes.empty()) {  // no rows: v.data may be null
        std::memcpy(out.boxes.data(), v.data, out.boxes.size() * sizeof(float));
      }
      imaging::OrientBoxes(out.boxes.data(), v.dims[0], e.width, e.height, e.orientation);
    } else if (mask) {
      imaging::Image m;
      m.Resize(v.dims[1], v.dims[0], 1);
      SF_RETURN_IF_ERROR(FieldStatus(spec, format::DecodeMask(v, m.pixels.data())));
      imaging::ApplyOrientation(&m, e.orientation);
      out.mask.assign(m.pixels.begin(), m.pixels.end());
    } else {
      out.caption.assign(reinterpret_cast<const char*>(v.data), v.size);
    }
  }
  return out;
}

}  // namespace shardfeed::validate
