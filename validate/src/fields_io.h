// Internal: the typed fields of a sample (format version 4) as the tools see them: checked
// (verify --decode), summarised (inspect), written out as JSON (extract) and drawn (inspect
// --grid). Every function only reads the Archive and is thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardfeed/base/status.h"
#include "shardfeed/format/archive.h"

namespace shardfeed::validate {

// Every field of sample `i` besides the image and the class field read and checked against the
// schema as the writers check values (format::CheckValue): var blob checksum, dims
// (Archive::Field), masks decompressed to the image's stored shape (refused past `max_pixels`
// before any allocation), JSON parsed and within its depth, text UTF-8, boxes finite and not
// inverted, per-box rows equal to their boxes' rows. kCorrupt (or kChecksumMismatch,
// kResourceExhausted) naming the field.
Status CheckSampleFields(const format::Archive& archive, uint64_t i, uint64_t max_pixels);

// Per field: stored bytes over the archive (records for the image, 0 for the class field, the
// column or the var values otherwise) and, for boxes and per-box fields, rows in all.
struct FieldSize {
  std::string name, type, per;
  std::string stored;  // "records", "index", "column" or "blob"
  uint64_t bytes = 0, rows = 0;
};
std::vector<FieldSize> FieldSizes(const format::Archive& archive);

// A field value as JSON: numbers, nested lists for arrays and boxes, text, parsed JSON,
// {"base64": ...} for bytes. Masks go through `mask_file` (given the field, the HxW pixels and
// their shape, it returns the JSON value, e.g. the path of a PNG it wrote).
using MaskWriter = std::function<Result<nlohmann::json>(size_t field, const uint8_t* pixels,
                                                        uint32_t height, uint32_t width)>;
Result<nlohmann::json> FieldJson(const format::Archive& archive, uint64_t i, size_t f,
                                 const MaskWriter& mask_file);

// What every field other than the image and the class field spans over the archive: per field
// {"type", "samples" (readable), "rows" {min, max, mean} of the first dim (boxes, per-box and
// variable arrays), "values" {min, max, mean} of the elements (numeric fields, boxes),
// "bytes" {min, max, mean} (str, bytes, json, masks as stored), "errors" (unreadable or
// failing their checksum)}. Samples whose `left_out` entry is true (stats' errors) are not
// counted at all.
nlohmann::json FieldSummaries(const format::Archive& archive,
                              const std::vector<bool>& left_out = {});

// Boxes (and a mask) of sample `i` turned upright with its image (EXIF orientation of JPEG
// records): what inspect --grid draws over the decoded image. Empty when the schema has none.
struct SampleOverlay {
  std::vector<float> boxes;   // x0, y0, x1, y1 per box, upright pixels
  std::vector<uint8_t> mask;  // upright, width x height of the upright image, or empty
  std::string caption;        // the first str field named caption/captions/text/title, if any
};
Result<SampleOverlay> Overlay(const format::Archive& archive, uint64_t i);

}  // namespace shardfeed::validate
