// The manifest: one JSON file (manifest.json) that joins an archive's shards and describes them.
// It is written last, so an archive without a manifest is never taken for a complete one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardfeed/base/status.h"
#include "shardfeed/format/fields.h"
#include "shardfeed/format/layout.h"

namespace shardfeed::format {

struct ShardInfo {
  std::string file;           // path relative to the archive directory
  uint64_t first_sample = 0;  // global index of the shard's first sample
  uint64_t sample_count = 0;
  uint64_t chunk_count = 0;
  uint64_t payload_bytes = 0;  // sum of record payload sizes (version 4: and var blob sizes)
  uint64_t file_bytes = 0;     // size of the shard file on disk (HDF5: before annotation)
  bool sizes_recorded = true;  // payload_bytes and file_bytes were in the manifest (optional)
  uint64_t content_hash = 0;   // ShardHeader::content_hash, repeated here
  // A merged archive links its parts' shard files unchanged, so a shard's header may record
  // another position than the shard has here: the number and first sample it had in its part.
  bool header_override = false;
  uint32_t header_number = 0;
  uint64_t header_first_sample = 0;
};

// What `pack --part I/N` records: the part's place in a split pack, so `merge` can check that
// the parts belong together (same source list, same options) and that none is missing.
struct PartInfo {
  uint32_t index = 0, count = 0;
  uint64_t first_item = 0;           // this part's first item in the (shuffled) source list
  uint64_t total_items = 0;          // items in the whole source list
  uint64_t source_fingerprint = 0;   // XXH3 of the whole source list (paths, labels, classes)
  uint64_t options_fingerprint = 0;  // XXH3 of the pack options that shape records
};

struct Manifest {
  uint32_t format_version = kFormatVersion;
  Backend backend = Backend::kLmdb;
  Encoding encoding = Encoding::kJpeg;
  uint64_t sample_count = 0;
  // Version 4: the archive's fields ("fields" in the manifest). Archives of versions 1-3 read as
  // Schema::Legacy() (image, label).
  Schema schema = Schema::Legacy();
  // label i is class_names[i]. Version 4: empty when the schema has no class field ("label").
  std::vector<std::string> class_names;
  std::vector<uint64_t> class_counts;  // samples per label; empty without a class field
  // The one shape every record decodes to (UprightHeight/UprightWidth x 3), else all zero:
  // recorded by the writer whenever the records share it, whatever options made them (version
  // 3; before, only raw/zstd packed with --size and --crop).
  uint32_t height = 0, width = 0, channels = 0;
  uint64_t source_bytes = 0;  // bytes of the source files that were packed
  // jpeg packed with a size cap (pack --encoding jpeg --size): how many records were decoded,
  // resized and re-encoded (the others hold their source file's bytes). Absent otherwise.
  std::optional<uint64_t> resized_records;
  // Version 3: how many records do not hold their source file's bytes (decoded and stored again:
  // as zstd pixels by the encoding "auto", as JPEG by "jpeg" for non-JPEG inputs or a size cap,
  // any input by raw/zstd). Absent when unknown (convert/merge of older archives).
  std::optional<uint64_t> reencoded_records;
  std::string created_by;    // "shardfeed <version>"
  std::string created_at;    // UTC, ISO 8601
  std::string options_json;  // the pack options as a JSON object (free-form, for humans)
  std::vector<ShardInfo> shards;
  bool is_part = false;  // made by `pack --part`: `part` says which
  PartInfo part;

  // The JSON text, ending in "manifest_xxh3": the XXH3-64 of the compact JSON of every other
  // field, so an edit to any field (a class name, a count) is detected.
  std::string ToJson() const;
  // Parses and checks a manifest: size (kMaxManifestBytes), nesting depth (kMaxManifestDepth),
  // the type and range of every field, the checksum (version >= 2), shard ranges that tile
  // [0, sample_count) and class counts that add up. Every failure names `origin` and the field.
  static Result<Manifest> FromJson(const std::string& text, const std::string& origin);
};

// A new manifest describing the same records as `m` (encoding, schema, classes, shape, pack
// options), for archives rewritten from it (convert, merge); counts and shards are the writer's
// (and the schema, at Finish, the writer's options.schema).
Manifest SameRecordsAs(const Manifest& m);

inline constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;
inline constexpr int kMaxManifestDepth = 32;

// True when `text` is a manifest of this format (any version): {"format": "shardfeed", ...}.
// What --overwrite requires before it replaces a directory.
bool IsShardfeedManifest(const std::string& text);

// The number of entries in a manifest's "shards" list, counted without building the JSON
// document (memory independent of the text's size): Archive::Open checks it against the files
// of the archive directory before FromJson allocates a document for them. kCorrupt for text that
// is not JSON or is nested deeper than kMaxManifestDepth.
Result<uint64_t> CountManifestShards(const std::string& text, const std::string& origin);

// Formats a 64-bit hash as 16 lowercase hex digits, and back.
std::string HashToHex(uint64_t hash);

// Class names are stored as UTF-8 text: kInvalidArgument naming the first that is not (class i,
// its bytes shown with U+FFFD), for a writer to refuse before it writes (a folder named in
// Latin-1 made the manifest's JSON library throw after the whole pack).
Status CheckClassNames(const std::vector<std::string>& names);
bool HexToHash(const std::string& hex, uint64_t* out);

}  // namespace shardfeed::format
