// JSONL manifests, and the row machinery JSONL and CSV share: schema inference, the image
// column, conversion of a JSON value (or a CSV cell's text) to a field's value.
// long file: one unit of the row machinery (inference and its notes, value typing, mask PNGs,
// the row loop) and the JSON text checks every importer shares; split, each part would reach
// into the others' helpers.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "shardfeed/converter/importers.h"
#include "shardfeed/converter/sample_writer.h"
#include "shardfeed/imaging/image.h"

namespace shardfeed::converter {

using Json = nlohmann::ordered_json;
using format::ElemType;
using format::FieldKind;
using format::FieldSpec;
using format::Schema;

format::FieldSpec MakeField(const std::string& name, const std::string& type) {
  FieldSpec spec;
  spec.name = name;
  (void)Schema::ParseType(type, &spec);  // callers pass type names that parse
  return spec;
}

std::string SanitizeFieldName(const std::string& text) {
  std::string name;
  int continuation = 0;  // bytes left of a UTF-8 character whose lead byte was seen
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    // One '_' per character: a UTF-8 character's continuation bytes add none ("naïve": na_ve);
    // a byte of another encoding (Latin-1 "°") is a character of its own.
    if ((u & 0xC0) == 0x80 && continuation > 0) {
      --continuation;
      continue;
    }
    continuation = (u & 0xE0) == 0xC0 ? 1 : (u & 0xF0) == 0xE0 ? 2 : (u & 0xF8) == 0xF0 ? 3 : 0;
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    name += ok ? c : '_';
  }
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) name = "_" + name;
  if (name.size() > format::kMaxFieldName) name.resize(format::kMaxFieldName);
  return name;
}

namespace {

// What a column's values look like, merged over every row.
enum class Seen { kNull, kInt, kFloat, kStr, kIntList, kFloatList, kEmptyList, kRows, kJson };
struct ColumnType {
  Seen seen = Seen::kNull;
  size_t k = 0;       // kRows: numbers per row
  bool wide = false;  // a list holds a number float32 does not keep (float64[...] then)
};

// A number float32 keeps as written: one it holds exactly (0.5, 3), or one of at most 6
// significant digits (0.1, 37.1235: FLT_DIG, so it reads back the same). 37.123456789 or
// 1700000000.5 are not: as float32 they read back 37.12345504760742 and 1700000000.
bool Float32Keeps(double d) {
  if (!std::isfinite(d)) return true;
  if (std::fabs(d) > 3.0e38) return false;  // (and the cast below would overflow)
  if (static_cast<double>(static_cast<float>(d)) == d) return true;
  if (d != 0 && std::fabs(d) < FLT_MIN) return false;  // subnormal in float32: fewer digits
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", d);
  return std::strtod(text, nullptr) == d;
}

// Text that is a JSON number, -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?: what inference takes
// for a number. strtod and strtoll also take " 5", "+5", ".5", "0x1F": a phone number
// "+4912345678" became an int, hex text a float. (A field --schema declares numeric still
// reads those: the user said it is a number.)
bool NumberText(const std::string& s) {
  size_t i = 0;
  auto digits = [&] {
    const size_t from = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    return i > from;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < s.size() && s[i] == '.' && !(++i, digits())) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == s.size();
}

// `strict`: only NumberText (inference); else what strtoll reads, whole (a declared field).
bool ParseInt(const std::string& s, int64_t* v, bool strict = true) {
  if (s.empty() || (strict && !NumberText(s))) return false;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(s.c_str(), &end, 10);
  // The whole text, NUL bytes included ("1\\0" "2" is text, not 1).
  if (end != s.c_str() + s.size() || errno != 0) return false;
  *v = x;
  return true;
}

// A CSV cell that is a boolean as csv writers and pandas write them (JSONL's true/false are
// int64 1/0; so are these).
bool ParseBool(const std::string& s, int64_t* v) {
  if (s == "true" || s == "True" || s == "TRUE") return *v = 1, true;
  if (s == "false" || s == "False" || s == "FALSE") return *v = 0, true;
  return false;
}

bool ParseDouble(const std::string& s, double* v, bool strict = true) {
  if (strict ? !NumberText(s) : (s.empty() || std::isspace(static_cast<unsigned char>(s[0])))) {
    return false;
  }
  if (!strict && s.find_first_of("xX") != std::string::npos) return false;  // no hex floats
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno != 0 || !std::isfinite(x)) return false;
  *v = x;
  return true;
}

// "NaN", "Infinity", "-Infinity" (what extract writes for floats JSON has no number for; also
// "nan", "inf", "-inf" in any case): the value, for a float field.
bool NonFiniteText(const Json& v, double* d) {
  if (!v.is_string()) return false;
  std::string s = v.get<std::string>();
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool minus = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.erase(0, 1);
  if (s == "nan") return *d = std::numeric_limits<double>::quiet_NaN(), true;
  if (s == "inf" || s == "infinity") {
    *d = minus ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    return true;
  }
  return false;
}

bool IsFloat(ElemType e) {
  return e == ElemType::kFloat16 || e == ElemType::kFloat32 || e == ElemType::kFloat64;
}

// Digits with an optional sign: an integer however large (ParseInt says whether it fits).
bool IntegerText(const std::string& s) {
  const size_t start = !s.empty() && (s[0] == '-' || s[0] == '+');
  return s.size() > start && s.find_first_not_of("0123456789", start) == std::string::npos;
}

// An integer of the source stays exact or is refused, never silently rounded or wrapped:
// JSON integers above INT64_MAX (nlohmann keeps them as uint64) do not fit an int64 field...
Status FitsInt64(const Json& v) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) {
    return Status::InvalidArgument("integer ", v.dump(), " does not fit int64");
  }
  return Status::OK();
}

// ... and those a float field cannot hold exactly (beyond 2^53 for float64, 2^24 for float32:
// a column of integers and non-integers is inferred float64, a list of them float32[*]) are
// refused rather than rounded.
template <typename Float>
Status ExactAs(const Json& v, const char* type) {
  if (!v.is_number_integer()) return Status::OK();
  // Compared as long double (64-bit mantissa on x86-64; elsewhere at least double's 53 bits,
  // where the float64 check is exact for |v| < 2^53 and conservative above).
  const long double exact = v.is_number_unsigned() ? static_cast<long double>(v.get<uint64_t>())
                                                   : static_cast<long double>(v.get<int64_t>());
  if (static_cast<long double>(static_cast<Float>(exact)) == exact) return Status::OK();
  return Status::InvalidArgument("integer ", v.dump(), " is not exact as ", type,
                                 " (give the field as int64 in --schema, or write the value as a "
                                 "string)");
}

// A finite number float32 stores as inf (1e39) is refused, as the Writer refuses it: NaN and
// infinities given stay what they are.
Status InFloat32(double d) {
  // Below FLT_MAX + half its last place a double rounds to FLT_MAX (3.4028235e+38 is float32's
  // largest as numpy prints it); from there on to infinity.
  if (!std::isfinite(d) || std::fabs(d) < double(FLT_MAX) + std::ldexp(1.0, 103)) {
    return Status::OK();
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", d);
  return Status::InvalidArgument(text, " is outside float32's range (largest 3.40282347e+38)");
}

// A cell holding a JSON list or object (Json::accept does not recurse, however deep).
bool LooksJson(const std::string& s) {
  return !s.empty() && (s[0] == '[' || s[0] == '{') && Json::accept(s);
}

bool IsJsonText(const std::string& s) {  // a cell nested too deep is typed as text
  return format::JsonDepth(s.data(), s.size()) <= format::kMaxJsonDepth && LooksJson(s);
}

ColumnType TypeOf(const Json& v, bool text_cell) {
  if (text_cell && v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    int64_t i;
    double d;
    if (s.empty()) return {Seen::kNull};
    // A leading zero ("01234", "-007": a postcode, an id) is text: as a number it lost its zeros.
    const size_t digits = s[0] == '-' || s[0] == '+';
    if (s.size() > digits + 1 && s[digits] == '0' &&
        std::isdigit(static_cast<unsigned char>(s[digits + 1]))) {
      return {Seen::kStr};
    }
    if (ParseInt(s, &i) || ParseBool(s, &i)) return {Seen::kInt};
    // A whole number no int64 holds (a 20-digit id): text, kept exactly (as int64 every row
    // failed the pack, as a float it would be rounded).
    if (NumberText(s) && IntegerText(s)) return {Seen::kStr};
    if (ParseDouble(s, &d)) return {Seen::kFloat};
    if (IsJsonText(s)) return TypeOf(Json::parse(s), false);
    return {Seen::kStr};
  }
  if (v.is_null()) return {Seen::kNull};
  if (v.is_boolean() || v.is_number_integer()) return {Seen::kInt};
  if (v.is_number_float()) return {Seen::kFloat};
  if (v.is_string()) return {Seen::kStr};
  if (!v.is_array()) return {Seen::kJson};
  if (v.empty()) return {Seen::kEmptyList};
  bool ints = true, numbers = true, rows = true, wide = false;
  size_t k = 0;
  auto widen = [&](const Json& x) {  // an integer over 2^24 too, in a list with fractions
    if (!wide && x.is_number() && !Float32Keeps(x.get<double>())) wide = true;
  };
  for (const Json& e : v) {
    numbers = numbers && e.is_number();
    ints = ints && e.is_number_integer();
    if (numbers) widen(e);
    if (e.is_array() && !e.empty() && (k == 0 || e.size() == k)) {
      k = e.size();
      for (const Json& x : e) {
        rows = rows && x.is_number();
        widen(x);
      }
    } else {
      rows = false;
    }
  }
  if (numbers) return {ints ? Seen::kIntList : Seen::kFloatList, 0, wide};
  if (rows) return {Seen::kRows, k, wide};
  return {Seen::kJson};
}

bool IsList(Seen s) {
  return s == Seen::kIntList || s == Seen::kFloatList || s == Seen::kEmptyList || s == Seen::kRows;
}

ColumnType MergeKinds(ColumnType a, ColumnType b, bool text_cells) {
  if (a.seen == Seen::kNull) return b;
  if (b.seen == Seen::kNull || (a.seen == b.seen && a.k == b.k)) return a;
  auto either = [&](Seen x, Seen y) {
    return (a.seen == x && b.seen == y) || (a.seen == y && b.seen == x);
  };
  if (either(Seen::kInt, Seen::kFloat)) return {Seen::kFloat};
  if (either(Seen::kIntList, Seen::kFloatList)) return {Seen::kFloatList};
  if (a.seen == Seen::kEmptyList && IsList(b.seen)) return b;
  if (b.seen == Seen::kEmptyList && IsList(a.seen)) return a;
  // Text cells that are sometimes numbers, sometimes words: words.
  if (text_cells && (a.seen == Seen::kStr || b.seen == Seen::kStr)) return {Seen::kStr};
  return {Seen::kJson};
}

ColumnType Merge(ColumnType a, ColumnType b, bool text_cells) {
  ColumnType m = MergeKinds(a, b, text_cells);
  m.wide = a.wide || b.wide;
  return m;
}

Status TypeFor(const std::string& name, const ColumnType& t, FieldSpec* spec) {
  spec->name = name;
  const bool box_name = name == "boxes" || name == "bbox" || name == "bboxes";
  switch (t.seen) {
    case Seen::kInt:
      return Schema::ParseType("int64", spec);
    case Seen::kFloat:
      return Schema::ParseType("float64", spec);
    case Seen::kStr:
      return Schema::ParseType("str", spec);
    case Seen::kIntList:
    case Seen::kEmptyList:
      return Schema::ParseType(box_name ? "boxes" : "int64[*]", spec);
    case Seen::kFloatList:
      return Schema::ParseType(t.wide ? "float64[*]" : "float32[*]", spec);
    case Seen::kRows:
      if (box_name && t.k == 4) return Schema::ParseType("boxes", spec);
      return Schema::ParseType((t.wide ? "float64[*," : "float32[*,") + std::to_string(t.k) + "]",
                               spec);
    default:
      return Schema::ParseType("json", spec);
  }
}

bool HasImageExtension(const std::string& path) {
  const size_t dot = path.find_last_of('.');
  if (dot == std::string::npos) return false;
  std::string ext = path.substr(dot + 1);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::set<std::string> kImage = {"jpg", "jpeg", "png",  "webp", "bmp",  "gif",
                                               "tif", "tiff", "heic", "heif", "avif", "ppm"};
  return kImage.count(ext) > 0;
}

// The column holding image paths: a conventional name, else the first whose values are all
// strings naming image files.
std::string ImageColumn(const std::vector<Row>& rows, const std::vector<std::string>& columns) {
  for (const char* name : {"image", "image_path", "file_name", "path", "filename"}) {
    if (std::find(columns.begin(), columns.end(), name) != columns.end()) return name;
  }
  for (const std::string& c : columns) {
    bool all = !rows.empty();
    for (const Row& r : rows) {
      auto it = r.object->find(c);
      all = all && it != r.object->end() && it->is_string() &&
            HasImageExtension(it->get_ref<const std::string&>());
      if (!all) break;
    }
    if (all) return c;
  }
  return "";
}

// float -> IEEE half, round to nearest even.
uint16_t ToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  int exp = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    const int shift = 14 - exp;
    uint32_t half = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(half);
}

// Walks a nested list: its shape (rectangular) and its leaves in C order.
Status Flatten(const Json& v, size_t depth, std::vector<uint32_t>* shape,
               std::vector<const Json*>* leaves) {
  if (!v.is_array()) {
    if (depth != shape->size()) return Status::InvalidArgument("ragged nesting");
    leaves->push_back(&v);
    return Status::OK();
  }
  if (depth == shape->size()) {
    if (depth >= format::kMaxDims) return Status::InvalidArgument("more than 4 dims");
    shape->push_back(static_cast<uint32_t>(v.size()));
  } else if (depth > shape->size() || (*shape)[depth] != v.size()) {
    return Status::InvalidArgument("ragged nesting (rows of different lengths)");
  }
  for (const Json& e : v) SF_RETURN_IF_ERROR(Flatten(e, depth + 1, shape, leaves));
  return Status::OK();
}

template <typename T>
void Put(std::vector<uint8_t>* out, T v) {
  const size_t at = out->size();
  out->resize(at + sizeof(T));
  std::memcpy(out->data() + at, &v, sizeof(T));
}

Status ArrayValue(const FieldSpec& spec, const Json& v, OwnedValue* out) {
  std::vector<uint32_t> shape;
  std::vector<const Json*> leaves;
  if (!v.is_array()) return Status::InvalidArgument("expected a list, got ", v.type_name());
  SF_RETURN_IF_ERROR(Flatten(v, 0, &shape, &leaves));
  // An empty list of rows ([] for boxes) has the type's fixed inner dims, and 0 for the others
  // ([] for int64[*,*] is [0, 0], as the Writer reads it).
  while (leaves.empty() && shape.size() < spec.dims.size()) {
    const int64_t d = spec.dims[shape.size()];
    shape.push_back(d == format::kAnyDim ? 0 : static_cast<uint32_t>(d));
  }
  if (shape.size() != spec.dims.size()) {
    return Status::InvalidArgument("has ", shape.size(), " dims, the type ", spec.TypeName(),
                                   " has ", spec.dims.size());
  }
  std::vector<uint8_t> bytes;
  bytes.reserve(leaves.size() * format::ElemSize(spec.elem));
  for (const Json* leaf : leaves) {
    double d;
    if (IsFloat(spec.elem) && NonFiniteText(*leaf, &d)) {
      if (spec.elem == ElemType::kFloat16) Put(&bytes, ToHalf(static_cast<float>(d)));
      if (spec.elem == ElemType::kFloat32) Put(&bytes, static_cast<float>(d));
      if (spec.elem == ElemType::kFloat64) Put(&bytes, d);
      continue;
    }
    if (!leaf->is_number()) {
      return Status::InvalidArgument("element ", leaf->dump(), " is not a number");
    }
    d = leaf->get<double>();
    const bool integral = leaf->is_number_integer() || d == std::floor(d);
    auto need_int = [&](double lo, double hi) {
      return integral && d >= lo && d <= hi
                 ? Status::OK()
                 : Status::InvalidArgument("element ", leaf->dump(), " is not a ",
                                           std::string(format::ElemName(spec.elem)));
    };
    switch (spec.elem) {
      case ElemType::kUint8:
        SF_RETURN_IF_ERROR(need_int(0, 255));
        Put(&bytes, static_cast<uint8_t>(d));
        break;
      case ElemType::kInt32:
        SF_RETURN_IF_ERROR(need_int(INT32_MIN, INT32_MAX));
        Put(&bytes, static_cast<int32_t>(d));
        break;
      case ElemType::kInt64:
        SF_RETURN_IF_ERROR(FitsInt64(*leaf));
        if (!leaf->is_number_integer()) SF_RETURN_IF_ERROR(need_int(-9.2e18, 9.2e18));
        Put(&bytes, leaf->is_number_integer() ? leaf->get<int64_t>() : static_cast<int64_t>(d));
        break;
      case ElemType::kFloat16: {
        const uint16_t half = ToHalf(static_cast<float>(d));
        if ((half & 0x7fff) == 0x7c00) {  // a finite number stored as inf
          return Status::InvalidArgument("element ", leaf->dump(),
                                         " is outside float16's range (largest 65504)");
        }
        Put(&bytes, half);
        break;
      }
      case ElemType::kFloat32:
        SF_RETURN_IF_ERROR(ExactAs<float>(*leaf, "float32"));
        SF_RETURN_IF_ERROR(InFloat32(d));
        Put(&bytes, static_cast<float>(d));
        break;
      case ElemType::kFloat64:
        SF_RETURN_IF_ERROR(ExactAs<double>(*leaf, "float64"));
        Put(&bytes, d);
        break;
    }
  }
  *out = OwnedValue::Array(bytes.data(), bytes.size(), shape);
  return Status::OK();
}

// Standard base64 (RFC 4648, padded): false for any other character or a bad length.
bool DecodeBase64(const std::string& in, std::string* out) {
  if (in.size() % 4) return false;
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  out->clear();
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    const int pad = last ? (in[i + 3] == '=') + (in[i + 2] == '=') : 0;
    uint32_t b = 0;
    for (int k = 0; k < 4; ++k) {
      const int v = k >= 4 - pad ? 0 : value(in[i + k]);
      if (v < 0) return false;
      b = (b << 6) | static_cast<uint32_t>(v);
    }
    out->push_back(static_cast<char>(b >> 16));
    if (pad < 2) out->push_back(static_cast<char>(b >> 8 & 0xFF));
    if (pad < 1) out->push_back(static_cast<char>(b & 0xFF));
  }
  return true;
}

// A CSV cell's text as the JSON number a numeric field (int64, float32, float64) takes: what
// strtoll/strtod read (a declared field's "+5", ".5" too), booleans as 1/0, "-0" signed, and
// for a float field "NaN"/"Infinity" texts; a whole number beyond int64 is refused (as a
// double it would be rounded).
Result<Json> NumberOfText(const FieldSpec& spec, const std::string& s) {
  int64_t i;
  double d;
  if (ParseInt(s, &i, false) || ParseBool(s, &i)) {
    if (i == 0 && s[0] == '-' && spec.kind != FieldKind::kInt64) return Json(-0.0);
    return Json(i);
  }
  if (IntegerText(s)) {
    return Status::InvalidArgument("integer ", s, " does not fit int64 (nor float64 exactly)");
  }
  if (ParseDouble(s, &d, false)) return Json(d);
  if (spec.kind != FieldKind::kInt64 && NonFiniteText(Json(s), &d)) return Json(s);
  return Status::InvalidArgument("'", s, "' is not a number");
}

// A value as a note shows it: its JSON, at most 40 characters.
std::string Shown(const Json& v) {
  std::string text = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  return text.size() > 40 ? text.substr(0, 37) + "..." : text;
}

// The value of field `spec` in a row: `v` (a JSON value, or with `text` a CSV cell's string).
// A null (JSON null, an empty CSV cell of a non-text field: pandas' NaN either way) is a value
// where the type has one: NaN for float32/float64 (as pandas reads it back), null for json.
// Elsewhere it is refused, saying so (the key is there, its value is not).
Status ValueOf(const FieldSpec& spec, const Json& v, bool text, OwnedValue* out) {
  if (v.is_null() || (text && v.is_string() && v.get_ref<const std::string&>().empty() &&
                      spec.kind != FieldKind::kStr && spec.kind != FieldKind::kBytes)) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    if (spec.kind == FieldKind::kFloat64) return *out = OwnedValue::Float64(nan), Status::OK();
    if (spec.kind == FieldKind::kFloat32) {
      return *out = OwnedValue::Float32(static_cast<float>(nan)), Status::OK();
    }
    if (spec.kind == FieldKind::kJson) return *out = OwnedValue::Text("null"), Status::OK();
    return Status::InvalidArgument(v.is_null() ? "null" : "empty",
                                   ": no value, and a field of "
                                   "type ",
                                   spec.TypeName(),
                                   " needs one (float fields keep a "
                                   "missing value as NaN, json fields as null)");
  }
  if (text && v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    switch (spec.kind) {
      case FieldKind::kStr:
      case FieldKind::kBytes:
        *out = OwnedValue::Text(s);
        return Status::OK();
      case FieldKind::kJson: {
        // JSON text stays as it is, however deep (the writer then refuses it past the limit,
        // naming the row); other text is a JSON string.
        *out = OwnedValue::Text(LooksJson(s) ? s : Json(s).dump());
        return Status::OK();
      }
      case FieldKind::kInt64:
      case FieldKind::kFloat32:
      case FieldKind::kFloat64: {
        SF_ASSIGN_OR_RETURN(const Json number, NumberOfText(spec, s));
        return ValueOf(spec, number, false, out);
      }
      default:
        if (!Json::accept(s)) return Status::InvalidArgument(Shown(Json(s)), " is not a JSON list");
        SF_RETURN_IF_ERROR(CheckJsonText(s));
        return ValueOf(spec, Json::parse(s), false, out);
    }
  }
  switch (spec.kind) {
    case FieldKind::kInt64:
      if (v.is_boolean()) return *out = OwnedValue::Int64(v.get<bool>()), Status::OK();
      SF_RETURN_IF_ERROR(FitsInt64(v));
      if (v.is_number_integer()) return *out = OwnedValue::Int64(v.get<int64_t>()), Status::OK();
      if (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()) &&
          std::fabs(v.get<double>()) < 9e18) {
        return *out = OwnedValue::Int64(static_cast<int64_t>(v.get<double>())), Status::OK();
      }
      return Status::InvalidArgument("expected an integer, got ", v.dump());
    case FieldKind::kFloat32:
    case FieldKind::kFloat64: {
      double d;
      if (NonFiniteText(v, &d)) {
        *out = spec.kind == FieldKind::kFloat32 ? OwnedValue::Float32(static_cast<float>(d))
                                                : OwnedValue::Float64(d);
        return Status::OK();
      }
      if (!v.is_number()) return Status::InvalidArgument("expected a number, got ", v.dump());
      SF_RETURN_IF_ERROR(spec.kind == FieldKind::kFloat64 ? ExactAs<double>(v, "float64")
                                                          : ExactAs<float>(v, "float32"));
      if (spec.kind == FieldKind::kFloat32) SF_RETURN_IF_ERROR(InFloat32(v.get<double>()));
      *out = spec.kind == FieldKind::kFloat32 ? OwnedValue::Float32(v.get<float>())
                                              : OwnedValue::Float64(v.get<double>());
      return Status::OK();
    }
    case FieldKind::kStr:
    case FieldKind::kBytes:
      if (spec.kind == FieldKind::kBytes && v.is_object() && v.size() == 1 &&
          v.contains("base64") && v["base64"].is_string()) {  // what extract writes for bytes
        std::string raw;
        if (!DecodeBase64(v["base64"].get_ref<const std::string&>(), &raw)) {
          return Status::InvalidArgument("{\"base64\": ...} is not valid base64");
        }
        return *out = OwnedValue::Text(raw), Status::OK();
      }
      if (!v.is_string()) return Status::InvalidArgument("expected a string, got ", v.type_name());
      *out = OwnedValue::Text(v.get_ref<const std::string&>());
      return Status::OK();
    case FieldKind::kJson:
      *out = OwnedValue::Text(v.dump());
      return Status::OK();
    case FieldKind::kImage:
      return Status::InvalidArgument("a second image field is not supported");
    default:
      return ArrayValue(spec, v, out);
  }
}

std::string Join(const std::string& dir, const std::string& path) {
  if (dir.empty() || dir == "." || (!path.empty() && path[0] == '/')) return path;
  return dir.back() == '/' ? dir + path : dir + "/" + path;
}

// A mask field given as the path of a PNG file (what `extract` writes: DIR/masks/<field>/I.png),
// read back bit for bit.
Status MaskFromPng(const std::string& file, OwnedValue* out) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::InvalidArgument(file, ": cannot open the mask: ", std::strerror(errno));
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::InvalidArgument(file, ": read failed");
  Status st = MaskFromPngBytes(data, out);
  return st.ok() ? st : Status::InvalidArgument(file, ": ", st.message());
}

// What a value of this kind is, for a note.
const char* KindName(Seen s, const Json& v) {
  if (s == Seen::kJson && v.is_array()) return "a list";  // of strings, say: not "an object"
  switch (s) {
    case Seen::kInt:
    case Seen::kFloat:
      return "a number";
    case Seen::kStr:
      return "text";
    case Seen::kJson:
      return "an object";
    case Seen::kRows:
      return "a list of lists";
    default:
      return "a list";
  }
}

// Inferred arrays with one row per box of the only boxes field in every row that has both (a
// JSONL detection manifest's "labels" beside "boxes"), linked to it ("per"), so that a crop
// that drops a box drops its rows too: only when the box counts vary, so that it cannot be
// chance (a note says so either way; --schema decides). JSON lists only (not CSV text cells).
Status LinkPerBox(const std::vector<Row>& rows, const std::map<std::string, std::string>& column_of,
                  bool text_cells, Schema* schema, std::vector<std::string>* notes) {
  int boxes = -1;
  for (size_t f = 0; f < schema->size(); ++f) {
    if (schema->fields()[f].kind != FieldKind::kBoxes) continue;
    if (boxes >= 0 || text_cells) return Status::OK();  // two boxes fields: whose rows?
    boxes = static_cast<int>(f);
  }
  if (boxes < 0) return Status::OK();
  const std::string& box_name = schema->fields()[boxes].name;
  const std::string& box_column = column_of.at(box_name);
  std::vector<bool> linked(schema->size(), false);
  bool any = false;
  for (size_t f = 0; f < schema->size(); ++f) {
    const FieldSpec& spec = schema->fields()[f];
    if (spec.kind != FieldKind::kArray || spec.dims.empty() || spec.dims[0] != format::kAnyDim ||
        !column_of.count(spec.name)) {
      continue;
    }
    const std::string& column = column_of.at(spec.name);
    std::set<size_t> counts;
    bool rows_match = true;
    for (const Row& r : rows) {
      auto b = r.object->find(box_column), v = r.object->find(column);
      if (b == r.object->end() || v == r.object->end() || b->is_null() || v->is_null()) continue;
      if (!b->is_array() || !v->is_array() || b->size() != v->size()) {
        rows_match = false;
        break;
      }
      counts.insert(b->size());
    }
    if (!rows_match || counts.empty() || *counts.rbegin() == 0) continue;
    const std::string schema_hint = "{\"" + spec.name + "\": {\"type\": \"" + spec.TypeName() +
                                    "\", \"per\": \"" + box_name + "\"}}";
    if (counts.size() < 2) {
      notes->push_back("column '" + column + "' has one value per box of '" + box_name +
                       "' in every row, but every row has " + std::to_string(*counts.begin()) +
                       " boxes: not linked to them (a crop that drops a box keeps its value); "
                       "--schema with " +
                       schema_hint + " links them");
      continue;
    }
    linked[f] = any = true;
    notes->push_back("column '" + column + "' stored per box of '" + box_name +
                     "' (one value per box in every row): a crop that drops a box drops its "
                     "value too (--schema without \"per\" keeps it a plain list)");
  }
  if (!any) return Status::OK();
  Schema relinked;
  for (size_t f = 0; f < schema->size(); ++f) {
    if (linked[f]) continue;
    SF_RETURN_IF_ERROR(relinked.Add(schema->fields()[f]));
    if (static_cast<int>(f) != boxes) continue;
    for (size_t g = 0; g < schema->size(); ++g) {
      if (!linked[g]) continue;
      FieldSpec spec = schema->fields()[g];
      spec.per = box_name;
      SF_RETURN_IF_ERROR(relinked.Add(spec));
    }
  }
  *schema = relinked;
  return Status::OK();
}

// The inferred schema of `rows`: image, then every other column in order of first appearance
// (path, from the image column, unless a column is called path). What a user may not expect
// goes to *notes (pack prints them and writes them in its report): a column that became str or
// json because its values are of different kinds (one word among numbers), and a column no row
// gives a value, which is not stored.
// long: one pass per column, the notes beside it.
Status InferSchema(const std::vector<Row>& rows, const std::vector<std::string>& columns,
                   bool text_cells, const std::string& image_column, Schema* schema,
                   std::map<std::string, std::string>* column_of, std::vector<std::string>* notes) {
  SF_RETURN_IF_ERROR(schema->Add(MakeField("image", "image")));
  (*column_of)["image"] = image_column;
  std::set<std::string> taken = {"image"};
  // A column whose name is a field name already keeps it: a sanitised one ("a b" -> "a_b")
  // yields, taking "a_b_2" (it took "a_b" when it came first, and the real a_b's values moved).
  std::set<std::string> own;
  for (const std::string& c : columns) {
    if (c != image_column && SanitizeFieldName(c) == c) own.insert(c);
  }
  for (const std::string& c : columns) {
    if (c == image_column) continue;
    ColumnType t;
    std::string first, mixed;  // the first value and where; the first of another kind and why
    std::string first_float;   // the first fraction: a label column of them is no class field
    bool ids_or_names = true;  // every value an integer or a string
    for (const Row& r : rows) {
      auto it = r.object->find(c);
      if (it == r.object->end()) continue;
      const ColumnType u = TypeOf(*it, text_cells);
      const ColumnType merged = Merge(t, u, text_cells);
      ids_or_names =
          ids_or_names && (u.seen == Seen::kNull || u.seen == Seen::kInt || u.seen == Seen::kStr);
      if (first.empty() && u.seen != Seen::kNull) {
        first = std::string(KindName(u.seen, *it)) + " (" + Shown(*it) + ") at " + r.where;
      }
      if (first_float.empty() && u.seen == Seen::kFloat) {
        first_float = Shown(*it) + " at " + r.where;
      }
      const bool mixes = (merged.seen == Seen::kStr || merged.seen == Seen::kJson) &&
                         t.seen != Seen::kNull && u.seen != Seen::kNull &&
                         !(t.seen == u.seen && t.k == u.k) &&
                         (merged.seen != t.seen || merged.seen != u.seen);
      if (mixes && mixed.empty()) {
        mixed = std::string(KindName(u.seen, *it)) + " (" + Shown(*it) + ") at " + r.where;
      }
      t = merged;
    }
    if (t.seen == Seen::kNull) {  // never given a value
      notes->push_back("column '" + c + "' has no value in any row: not stored");
      continue;
    }
    std::string name = SanitizeFieldName(c);
    for (int n = 2; taken.count(name) || (name != c && own.count(name)); ++n) {
      name = SanitizeFieldName(c) + "_" + std::to_string(n);
    }
    taken.insert(name);
    if (name != SanitizeFieldName(c)) {
      notes->push_back("column '" + c + "' stored as field '" + name + "' ('" +
                       SanitizeFieldName(c) + "' is another column's)");
    }
    FieldSpec spec;
    // Class names; ids among them are refused row by row (ImportRows), as in CSV.
    if (name == "label" && (t.seen == Seen::kStr || (t.seen == Seen::kJson && ids_or_names))) {
      t.seen = Seen::kInt;
      mixed.clear();
    }
    SF_RETURN_IF_ERROR(TypeFor(name, t, &spec));
    SF_RETURN_IF_ERROR(schema->Add(spec));
    (*column_of)[name] = c;
    if (name == "label" && t.seen == Seen::kFloat && mixed.empty()) {
      notes->push_back("column '" + c + "' stored as " + spec.TypeName() +
                       " (not as the class field): it holds numbers written as floats (" +
                       first_float + "); class ids are written as integers: 2, not 2.0");
    }
    if (!mixed.empty()) {
      notes->push_back("column '" + c + "' stored as " + spec.TypeName() +
                       (name == "label" ? " (not as the class field)" : "") +
                       ": its values are of different kinds, " + first + ", " + mixed +
                       " (give --schema to store it as one type; rows that do not fit it then "
                       "fail, or are skipped with --skip-bad)");
    }
  }
  SF_RETURN_IF_ERROR(LinkPerBox(rows, *column_of, text_cells, schema, notes));
  if (!taken.count("path")) {
    SF_RETURN_IF_ERROR(schema->Add(MakeField("path", "str")));
  }
  return Status::OK();
}

}  // namespace

Status CheckJsonText(const std::string& text) {
  // A document (a JSONL row, a COCO file) holds values a few levels down: each value is held to
  // kMaxJsonDepth itself when it is written (format::CheckValue).
  constexpr int kDocumentDepth = format::kMaxJsonDepth + 8;
  if (format::JsonDepth(text.data(), text.size()) > kDocumentDepth) {
    return Status::InvalidArgument("JSON nested deeper than ", kDocumentDepth, " levels");
  }
  size_t line = 1;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') ++line;
    if (c == '"') {  // a string: skip it, escapes included
      for (++i; i < text.size() && text[i] != '"'; ++i) i += text[i] == '\\';
      continue;
    }
    if (c != '-' && (c < '0' || c > '9')) continue;
    size_t end = i + 1;
    while (end < text.size() && std::strchr("0123456789.eE+-", text[end])) ++end;
    const std::string number = text.substr(i, end - i);
    i = end - 1;
    if (!IntegerText(number)) continue;  // a fraction or an exponent: a float as written
    errno = 0;
    if (number[0] == '-') {
      (void)std::strtoll(number.c_str(), nullptr, 10);
    } else {
      (void)std::strtoull(number.c_str(), nullptr, 10);
    }
    if (errno == ERANGE) {
      return Status::InvalidArgument("integer ", number, " (line ", line,
                                     ") does not fit 64 bits; write it as a string to keep it");
    }
  }
  return Status::OK();
}

std::string JsonSyntaxError(const std::string& text) {
  try {
    const Json parsed = Json::parse(text);
    (void)parsed;
    return "";
  } catch (const Json::parse_error& e) {
    std::string why = e.what();  // "[json.exception.parse_error.101] parse error at line ..."
    const size_t tag = why.find("] ");
    if (tag != std::string::npos) why.erase(0, tag + 2);
    const size_t from = e.byte > 8 ? e.byte - 8 : 0;
    const std::string near = text.substr(std::min(from, text.size()), 16);
    if (why.find("invalid literal") != std::string::npos &&
        (near.find("NaN") != std::string::npos || near.find("Infinity") != std::string::npos)) {
      why +=
          " (NaN and Infinity are not JSON; Python's json.dump writes them unless "
          "allow_nan=False: write null, a number, or the text \"NaN\" for a float field)";
    }
    return why;
  } catch (const Json::exception& e) {  // out_of_range.406: a number past double's range (1e400)
    std::string why = e.what();
    const size_t tag = why.find("] ");
    if (tag != std::string::npos) why.erase(0, tag + 2);
    return why;
  }
}

Result<SourceList> ImportParsedRows(const std::string& file,
                                    std::vector<nlohmann::ordered_json>* objects,
                                    const std::vector<std::string>& where,
                                    const std::vector<SkippedFile>& skipped,
                                    const std::vector<std::string>& columns, bool text_cells,
                                    const ImportOptions& options, const char* kind) {
  if (objects->empty() && skipped.empty()) return Status::InvalidArgument(file, ": no rows");
  std::vector<Row> rows;
  for (size_t i = 0; i < objects->size(); ++i) rows.push_back({where[i], &(*objects)[i]});
  const size_t slash = file.find_last_of('/');
  const std::string base = slash == std::string::npos ? "" : file.substr(0, slash);
  SF_ASSIGN_OR_RETURN(SourceList list, ImportRows(rows, columns, text_cells, base, options));
  list.kind = kind;
  list.skipped.insert(list.skipped.begin(), skipped.begin(), skipped.end());
  return list;
}

Status ValueFromText(const FieldSpec& spec, const std::string& text, OwnedValue* out) {
  if (spec.kind == FieldKind::kMask &&
      imaging::SniffFormat(reinterpret_cast<const uint8_t*>(text.data()), text.size()) ==
          imaging::ImageFormat::kPng) {
    return MaskFromPngBytes(text, out);
  }
  return ValueOf(spec, Json(text), true, out);
}

Status MaskFromPngBytes(const std::string& data, OwnedValue* out) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
  if (imaging::SniffFormat(bytes, data.size()) != imaging::ImageFormat::kPng) {
    return Status::InvalidArgument("a mask is a PNG file (or nested lists of class ids)");
  }
  imaging::PngSamples png;
  SF_RETURN_IF_ERROR(imaging::DecodePngSamples(bytes, data.size(), imaging::Limits(), &png));
  const size_t pixels = size_t{png.width} * png.height, c = png.channels;
  std::vector<uint8_t> mask(pixels);
  uint16_t top = 0;
  for (size_t k = 0; k < pixels; ++k) {
    const uint16_t* px = png.values.data() + c * k;  // grey (+ alpha), index, or R, G, B (+ A)
    if (c >= 3 && (px[1] != px[0] || px[2] != px[0])) {
      return Status::InvalidArgument(
          "a colour PNG; a mask is a grey or palette one (class ids), not colours");
    }
    top = std::max(top, px[0]);
    mask[k] = static_cast<uint8_t>(px[0]);
  }
  if (top > 255) {
    return Status::InvalidArgument("a ", png.bit_depth, "-bit PNG with ids up to ", top,
                                   "; a mask field holds ids 0-255 (one byte per pixel): give "
                                   "larger ids as an integer array field instead (type "
                                   "\"int32[*,*]\", nested lists)");
  }
  *out = OwnedValue::Array(mask.data(), mask.size(), {png.height, png.width});
  return Status::OK();
}

// long: schema (given or inferred), class names, then one pass over the rows.
Result<SourceList> ImportRows(const std::vector<Row>& rows, const std::vector<std::string>& columns,
                              bool text_cells, const std::string& base,
                              const ImportOptions& options) {
  SourceList list;
  list.root = base;
  Schema schema;
  std::map<std::string, std::string> column_of;  // field name -> column
  std::string image_column = ImageColumn(rows, columns);
  if (!options.schema_json.empty()) {
    SF_ASSIGN_OR_RETURN(schema, Schema::FromJson(options.schema_json));
    const std::string& image_name = schema.fields()[schema.image_field()].name;
    if (std::find(columns.begin(), columns.end(), image_name) != columns.end()) {
      image_column = image_name;
    }
    for (const FieldSpec& f : schema.fields()) {
      // The column of that name, else one whose sanitised name it is.
      column_of[f.name] = f.name;
      if (std::find(columns.begin(), columns.end(), f.name) != columns.end()) continue;
      for (const std::string& c : columns) {
        if (SanitizeFieldName(c) == f.name) column_of[f.name] = c;
      }
    }
    column_of[image_name] = image_column;
  }
  if (image_column.empty()) {
    const bool semicolons = columns.size() == 1 && columns[0].find(';') != std::string::npos;
    return Status::InvalidArgument(
        "no image column: name one image, image_path, file_name, path or filename (or give "
        "--schema with the image field's column name)",
        semicolons ? "; the one column's name holds ';': only ',' separates CSV cells (tabs in "
                     "*.tsv)"
                   : "");
  }
  if (options.schema_json.empty()) {
    SF_RETURN_IF_ERROR(
        InferSchema(rows, columns, text_cells, image_column, &schema, &column_of, &list.notes));
  }
  list.schema = schema;
  // `path` is filled by Pack (the image's path relative to the manifest) unless a column gives it.
  // (No entry for path: the field inference added. Never column_of["path"], which would make
  // one naming the column "" that pandas' unnamed index column is.)
  const int path_field = schema.Find("path");
  const auto path_column = column_of.find("path");
  list.path_field =
      path_field >= 0 && schema.fields()[path_field].kind == FieldKind::kStr &&
      (path_column == column_of.end() || path_column->second == image_column ||
       std::find(columns.begin(), columns.end(), path_column->second) == columns.end());
  if (path_field >= 0 && schema.fields()[path_field].kind == FieldKind::kStr && !list.path_field) {
    list.notes.push_back(
        "column '" + path_column->second +
        "' is the str field 'path', which loaders leave out of batches by default (taken for "
        "the source path a pack records): name it in fields, or pass fields='*' (--fields)");
  }
  // A class field of strings: class names are the sorted distinct strings.
  const int label_field = schema.label_field();
  std::map<std::string, int64_t> class_ids;
  std::string first_name;  // where the first class name is, and which
  if (label_field >= 0) {
    for (const Row& r : rows) {
      auto it = r.object->find(column_of["label"]);
      if (it != r.object->end() && it->is_string()) {
        int64_t ignored;
        if (!text_cells || !ParseInt(it->get_ref<const std::string&>(), &ignored)) {
          if (class_ids.empty()) first_name = "'" + it->get<std::string>() + "' at " + r.where;
          class_ids[it->get<std::string>()] = 0;
        }
      }
    }
    int64_t id = 0;
    for (auto& [name, value] : class_ids) list.class_names.push_back(name), value = id++;
    list.class_names_from_text = !class_ids.empty();
    // Digit strings ("5", "10") are names, numbered in text order: say so where that order is
    // not the numbers' (a user who meant ids would otherwise train on other labels).
    const bool all_digits =
        std::all_of(list.class_names.begin(), list.class_names.end(),
                    [](const std::string& n) { return IntegerText(n) && n[0] != '+'; });
    if (all_digits && list.class_names.size() > 1) {
      std::vector<std::string> by_number = list.class_names;
      std::stable_sort(by_number.begin(), by_number.end(), [](const auto& a, const auto& b) {
        return a.size() != b.size() ? a.size() < b.size() : a < b;
      });
      if (by_number != list.class_names || list.class_names[0] != "0") {
        list.notes.push_back("column 'label' holds strings of digits (" + first_name +
                             "): they are class names, numbered in sorted text order ('" +
                             list.class_names[0] + "' is class 0, '" + list.class_names[1] +
                             "' class 1); write them as numbers to use them as class ids");
      }
    }
  }
  int64_t max_label = -1;
  for (const Row& r : rows) {
    auto bad = [&](const std::string& field, const std::string& why) -> Status {
      const std::string what = field.empty() ? why : "field '" + field + "': " + why;
      if (!options.skip_bad) return Status::Corrupt(r.where, ": ", what);
      list.skipped.push_back({r.where, what});
      return Status::OK();
    };
    SourceItem item;
    item.name = r.where;
    auto image = r.object->find(image_column);
    if (image == r.object->end() || !image->is_string() ||
        image->get_ref<const std::string&>().empty()) {
      SF_RETURN_IF_ERROR(bad(schema.fields()[schema.image_field()].name,
                             "no image path in column '" + image_column + "'"));
      continue;
    }
    item.path = Join(base, image->get<std::string>());
    item.values.resize(schema.size());
    Status row_status;
    std::string bad_field;
    for (size_t f = 0; f < schema.size() && row_status.ok(); ++f) {
      const FieldSpec& spec = schema.fields()[f];
      if (int(f) == schema.image_field() || (int(f) == path_field && list.path_field)) continue;
      auto it = r.object->find(column_of[spec.name]);
      bad_field = spec.name;
      if (it == r.object->end()) {
        row_status = Status::InvalidArgument("missing");
      } else if (int(f) == label_field && it->is_string() &&
                 class_ids.count(it->get<std::string>())) {
        item.label = static_cast<int32_t>(class_ids[it->get<std::string>()]);
      } else if (int(f) == label_field) {
        OwnedValue v;
        row_status = ValueOf(spec, *it, text_cells, &v);
        int64_t label = 0;
        if (row_status.ok()) std::memcpy(&label, v.bytes.data(), 8);
        if (row_status.ok()) row_status = CheckClassId(label);
        // Class names number the classes in their sorted order: an id given beside them would
        // mean another class than its writer meant (it used to be taken as that number).
        if (row_status.ok() && !class_ids.empty()) {
          row_status =
              Status::InvalidArgument("class id ", label, " among class names (", first_name,
                                      "): give every label as a class name, or every one as an id");
        }
        item.label = static_cast<int32_t>(label);
        max_label = std::max(max_label, label);
      } else if (spec.kind == FieldKind::kMask && it->is_string() &&
                 !IsJsonText(it->get_ref<const std::string&>())) {
        row_status = MaskFromPng(Join(base, it->get<std::string>()), &item.values[f]);
      } else {
        row_status = ValueOf(spec, *it, text_cells, &item.values[f]);
      }
    }
    if (!row_status.ok()) {
      SF_RETURN_IF_ERROR(bad(bad_field, row_status.message()));
      continue;
    }
    list.items.push_back(std::move(item));
  }
  if (label_field >= 0 && class_ids.empty()) {
    list.class_names = NumericClassNames(max_label);
  }
  return list;
}

Result<SourceList> ImportJsonl(const std::string& file, const ImportOptions& options) {
  std::ifstream in(file);
  if (!in) return Status::NotFound(file, ": cannot open: ", std::strerror(errno));
  std::vector<Json> objects;
  std::vector<std::string> where;
  std::vector<std::string> columns;
  std::set<std::string> seen;
  std::vector<SkippedFile> skipped;
  std::string line;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at = file + ":" + std::to_string(line_no);
    const Status exact = CheckJsonText(line);  // before the parse: depth first
    Json object = exact.ok() ? Json::parse(line, nullptr, false) : Json(Json::value_t::discarded);
    if (object.is_discarded() || !object.is_object() || !exact.ok()) {
      const std::string why = !exact.ok()             ? exact.message()
                              : object.is_discarded() ? "not valid JSON: " + JsonSyntaxError(line)
                                                      : "not a JSON object";
      if (!options.skip_bad) return Status::Corrupt(at, ": ", why);
      skipped.push_back({at, why});
      continue;
    }
    for (auto it = object.begin(); it != object.end(); ++it) {
      if (seen.insert(it.key()).second) columns.push_back(it.key());
    }
    objects.push_back(std::move(object));
    where.push_back(at);
  }
  if (in.bad()) return Status::IOError(file, ": read failed");
  return ImportParsedRows(file, &objects, where, skipped, columns, false, options, "jsonl");
}

}  // namespace shardfeed::converter
