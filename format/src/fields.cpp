// Schemas, field values and var blobs (format version 4; docs/FORMAT.md "Fields").
#include "shardfeed/format/fields.h"

#include <zstd.h>

#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shardfeed/format/layout.h"

namespace shardfeed::format {
namespace {

using ojson = nlohmann::ordered_json;

constexpr uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

// One zstd context per thread for masks: ZSTD_compress / ZSTD_decompress make and free one per
// call (a 224x224 mask decoded in 24 us with a new context, 4 us with a kept one).
ZSTD_CCtx* MaskCompressor() {
  static thread_local std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> ctx(ZSTD_createCCtx(),
                                                                             ZSTD_freeCCtx);
  return ctx.get();
}

ZSTD_DCtx* MaskDecompressor() {
  static thread_local std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> ctx(ZSTD_createDCtx(),
                                                                             ZSTD_freeDCtx);
  return ctx.get();
}

struct ElemInfo {
  ElemType type;
  std::string_view name;
  size_t size;
};
constexpr ElemInfo kElems[] = {
    {ElemType::kUint8, "uint8", 1},     {ElemType::kInt32, "int32", 4},
    {ElemType::kInt64, "int64", 8},     {ElemType::kFloat16, "float16", 2},
    {ElemType::kFloat32, "float32", 4}, {ElemType::kFloat64, "float64", 8},
};

struct KindName {
  FieldKind kind;
  std::string_view name;
};
constexpr KindName kKinds[] = {
    {FieldKind::kImage, "image"},     {FieldKind::kMask, "mask"},
    {FieldKind::kBoxes, "boxes"},     {FieldKind::kInt64, "int64"},
    {FieldKind::kFloat32, "float32"}, {FieldKind::kFloat64, "float64"},
    {FieldKind::kStr, "str"},         {FieldKind::kBytes, "bytes"},
    {FieldKind::kJson, "json"},
};

bool ValidName(std::string_view n) {
  if (n.empty() || n.size() > kMaxFieldName) return false;
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (!alpha(n[0])) return false;
  for (char c : n) {
    if (!alpha(c) && !(c >= '0' && c <= '9')) return false;
  }
  return true;
}

Status FieldError(const FieldSpec& spec, const std::string& what) {
  return Status::InvalidArgument("field '", spec.name, "' (", spec.TypeName(), "): ", what);
}

uint64_t DimsBytes(const FieldSpec& spec) { return Align8(4 * spec.stored_dims()); }

}  // namespace

bool ValidUtf8(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    // ASCII, 8 bytes at a time (readers check every str and json value they deliver).
    for (uint64_t w; i + 8 <= n && (std::memcpy(&w, s + i, 8), (w & 0x8080808080808080ull) == 0);) {
      i += 8;
    }
    if (i == n) break;
    const uint8_t c = s[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > n) return false;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

int JsonDepth(const void* text, size_t size) {
  const char* t = static_cast<const char*>(text);
  int depth = 0, max = 0;
  bool in_string = false;
  for (size_t i = 0; i < size; ++i) {
    const char c = t[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max = std::max(max, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max;
}

size_t ElemSize(ElemType t) {
  for (const auto& e : kElems) {
    if (e.type == t) return e.size;
  }
  return 0;
}

std::string_view ElemName(ElemType t) {
  for (const auto& e : kElems) {
    if (e.type == t) return e.name;
  }
  return "?";
}

std::string FieldSpec::TypeName() const {
  if (kind != FieldKind::kArray) {
    for (const auto& k : kKinds) {
      if (k.kind == kind) return std::string(k.name);
    }
  }
  std::string out(ElemName(elem));
  out += '[';
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) out += ',';
    out += dims[i] == kAnyDim ? std::string("*") : std::to_string(dims[i]);
  }
  return out + ']';
}

bool FieldSpec::fixed() const {
  switch (kind) {
    case FieldKind::kInt64:
    case FieldKind::kFloat32:
    case FieldKind::kFloat64:
      return true;
    case FieldKind::kArray:
      for (int64_t d : dims) {
        if (d == kAnyDim) return false;
      }
      return true;
    default:
      return false;
  }
}

size_t FieldSpec::item_bytes() const {
  if (!fixed()) return 0;
  size_t n = ElemSize(elem);
  for (int64_t d : dims) n *= static_cast<size_t>(d);
  return n;
}

size_t FieldSpec::stored_dims() const {
  switch (kind) {
    case FieldKind::kBoxes:
    case FieldKind::kMask:
      return 2;
    case FieldKind::kArray:
      return dims.size();
    default:
      return 0;
  }
}

Status Schema::ParseType(std::string_view type, FieldSpec* spec) {
  spec->dims.clear();
  for (const auto& k : kKinds) {
    if (type != k.name) continue;
    spec->kind = k.kind;
    spec->elem = k.kind == FieldKind::kInt64                                    ? ElemType::kInt64
                 : k.kind == FieldKind::kFloat64                                ? ElemType::kFloat64
                 : k.kind == FieldKind::kFloat32 || k.kind == FieldKind::kBoxes ? ElemType::kFloat32
                                                                                : ElemType::kUint8;
    if (k.kind == FieldKind::kBoxes) spec->dims = {kAnyDim, 4};
    if (k.kind == FieldKind::kMask) spec->dims = {kAnyDim, kAnyDim};
    return Status::OK();
  }
  const size_t open = type.find('[');
  auto bad = [&](const char* why) {
    return Status::InvalidArgument("type '", type, "': ", why,
                                   " (types: image mask boxes int64 float32 float64 str bytes json "
                                   "or <dtype>[<dims>], dtype uint8 int32 int64 float16 float32 "
                                   "float64, dims numbers or *, e.g. float32[*,4])");
  };
  if (open == std::string_view::npos || type.back() != ']') return bad("unknown type");
  const std::string_view elem = type.substr(0, open);
  bool found = false;
  for (const auto& e : kElems) {
    if (elem == e.name) spec->elem = e.type, found = true;
  }
  if (!found) return bad("unknown element type");
  std::string_view rest = type.substr(open + 1, type.size() - open - 2);
  while (true) {
    const size_t comma = rest.find(',');
    std::string_view d = rest.substr(0, comma);
    while (!d.empty() && d.front() == ' ') d.remove_prefix(1);
    while (!d.empty() && d.back() == ' ') d.remove_suffix(1);
    if (d == "*") {
      spec->dims.push_back(kAnyDim);
    } else {
      if (d.empty() || d.size() > 9) return bad("a dim is a number (1 to 999999999) or *");
      int64_t v = 0;
      for (char c : d) {
        if (c < '0' || c > '9') return bad("a dim is a number (1 to 999999999) or *");
        v = v * 10 + (c - '0');
      }
      if (v < 1) return bad("a dim is a number (1 to 999999999) or *");
      spec->dims.push_back(v);
    }
    if (spec->dims.size() > kMaxDims) return bad("at most 4 dims");
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  spec->kind = FieldKind::kArray;
  if (spec->fixed()) {
    uint64_t n = ElemSize(spec->elem);
    for (int64_t d : spec->dims) {
      n *= static_cast<uint64_t>(d);
      if (n > (uint64_t{1} << 24)) return bad("a fixed-size array is at most 16 MiB per sample");
    }
  }
  return Status::OK();
}

Schema Schema::Legacy() {
  Schema s;
  (void)s.Add({"image", FieldKind::kImage, ElemType::kUint8, {}, ""});
  (void)s.Add({"label", FieldKind::kInt64, ElemType::kInt64, {}, ""});
  return s;
}

Schema Schema::ImageFolder() {
  Schema s = Legacy();
  (void)s.Add({"path", FieldKind::kStr, ElemType::kUint8, {}, ""});
  return s;
}

Status Schema::Add(FieldSpec spec) {
  if (fields_.size() >= kMaxFields) {
    return Status::InvalidArgument("a schema has at most ", kMaxFields, " fields");
  }
  if (!ValidName(spec.name)) {
    return Status::InvalidArgument("field name '", spec.name,
                                   "': names are [A-Za-z_][A-Za-z0-9_]*, at most ", kMaxFieldName,
                                   " bytes");
  }
  if (Find(spec.name) >= 0) return Status::InvalidArgument("field '", spec.name, "' twice");
  if (spec.kind == FieldKind::kImage && image_ >= 0) {
    return Status::InvalidArgument("field '", spec.name, "': a schema has one image field ('",
                                   fields_[image_].name, "' already); store other images as bytes");
  }
  if (!spec.per.empty()) {
    const int target = Find(spec.per);
    if (target < 0 || fields_[target].kind != FieldKind::kBoxes) {
      return FieldError(spec,
                        "\"per\": \"" + spec.per + "\" must name a boxes field declared before it");
    }
    if (spec.kind == FieldKind::kBoxes || spec.kind == FieldKind::kMask ||
        spec.kind == FieldKind::kImage || spec.dims.empty() || spec.dims[0] != kAnyDim) {
      return FieldError(spec, "a per-box field is an array whose first dim is * (e.g. int64[*])");
    }
  }
  const int f = static_cast<int>(fields_.size());
  if (spec.kind == FieldKind::kImage) image_ = f;
  if (spec.kind == FieldKind::kInt64 && spec.name == "label") label_ = f;
  if (spec.kind != FieldKind::kImage && f != label_ && !spec.fixed()) var_.push_back(f);
  fields_.push_back(std::move(spec));
  return Status::OK();
}

Result<Schema> Schema::FromJson(std::string_view json_text) {
  ojson doc = ojson::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (doc.is_discarded()) return Status::InvalidArgument("schema: not JSON");
  Schema schema;
  auto add = [&](const std::string& name, const ojson& v) -> Status {
    FieldSpec spec;
    spec.name = name;
    const ojson* type = &v;
    if (v.is_object()) {
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (it.key() != "type" && it.key() != "per" && it.key() != "name") {
          return Status::InvalidArgument("field '", name, "': unknown key '", it.key(),
                                         "' (a field is {\"type\": ..., \"per\": ...})");
        }
      }
      if (!v.contains("type")) return Status::InvalidArgument("field '", name, "': no \"type\"");
      type = &v["type"];
      if (v.contains("per")) {
        if (!v["per"].is_string()) {
          return Status::InvalidArgument("field '", name, "': \"per\" is a field name");
        }
        spec.per = v["per"].get<std::string>();
      }
    }
    if (!type->is_string()) {
      return Status::InvalidArgument("field '", name, "': the type is a string, e.g. \"int64\"");
    }
    if (Status s = ParseType(type->get<std::string>(), &spec); !s.ok()) {
      return Status::InvalidArgument("field '", name, "': ", s.message());
    }
    return schema.Add(std::move(spec));
  };
  if (doc.is_array()) {  // the manifest's form
    for (const auto& v : doc) {
      if (!v.is_object() || !v.contains("name") || !v["name"].is_string()) {
        return Status::InvalidArgument("schema: each field is {\"name\", \"type\"[, \"per\"]}");
      }
      if (Status s = add(v["name"].get<std::string>(), v); !s.ok()) return s;
    }
  } else if (doc.is_object()) {
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      if (Status s = add(it.key(), it.value()); !s.ok()) return s;
    }
  } else {
    return Status::InvalidArgument("schema: a JSON object {name: type} or a list of fields");
  }
  if (schema.image_ < 0) {
    return Status::InvalidArgument(
        "schema: no field of type image (a sample is an image and its "
        "fields)");
  }
  return schema;
}

std::string Schema::ToJson() const {
  ojson out = ojson::array();
  for (const auto& f : fields_) {
    ojson v = {{"name", f.name}, {"type", f.TypeName()}};
    if (!f.per.empty()) v["per"] = f.per;
    out.push_back(std::move(v));
  }
  return out.dump();
}

int Schema::Find(std::string_view name) const {
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (fields_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

bool Schema::legacy() const { return fields_.size() == 2 && image_ == 0 && label_ == 1; }

int Schema::VarSlot(size_t f) const {
  for (size_t i = 0; i < var_.size(); ++i) {
    if (var_[i] == static_cast<int>(f)) return static_cast<int>(i);
  }
  return -1;
}

uint64_t Schema::ColumnOffset(size_t f, uint64_t samples) const {
  uint64_t off = 0;
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (!fields_[i].fixed() || static_cast<int>(i) == label_) continue;
    if (i == f) return off;
    off = Align8(off + fields_[i].item_bytes() * samples);
  }
  return off;
}

uint64_t Schema::VarColumnOffset(uint64_t samples) const {
  return ColumnOffset(fields_.size(), samples);
}

uint64_t Schema::TableSize(uint64_t samples) const {
  return VarColumnOffset(samples) + (var_.empty() ? 0 : sizeof(VarEntry) * samples);
}

namespace {

// A mask of `h` x `w` beside an image stored `height` x `width`.
Status MaskDims(const FieldSpec& spec, uint32_t h, uint32_t w, uint32_t height, uint32_t width) {
  if (h == height && w == width) return Status::OK();
  return FieldError(spec, "mask is " + std::to_string(h) + "x" + std::to_string(w) +
                              ", the image is stored as " + std::to_string(height) + "x" +
                              std::to_string(width));
}

}  // namespace

Status CheckValue(const FieldSpec& spec, const FieldValue& value, uint32_t height, uint32_t width,
                  int64_t box_rows, ValueChecks checks) {
  if (!value.present) return FieldError(spec, "missing");
  if (value.size && !value.data) return FieldError(spec, "no data");
  const auto* p = static_cast<const uint8_t*>(value.data);
  switch (spec.kind) {
    case FieldKind::kImage:
      return Status::OK();
    case FieldKind::kStr:
      if (!ValidUtf8(p, value.size)) return FieldError(spec, "not valid UTF-8");
      return Status::OK();
    case FieldKind::kBytes:
      return Status::OK();
    case FieldKind::kJson: {
      if (!ValidUtf8(p, value.size)) return FieldError(spec, "not valid UTF-8");
      if (JsonDepth(p, value.size) > kMaxJsonDepth) {
        return FieldError(spec,
                          "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      }
      if (checks.json_syntax && !nlohmann::json::accept(p, p + value.size)) {
        return FieldError(spec, "not valid JSON");
      }
      return Status::OK();
    }
    case FieldKind::kInt64:
    case FieldKind::kFloat32:
    case FieldKind::kFloat64:
      if (value.ndim != 0 || value.size != ElemSize(spec.elem)) {
        return FieldError(spec, "a scalar of " + std::to_string(ElemSize(spec.elem)) + " bytes");
      }
      return Status::OK();
    default:
      break;
  }
  // Arrays, boxes, masks.
  if (value.ndim != spec.dims.size()) {
    return FieldError(spec, "has " + std::to_string(value.ndim) + " dims, the type has " +
                                std::to_string(spec.dims.size()));
  }
  uint64_t n = ElemSize(spec.elem);
  std::string shape;
  for (size_t i = 0; i < value.ndim; ++i) {
    shape += (i ? "," : "") + std::to_string(value.dims[i]);
    if (spec.dims[i] != kAnyDim && value.dims[i] != spec.dims[i]) {
      return FieldError(spec, "shape [" + shape + "...] does not match the type");
    }
    n *= value.dims[i];
    if (n > (uint64_t{1} << 32)) return FieldError(spec, "larger than 4 GiB");
  }
  if (n != value.size) {
    return FieldError(spec, "shape [" + shape + "] needs " + std::to_string(n) + " bytes, got " +
                                std::to_string(value.size));
  }
  if (spec.kind == FieldKind::kMask) {
    SF_RETURN_IF_ERROR(MaskDims(spec, value.dims[0], value.dims[1], height, width));
  }
  if (!spec.per.empty() && box_rows >= 0 && static_cast<int64_t>(value.dims[0]) != box_rows) {
    return FieldError(spec, "has " + std::to_string(value.dims[0]) + " rows, '" + spec.per +
                                "' has " + std::to_string(box_rows) + " boxes");
  }
  if (spec.kind == FieldKind::kBoxes) {
    for (uint64_t i = 0; i < value.dims[0]; ++i) {
      float b[4];  // the caller's bytes need not be aligned for float (views of HDF5 chunks)
      std::memcpy(b, p + 16 * i, sizeof b);
      for (float x : b) {
        if (!(x == x) || x > kMaxBoxCoordinate || x < -kMaxBoxCoordinate) {
          return FieldError(
              spec,
              "box " + std::to_string(i) +
                  " has a coordinate that is NaN, infinite or beyond +-1e30 (kMaxBoxCoordinate)");
        }
      }
      // An inverted box (COCO's negative width or height) would pass here and vanish later in
      // the loader's geometry: refused where the value is written.
      if (!checks.inverted_boxes_ok && (b[2] < b[0] || b[3] < b[1])) {
        std::ostringstream box;
        box << "[" << b[0] << ", " << b[1] << ", " << b[2] << ", " << b[3] << "]";
        return FieldError(spec, "box " + std::to_string(i) + " " + box.str() +
                                    " is inverted (x1 < x0 or y1 < y0; boxes are x0,y0,x1,y1)");
      }
    }
  }
  return Status::OK();
}

Status CheckStoredValue(const FieldSpec& spec, const FieldView& view, uint32_t height,
                        uint32_t width, int64_t box_rows, bool json_syntax) {
  if (spec.kind == FieldKind::kMask) {
    if (view.ndim != 2) return FieldError(spec, "a mask without its two dims");
    return MaskDims(spec, view.dims[0], view.dims[1], height, width);
  }
  FieldValue value;
  value.present = true;
  value.data = view.data, value.size = view.size;
  value.dims = view.dims, value.ndim = view.ndim;
  if (spec.kind == FieldKind::kArray && view.ndim == 0) {  // a fixed array's column value
    value.ndim = static_cast<uint32_t>(spec.dims.size());
    for (size_t d = 0; d < spec.dims.size(); ++d) {
      value.dims[d] = static_cast<uint32_t>(spec.dims[d]);
    }
  }
  return CheckValue(spec, value, height, width, box_rows,
                    {/*inverted_boxes_ok=*/true, json_syntax});
}

Status EncodeVarBlob(const Schema& schema, const FieldValues& values, int zstd_level,
                     std::vector<uint8_t>* out) {
  const auto& var = schema.var_fields();
  const size_t base = out->size();
  uint64_t pos = Align8(sizeof(VarSlot) * var.size());
  out->resize(base + pos, 0);
  for (size_t k = 0; k < var.size(); ++k) {
    const FieldSpec& spec = schema.fields()[var[k]];
    const FieldValue& v = values[var[k]];
    std::vector<uint8_t> value(DimsBytes(spec), 0);
    for (size_t i = 0; i < spec.stored_dims(); ++i) {
      std::memcpy(value.data() + 4 * i, &v.dims[i], 4);
    }
    const size_t head = value.size();
    if (spec.kind == FieldKind::kMask) {
      value.resize(head + ZSTD_compressBound(v.size));
      ZSTD_CCtx* cctx = MaskCompressor();
      if (!cctx) return FieldError(spec, "out of memory for a zstd context");
      const size_t z = ZSTD_compressCCtx(cctx, value.data() + head, value.size() - head, v.data,
                                         v.size, zstd_level);
      if (ZSTD_isError(z)) return FieldError(spec, ZSTD_getErrorName(z));
      value.resize(head + z);
    } else {
      value.insert(value.end(), static_cast<const uint8_t*>(v.data),
                   static_cast<const uint8_t*>(v.data) + v.size);
    }
    if (pos + value.size() > UINT32_MAX) {
      return FieldError(spec, "the sample's variable fields exceed 4 GiB");
    }
    const VarSlot slot{static_cast<uint32_t>(pos), static_cast<uint32_t>(value.size())};
    std::memcpy(out->data() + base + sizeof(VarSlot) * k, &slot, sizeof slot);
    out->resize(base + pos, 0);
    out->insert(out->end(), value.begin(), value.end());
    pos = Align8(pos + value.size());
  }
  return Status::OK();
}

Result<FieldView> VarField(const Schema& schema, const uint8_t* blob, size_t size, size_t f) {
  const int k = schema.VarSlot(f);
  if (k < 0 || f >= schema.size()) {
    return Status::InvalidArgument("field ", f, " is not a variable field");
  }
  const FieldSpec& spec = schema.fields()[f];
  auto corrupt = [&](const std::string& why) {
    return Status::Corrupt("field '", spec.name, "': ", why);
  };
  if (size < sizeof(VarSlot) * schema.var_fields().size()) {
    return corrupt("var blob of " + std::to_string(size) + " bytes is shorter than its table");
  }
  VarSlot slot;
  std::memcpy(&slot, blob + sizeof(VarSlot) * k, sizeof slot);
  if (slot.offset % 8 || slot.offset > size || slot.size > size - slot.offset) {
    return corrupt("slot (offset " + std::to_string(slot.offset) + ", size " +
                   std::to_string(slot.size) + ") outside the " + std::to_string(size) +
                   "-byte var blob");
  }
  FieldView view;
  view.data = blob + slot.offset;
  view.size = slot.size;
  const size_t nd = spec.stored_dims();
  if (nd == 0) return view;
  const uint64_t head = DimsBytes(spec);
  if (view.size < head) return corrupt("value shorter than its dims");
  view.ndim = static_cast<uint32_t>(nd);
  uint64_t n = ElemSize(spec.elem);
  for (size_t i = 0; i < nd; ++i) {
    std::memcpy(&view.dims[i], view.data + 4 * i, 4);
    if (spec.dims[i] != kAnyDim && view.dims[i] != spec.dims[i]) {
      return corrupt("dim " + std::to_string(i) + " is " + std::to_string(view.dims[i]) +
                     ", the type says " + std::to_string(spec.dims[i]));
    }
    // Checked before it can wrap: a crafted product that wrapped to the value's size would
    // let a reader index past the blob.
    if (__builtin_mul_overflow(n, uint64_t{view.dims[i]}, &n) || n > (uint64_t{1} << 40)) {
      return corrupt("dims too large");
    }
  }
  view.data += head;
  view.size -= head;
  if (spec.kind != FieldKind::kMask && n != view.size) {
    return corrupt("dims need " + std::to_string(n) + " bytes, the value has " +
                   std::to_string(view.size));
  }
  const size_t align = spec.kind == FieldKind::kMask ? 1 : ElemSize(spec.elem);
  view.aligned = reinterpret_cast<uintptr_t>(view.data) % align == 0;
  return view;
}

Status DecodeMask(const FieldView& mask, uint8_t* out) {
  const uint64_t want = uint64_t{mask.dims[0]} * mask.dims[1];
  const unsigned long long content = ZSTD_getFrameContentSize(mask.data, mask.size);
  if (content != want) {
    return Status::Corrupt("mask: the zstd frame holds ",
                           content == ZSTD_CONTENTSIZE_ERROR ? 0 : content, " bytes, the mask is ",
                           mask.dims[0], "x", mask.dims[1]);
  }
  ZSTD_DCtx* dctx = MaskDecompressor();
  if (!dctx) return Status::Internal("mask: out of memory for a zstd context");
  const size_t got = ZSTD_decompressDCtx(dctx, out, want, mask.data, mask.size);
  if (ZSTD_isError(got) || got != want) {
    return Status::Corrupt("mask: the zstd frame does not decompress (",
                           ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short", ")");
  }
  return Status::OK();
}

std::string DamagedVarField(const Schema& schema, const uint8_t* blob, size_t size) {
  for (int f : schema.var_fields()) {
    const FieldSpec& spec = schema.fields()[f];
    auto view = VarField(schema, blob, size, static_cast<size_t>(f));
    if (!view.ok()) return spec.name;
    if (spec.kind == FieldKind::kMask) {  // the frame's size first: damaged dims allocate nothing
      const uint64_t want = uint64_t{view->dims[0]} * view->dims[1];
      if (ZSTD_getFrameContentSize(view->data, view->size) != want) return spec.name;
      std::vector<uint8_t> pixels(want);
      if (!DecodeMask(*view, pixels.data()).ok()) return spec.name;
      continue;
    }
    FieldValue value;
    value.present = true;
    value.data = view->data;
    value.size = view->size;
    value.ndim = view->ndim;
    value.dims = view->dims;
    const int64_t rows = spec.per.empty() || view->ndim == 0 ? -1 : view->dims[0];
    if (!CheckValue(spec, value, 0, 0, rows).ok()) return spec.name;
  }
  return "";
}

}  // namespace shardfeed::format
