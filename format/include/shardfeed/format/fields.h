// Typed per-sample fields (format version 4): the schema an archive declares, the values a writer
// takes, and the views a reader returns. The byte layout is in layout.h (FieldsTableSize,
// VarEntry) and docs/FORMAT.md ("Fields"); this header is the C++ side of it.
//
// A schema is an ordered list of named, typed fields. Exactly one is of type `image` (the record
// every index entry addresses; transforms apply to it). A field named `label` of type `int64` is
// the class field: its value lives in IndexEntry::label (0 <= label <= kMaxClassId, and below
// the number of class names when the archive has them), so classification reads no more than
// before. Every other field is either
//   - fixed-size (int64, float32, float64, an array type whose dims are all numbers): one
//     column per field in the shard's fields table, `item_bytes()` per sample, read without
//     parsing; or
//   - variable-size (str, bytes, json, mask, boxes, an array type with a `*` dim): a per-sample
//     value in that sample's var blob, a record in the chunks addressed by the VarEntry column.
//
// Ownership and lifetime: Schema and FieldSpec are plain values. FieldValue (writer side) points
// at bytes the caller owns for the duration of the call that takes it. FieldView (reader side)
// points into the archive's mapping and lives as long as the Archive (hold the shared_ptr), like
// RecordView. All functions here are pure and thread-safe. Errors are Status values that name the
// field (callers add the archive and the sample).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardfeed/base/status.h"

namespace shardfeed::format {

// What a field holds. Values are written in the manifest as type names (TypeName), never as
// numbers.
enum class FieldKind : uint8_t {
  kImage,    // "image": the sample's image record (exactly one per schema)
  kMask,     // "mask": uint8 [H, W], H x W the image's stored shape; stored as a zstd frame
  kBoxes,    // "boxes": float32 [n, 4], x0, y0, x1, y1 in the stored image's pixels
  kInt64,    // "int64" (a field named "label" of this type is the class field)
  kFloat32,  // "float32"
  kFloat64,  // "float64"
  kStr,      // "str": UTF-8 text
  kBytes,    // "bytes": any bytes
  kJson,     // "json": JSON text (checked to parse when written)
  kArray,    // "<dtype>[<dims>]": an n-d array, dtype and dims below
};

// Element types of arrays (and of every fixed-size field). Values stored nowhere.
enum class ElemType : uint8_t { kUint8, kInt32, kInt64, kFloat16, kFloat32, kFloat64 };
size_t ElemSize(ElemType t);
std::string_view ElemName(ElemType t);  // "uint8" ... "float64" (numpy's names)

inline constexpr size_t kMaxDims = 4;     // dims of an array type
inline constexpr int64_t kAnyDim = -1;    // a "*" dim
inline constexpr size_t kMaxFields = 64;  // fields of a schema
inline constexpr size_t kMaxFieldName = 64;

struct FieldSpec {
  std::string name;  // [A-Za-z_][A-Za-z0-9_]*, at most kMaxFieldName bytes, unique
  FieldKind kind = FieldKind::kBytes;
  // Arrays, boxes (float32 [*,4]), masks (uint8 [*,*]) and the numeric scalars (one element,
  // no dims): the element type and dims (kAnyDim for "*").
  ElemType elem = ElemType::kUint8;
  std::vector<int64_t> dims;
  // "" or the name of a boxes field: this field's rows (its first dim, which must be "*") go
  // with that field's rows: same count when written, filtered together when boxes are dropped.
  std::string per;

  // Canonical type text, as in the manifest: "image", "int64", "float32[*,4]", ...
  std::string TypeName() const;
  // True for fields stored as columns (int64, float32, float64, arrays with no "*" dim).
  bool fixed() const;
  // Bytes per sample of a fixed field's column (0 for variable fields).
  size_t item_bytes() const;
  // Number of dims a stored variable value carries in its blob (arrays: dims.size(); boxes 2;
  // mask 2; str/bytes/json 0).
  size_t stored_dims() const;
};

class Schema {
 public:
  // The implicit schema of versions 1-3 (and of an empty schema): image, label.
  static Schema Legacy();
  // What an image-folder or list-file pack writes: image, label, path (str, relative to SRC).
  static Schema ImageFolder();

  // Parses the manifest's "fields" (a JSON array of {"name", "type"[, "per"]}) or a user's schema
  // (a JSON object {name: type-or-{"type", "per"}} in declaration order, as Python and
  // `pack --schema FILE.json` give it; a bare type string is {"type": that}). Checks every name,
  // type, dims, "per" target, exactly one image field, at most kMaxFields. kInvalidArgument
  // naming the field and the reason.
  static Result<Schema> FromJson(std::string_view json_text);
  // The manifest form: a JSON array of {"name", "type"[, "per"]} in field order.
  std::string ToJson() const;
  // Parses one type name ("float32[*,4]") into `spec` (name and per untouched).
  static Status ParseType(std::string_view type, FieldSpec* spec);

  const std::vector<FieldSpec>& fields() const { return fields_; }
  size_t size() const { return fields_.size(); }
  // Index of the field called `name`, or -1.
  int Find(std::string_view name) const;
  int image_field() const { return image_; }  // always >= 0 for a valid schema
  int label_field() const { return label_; }  // the class field, or -1 when there is none
  bool has_var_fields() const { return !var_.empty(); }  // any field stored in the var blob
  bool legacy() const;                                   // exactly image + label (a v1-3 archive's)

  // Adds a field (for building schemas in C++); checks as FromJson does.
  Status Add(FieldSpec spec);

  // Same fields, types and "per" in the same order (what merge requires of its parts).
  bool operator==(const Schema& other) const { return ToJson() == other.ToJson(); }
  bool operator!=(const Schema& other) const { return !(*this == other); }

  // The shard's fields table (docs/FORMAT.md "Fields"): where field `f`'s column starts for a
  // shard of `samples` samples (fixed fields only), where the VarEntry column starts (only when
  // has_var_fields()), and the table's total size (0 when the schema has neither).
  uint64_t ColumnOffset(size_t f, uint64_t samples) const;
  uint64_t VarColumnOffset(uint64_t samples) const;
  uint64_t TableSize(uint64_t samples) const;
  // The variable fields, in schema order: their positions in a var blob's entry table.
  const std::vector<int>& var_fields() const { return var_; }
  int VarSlot(size_t f) const;  // position of field f in var_fields(), or -1

 private:
  std::vector<FieldSpec> fields_;
  std::vector<int> var_;
  int image_ = -1, label_ = -1;
};

// One value to write. Fixed fields and arrays: `data` holds the elements, little-endian,
// C order, `size` = product(dims) * ElemSize; `dims` gives every dim (fixed ones too, checked).
// Masks: `data` is H*W uint8 (dims {H, W}; the writer compresses them). Boxes: float32 n*4
// (dims {n, 4}). str/json: UTF-8 text (checked), bytes: any. Scalars: one element, no dims.
struct FieldValue {
  const void* data = nullptr;
  size_t size = 0;
  std::array<uint32_t, kMaxDims> dims{};
  uint32_t ndim = 0;
  bool present = false;  // false: the sample does not give this field (an error unless the
                         // field is the image or label, handled by the writer's caller)
};
// One value per schema field, in schema order (the image and label entries are not read: they
// travel as the record and IndexEntry::label).
using FieldValues = std::vector<FieldValue>;

// Nesting depth of JSON text, scanned without recursion (strings and escapes skipped).
int JsonDepth(const void* text, size_t size);
// Whether s[0, n) is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool ValidUtf8(const uint8_t* s, size_t n);

// What CheckValue may let pass.
struct ValueChecks {
  // Writers refuse inverted boxes from sources, but archives written before that rule may hold
  // them, and what copies or checks an archive (convert, verify --decode, readers) keeps them.
  bool inverted_boxes_ok = false;
  // JSON's syntax (a parse: about 115 MB/s). UTF-8 and depth, single linear passes, are always
  // checked: they are what a reader's JSON library would crash or recurse on. The loader's
  // workers skip the parse (13 us for a 1.5 KB value, 10x a raw 16x16 sample's read); Python
  // then raises DataError naming the sample where it parses the value.
  bool json_syntax = true;
};

// Checks `value` against `spec` (dims, sizes, rows of a per-box field against `box_rows` unless
// it is -1 (not known: the caller checks them), mask dims against the image's stored `height` x
// `width`, UTF-8 of str, JSON depth and syntax of json, boxes finite and within
// +-kMaxBoxCoordinate, and not inverted; `checks` relaxes the last two).
// kInvalidArgument naming the field and what is wrong.
Status CheckValue(const FieldSpec& spec, const FieldValue& value, uint32_t height, uint32_t width,
                  int64_t box_rows, ValueChecks checks = {});

// Encodes a sample's variable values into its var blob (appending to `out`, which the writer
// places 8-byte aligned in a chunk), masks compressed at `zstd_level`. Values must have passed
// CheckValue. The fixed values go to the shard's columns as they are (item_bytes() each).
Status EncodeVarBlob(const Schema& schema, const FieldValues& values, int zstd_level,
                     std::vector<uint8_t>* out);

// A field's stored value as a reader sees it. `data` points into the mapping (or into the
// column) and stays valid while the Archive lives. Masks: `data` is the zstd frame and `dims`
// H, W (DecodeMask writes the pixels); everything else is the value's bytes as written.
// `aligned` says whether `data` is aligned for the element type (zero-copy arrays need it;
// HDF5 chunks and small LMDB values may not be).
struct FieldView {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::array<uint32_t, kMaxDims> dims{};
  uint32_t ndim = 0;
  bool aligned = true;
};

// CheckValue of a value as an archive stores it (Archive::Field's view: a fixed array's view
// carries no dims, a mask's bytes are compressed), for readers of crafted archives: what the
// writers refuse is damage. Inverted boxes pass (see CheckValue). A mask is checked for its dims
// against the image's stored `height` x `width` only (DecodeMask checks its frame).
// kInvalidArgument naming the field and what is wrong (readers report it as kCorrupt).
Status CheckStoredValue(const FieldSpec& spec, const FieldView& view, uint32_t height,
                        uint32_t width, int64_t box_rows, bool json_syntax = true);

// Parses a var blob (the bytes a VarEntry addresses, checksum already checked or not) and
// returns the view of field `f` (a variable field). kCorrupt on any inconsistency (offsets
// outside the blob, a size that disagrees with the dims, rows of a per-box field), naming the
// field; never reads outside [blob, blob + size).
Result<FieldView> VarField(const Schema& schema, const uint8_t* blob, size_t size, size_t f);

// Decompresses a mask view into `out` (dims[0] * dims[1] bytes). kCorrupt when the frame does
// not decompress to exactly that size.
Status DecodeMask(const FieldView& mask, uint8_t* out);

// A blob whose checksum disagrees: the first variable field whose value no longer parses or
// decodes (VarField, then the value's own checks: masks decompress, str/json text, finite and
// upright boxes), or "" when every one does (the damage lies where no check of a value sees it).
// Only on the error path: it decompresses every mask.
std::string DamagedVarField(const Schema& schema, const uint8_t* blob, size_t size);

}  // namespace shardfeed::format
