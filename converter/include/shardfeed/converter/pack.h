// Packing: image folder or list file -> archive.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "shardfeed/base/status.h"
#include "shardfeed/codec/codec.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/format/fields.h"
#include "shardfeed/imaging/image.h"

namespace shardfeed::converter {

// One field value, owning its bytes (format::FieldValue's layout: elements little-endian in C
// order, scalars one element with ndim 0, str/json UTF-8 text, boxes float32 [n,4], masks uint8
// [H,W]). Importers and the bindings build these; the writer checks them against the schema.
struct OwnedValue {
  std::vector<uint8_t> bytes;
  std::array<uint32_t, format::kMaxDims> dims{};
  uint32_t ndim = 0;
  bool present = false;  // false: the sample does not give this field

  // A view of this value, valid while it lives unchanged.
  format::FieldValue view() const;

  static OwnedValue Int64(int64_t v);
  static OwnedValue Float32(float v);
  static OwnedValue Float64(double v);
  static OwnedValue Text(std::string_view text);  // str, json and bytes fields
  // An array (or boxes, mask): `size` bytes of elements with these dims (at most kMaxDims).
  static OwnedValue Array(const void* data, size_t size, const std::vector<uint32_t>& dims);
};

// One sample of a source: its image file (or a byte range of one) and its field values.
struct SourceItem {
  std::string path;
  int32_t label = 0;
  // A byte range of `path` holding the image (a member of a tar shard); length 0: the whole file.
  uint64_t offset = 0, length = 0;
  // One value per field of SourceList::schema, in schema order (image and label entries unused;
  // `path` is filled by Pack when SourceList::path_field). Empty for folder and list packs.
  std::vector<OwnedValue> values;
  std::string name;  // how errors name the sample ("train.jsonl:12"); empty: `path`
  // The image's size as the source's annotations declare it (COCO's width/height); 0: none.
  // The writer checks it against the image and reads boxes in the frame it names (Sample).
  uint32_t declared_width = 0, declared_height = 0;
  bool frame_from_size = false;  // Sample::frame_from_size
};

struct SkippedFile {
  std::string path;
  std::string reason;
};

struct SourceList {
  std::string root;
  std::vector<SourceItem> items;
  std::vector<std::string> class_names;
  // The class names are the labels' own texts (JSONL/CSV string labels), not "0".."max" for
  // integer ones: --class-names then looks each label up by its name.
  bool class_names_from_text = false;
  std::vector<SkippedFile> ignored;  // not candidates at all (hidden files, files outside classes)
  // Bad rows an importer skipped (PackOptions::skip_bad): listed with the pack's skipped files.
  std::vector<SkippedFile> skipped;
  // The fields every item gives (format/fields.h). Folder and list packs: ImageFolder().
  format::Schema schema = format::Schema::ImageFolder();
  // The schema's `path` field (str) is each item's path relative to `root` ('/'-separated),
  // filled in by Pack rather than held per item.
  bool path_field = true;
  std::string kind = "folder";  // folder, list, jsonl, csv, coco, webdataset (the manifest's)
  // What the importer decided that its user may not expect (a column typed str for one word
  // among numbers, a column with no value left out): Pack copies them to its result.
  std::vector<std::string> notes;
};

// An ImageFolder tree: each sub-directory of `root` is a class (labels by sorted name, as
// torchvision's ImageFolder assigns them); every non-hidden file below it, recursively, is a
// candidate sample, in torchvision's order. Symlinks are followed; directory cycles are cut.
// Paths in `exclude` (the archive being written and its siblings, when the output lies inside
// the tree) are ignored, so packing into the image folder never packs an archive into itself.
Result<SourceList> ScanImageFolder(const std::string& root,
                                   const std::vector<std::string>& exclude = {});

// The paths a pack to `out` creates beside it: out, out.partial, out.lock, out.old, out.parts.
std::vector<std::string> OutputPaths(const std::string& out);

// A list file: "path label" per line (Caffe convert_imageset; the label is the last
// whitespace-separated field, so paths may hold spaces) or "index<TAB>label<TAB>path" (MXNet
// .lst). Relative paths are taken from `root`. Blank lines and lines starting with '#' are
// skipped. Class names are "0".."max label".
Result<SourceList> ReadListFile(const std::string& list_file, const std::string& root);

// JPEG passthrough checks (codec/codec.h): kNone (signature only), kHeader (markers and an
// end-of-image marker; the default), kFull (every image decoded).
using Validation = codec::Validation;

struct PackOptions {
  // auto (the default): JPEG inputs keep their bytes, every other input is stored lossless as
  // zstd pixels; per-record encodings (format version 3). With a size (a resolution cap) auto
  // packs as jpeg.
  format::Encoding encoding = format::Encoding::kAuto;
  // raw/zstd: resize so the short side is this (0: keep). jpeg: a resolution cap, the
  // fidelity-for-speed trade of FFCV's max_resolution: an image whose short side (long side,
  // with max_side) exceeds `size` is decoded, turned upright (EXIF orientation applied), resized
  // to that side and re-encoded once at `quality`; every other image keeps its original bytes.
  uint32_t size = 0;
  bool max_side = false;     // jpeg with size: cap the long side instead of the short side
  bool center_crop = false;  // raw/zstd with size: crop the centre size x size
  int quality = 90;          // JPEG quality of re-encoded images (non-JPEG inputs, size caps)
  int level = 1;             // zstd level (1: 30% faster than 3 for 7% more bytes, measured)
  int workers = 0;           // 0: all cores
  bool shuffle = false;
  uint64_t seed = 0;
  bool strict = false;  // any skipped file fails the pack and leaves no archive
  // A sample whose fields do not match the schema (or an importer's bad row) is skipped and
  // listed with the bad files instead of failing the pack.
  bool skip_bad = false;
  Validation validation = Validation::kHeader;
  bool jpeg_indexed = false;  // jpeg: --jpeg-layout indexed (codec::EncodeOptions::jpeg_indexed)
  imaging::Limits limits;
  format::WriterOptions writer;
  std::string options_json;  // recorded in the manifest (and fingerprinted for parts)
  // Split packing: this pack writes part `part` of `parts` (0-based), the items
  // [n*part/parts, n*(part+1)/parts) of the sorted (then, with shuffle, shuffled) source list,
  // and records that in the manifest for `Merge`. part_record: record it even when parts == 1.
  uint32_t part = 0, parts = 1;
  bool part_record = false;
};

struct PackStats {
  uint64_t total = 0, done = 0, packed = 0;
  uint64_t resized = 0;  // jpeg with size: records decoded, resized and re-encoded
  // Records that do not hold their source file's bytes: every record of raw/zstd, non-JPEG
  // inputs of jpeg (lossy, at `quality`) and resized ones, non-JPEG inputs of auto (lossless).
  uint64_t reencoded = 0;
  uint64_t source_bytes = 0, payload_bytes = 0;
  double seconds = 0;
};

struct PackResult {
  PackStats stats;
  std::vector<SkippedFile> skipped;
  std::vector<SkippedFile> ignored;
  std::vector<std::string> notes;  // the source's (SourceList::notes): printed, and in the report
  std::string output;
  // The encoding the archive was packed with: options.encoding, except auto with a size (jpeg).
  format::Encoding encoding = format::Encoding::kAuto;
  // The pack failed on bad data (a bad sample without skip_bad, a skip under strict): the
  // sample's name. The CLI exits 1 then (2/3 for usage and I/O errors).
  std::string failed_sample;
};

using ProgressFn = std::function<void(const PackStats&)>;

// Packs `source` into an archive at `out` (written aside, renamed into place at the end). The
// same source and options give the same records in the same order whatever `workers` is. Bad
// files are skipped and listed in `result` (with `strict`, the first one fails the pack and no
// archive is written). `result` is filled also when the pack fails. `progress`, if set, is
// called from the calling thread about ten times a second.
Status Pack(const SourceList& source, const std::string& out, const PackOptions& options,
            PackResult* result, const ProgressFn& progress = nullptr);

// The record-shaping part of the options, as the codecs take it.
codec::EncodeOptions EncodeOptionsOf(const PackOptions& options);

// Decodes a source image exactly as Pack does for raw/zstd records (same resize and crop).
// `scratch` holds the full-size decode between calls (allocated once per worker).
Status DecodeForRecord(imaging::Decoder& decoder, const uint8_t* data, size_t size,
                       const PackOptions& options, imaging::Image* out,
                       imaging::Image* scratch = nullptr);

// The skip report as JSON (written by `pack --report`), with `error` (the pack's, when it
// failed) as a field when not empty.
std::string PackReportJson(const PackResult& result, const std::string& source,
                           const std::string& error = "");

// Whether `pack --report PATH` may write PATH, checked before any work: a path that does not
// exist (in an existing folder), or, with `overwrite`, a previous pack report (a JSON object with
// the report's keys). Anything else of the user's is never replaced: kInvalidArgument naming it.
Status CheckReportPath(const std::string& path, bool overwrite);

// Writes a report checked by CheckReportPath: a new file is created exclusively (O_EXCL); a
// previous report is replaced whole (a temporary file renamed over it), never half written.
Status WriteReport(const std::string& path, const std::string& text, bool overwrite);

// Why `label` is not a class id a writer takes (negative, or above format::kMaxClassId), or OK.
Status CheckClassId(int64_t label);

// The class names of an archive whose labels are plain numbers: "0".."max_label" (-1: none).
std::vector<std::string> NumericClassNames(int64_t max_label);

// Deterministic Fisher-Yates shuffle with the splitmix64 stream of `seed` (base/random.h).
void ShuffleItems(std::vector<SourceItem>* items, uint64_t seed);

// XXH3 of a source list as parts see it: class names, then every item's path relative to the
// root and its label, in order. Two machines that mount the source elsewhere agree on it.
uint64_t SourceFingerprint(const SourceList& source, const std::vector<SourceItem>& items);

// Where `pack --part I/N` writes by default: OUT.parts/part-IIIII-of-NNNNN.
std::string DefaultPartPath(const std::string& out, uint32_t part, uint32_t parts);

struct MergeResult {
  uint64_t samples = 0, parts = 0, shards = 0;
  uint64_t copied_shards = 0;  // shards copied rather than hard-linked (another filesystem)
};

// Joins the parts of a split pack into one archive at `out` without copying records: each part's
// shard files are hard-linked (copied only across filesystems) and one manifest joins them.
// `parts` lists part archives, or holds one directory whose archive sub-directories are the
// parts. Refused, naming the part: one missing or given twice, parts of another split count,
// source list or option set, or of another backend, encoding, shape or class list. Labels,
// class names and sample order equal a single pack of the same source with the same options;
// merging the same parts again gives the same archive (the same manifest, byte for byte).
Status Merge(const std::vector<std::string>& parts, const std::string& out, bool overwrite,
             MergeResult* result);

}  // namespace shardfeed::converter
