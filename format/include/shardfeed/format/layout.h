// The on-disk layout of a shardfeed archive, format version 4 (reads 1 to 3).
//
// This header and docs/FORMAT.md describe the same thing and change together. Every field is
// little-endian with a fixed width; the static_asserts pin sizes and offsets so that a compiler
// or a careless edit cannot move them. Writer and reader both include this file and nothing else
// defines the layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shardfeed::format {

// The version this build writes, and the oldest it reads (docs/FORMAT.md, "Versions"). A reader
// refuses any other version with both numbers in the message. Version 2 added the manifest's
// own checksum ("manifest_xxh3"); its shards are laid out exactly as version 1's. Version 3
// records the manifest's "shape" for every archive whose records decode to one shape, JPEG
// included (the upright shape, after EXIF orientation; see UprightHeight), and adds the archive
// encoding "auto" (per-record encodings) and "reencoded_records"; shards unchanged. Version 4
// adds typed per-sample fields (fields.h): the manifest's "fields" (the schema), a per-shard
// fields table (fixed-size columns, then a VarEntry per sample when the schema has variable
// fields) whose checksum is ShardHeader::fields_checksum, and var blobs in the chunks.
inline constexpr uint32_t kFormatVersion = 4;
inline constexpr uint32_t kMinFormatVersion = 1;
inline constexpr bool IsReadableVersion(uint32_t v) {
  return v >= kMinFormatVersion && v <= kFormatVersion;
}
inline constexpr std::string_view kManifestFileName = "manifest.json";
inline constexpr std::string_view kFormatName = "shardfeed";

// What a record's payload holds. Values are stored on disk: never renumber.
enum class Encoding : uint8_t {
  kJpeg = 1,  // a complete JPEG file (JFIF/EXIF/Adobe), bytes as given
  kRaw = 2,   // height * width * channels uint8 pixels, HWC, RGB
  kZstd = 3,  // a single zstd frame that decompresses to a kRaw payload
  // Version 3, an archive's encoding only (never an IndexEntry's): records of several encodings,
  // each entry giving its own (pack's default: JPEG inputs keep their bytes, others are stored
  // lossless as kZstd).
  kAuto = 4,
};
// True for the encodings an IndexEntry may hold.
inline constexpr bool IsRecordEncoding(uint8_t e) { return e >= 1 && e <= 3; }

// Which container holds the shards. Values are stored in the manifest as strings.
enum class Backend : uint8_t {
  kLmdb = 1,
  kHdf5 = 2,
};

std::string_view EncodingName(Encoding encoding);
bool ParseEncoding(std::string_view name, Encoding* out);
std::string_view BackendName(Backend backend);
bool ParseBackend(std::string_view name, Backend* out);

// The largest class id a writer takes (IndexEntry.label): an archive names at most kMaxClassId + 1
// classes, so that numeric class names ("0".."max") and their counts fit a manifest
// (kMaxManifestBytes). A label that is only a number used to make pack build a name for every
// number below it: one label of 2000000000 ran it out of memory.
inline constexpr int64_t kMaxClassId = (int64_t{1} << 22) - 1;

// One entry per sample, in sample order, stored as a packed array (the shard's "index").
// Sample i of a shard is `chunk_payload(chunk) + offset`, `size` bytes: O(1), no search.
struct IndexEntry {
  uint64_t checksum;    // XXH3-64 (seed 0) of the payload bytes as stored
  uint32_t chunk;       // chunk number within the shard
  uint32_t offset;      // byte offset of the payload within the chunk
  uint32_t size;        // payload size in bytes
  int32_t label;        // class index (>= 0)
  uint16_t height;      // pixel rows of the image as stored (JPEG: before orientation)
  uint16_t width;       // pixel columns, likewise
  uint8_t channels;     // raw/zstd: 3; JPEG: components in the file (1, 3 or 4)
  uint8_t encoding;     // an Encoding value other than kAuto
  uint8_t orientation;  // EXIF orientation 1..8 still to apply on decode (JPEG); 1 otherwise
  uint8_t flags;        // kFlag* bits; others zero
};
static_assert(sizeof(IndexEntry) == 32, "IndexEntry is 32 bytes on disk");
static_assert(offsetof(IndexEntry, chunk) == 8);
static_assert(offsetof(IndexEntry, offset) == 12);
static_assert(offsetof(IndexEntry, size) == 16);
static_assert(offsetof(IndexEntry, label) == 20);
static_assert(offsetof(IndexEntry, height) == 24);
static_assert(offsetof(IndexEntry, width) == 26);
static_assert(offsetof(IndexEntry, channels) == 28);
static_assert(offsetof(IndexEntry, encoding) == 29);
static_assert(offsetof(IndexEntry, orientation) == 30);
static_assert(offsetof(IndexEntry, flags) == 31);

inline constexpr uint8_t kFlagAdobe = 1;  // JPEG has an Adobe APP14 marker (inverted CMYK)
// JPEG re-laid with restart markers and a region index (pack --jpeg-layout indexed): the payload
// is the JPEG (SOI..EOI), then JpegRegionIndex::mcu_rows little-endian uint32 (the offset, from
// the payload's first byte, of each MCU row's first entropy-coded byte), then a JpegRegionIndex.
// Readers that do not know the bit refuse the record ("unknown flags").
inline constexpr uint8_t kFlagJpegIndexed = 2;
inline constexpr uint8_t kKnownFlags = kFlagAdobe | kFlagJpegIndexed;

// The last 24 bytes of a kFlagJpegIndexed payload (docs/FORMAT.md, "Indexed JPEG records").
struct JpegRegionIndex {
  uint32_t jpeg_size;         // bytes of the JPEG at the payload's start (ends with EOI)
  uint32_t mcu_rows;          // entries of the row table (between the JPEG and this struct)
  uint32_t scan_end;          // offset of the EOI marker that ends the scan
  uint16_t restart_interval;  // MCUs per restart segment (the JPEG's DRI); divides a row's MCUs
  uint16_t reserved;          // zero
  uint32_t table_checksum;    // low 32 bits of XXH3-64 (seed 0) of the row table's bytes
  char magic[4];              // "SFJX"
};
static_assert(sizeof(JpegRegionIndex) == 24, "JpegRegionIndex is 24 bytes on disk");
static_assert(offsetof(JpegRegionIndex, scan_end) == 8);
static_assert(offsetof(JpegRegionIndex, restart_interval) == 12);
static_assert(offsetof(JpegRegionIndex, table_checksum) == 16);
static_assert(offsetof(JpegRegionIndex, magic) == 20);
inline constexpr char kJpegRegionIndexMagic[4] = {'S', 'F', 'J', 'X'};

// The deepest nesting of arrays and objects a json field value may have. Deeper text is refused
// where it comes in (importers, writers) and where it is read: nlohmann's dump (and every
// reader's JSON library) recurses once a level, so 100,000 levels overflowed the stack.
inline constexpr int kMaxJsonDepth = 256;
// The largest magnitude of a boxes coordinate (docs/FORMAT.md, "Fields"): finite, within it.
inline constexpr float kMaxBoxCoordinate = 1e30f;

// The shape a record decodes to: JPEG orientations 5..8 swap rows and columns; every record
// decodes to 3 channels (RGB). What the manifest's "shape" means (version 3).
inline constexpr uint32_t UprightHeight(const IndexEntry& e) {
  return e.orientation >= 5 ? e.width : e.height;
}
inline constexpr uint32_t UprightWidth(const IndexEntry& e) {
  return e.orientation >= 5 ? e.height : e.width;
}

// One per shard, stored under the key "header" (LMDB) / as the dataset "header" (HDF5).
struct ShardHeader {
  char magic[8];             // "SFSHARD\0"
  uint32_t format_version;   // the version of the writer of this file (1 to 4; 1-3 share a
                             // layout, 4 adds fields_checksum and the fields table)
  uint32_t shard_number;     // position of this shard in the manifest
  uint64_t first_sample;     // global index of this shard's sample 0
  uint64_t sample_count;     // entries in the index
  uint64_t chunk_count;      // chunks 0 .. chunk_count-1 exist
  uint64_t index_checksum;   // XXH3-64 of the index bytes
  uint64_t content_hash;     // XXH3-64 streamed over every chunk in order, (HDF5 /images shards)
                             // the var stream, then the index bytes,
                             // then (version 4) the fields table bytes
  uint64_t fields_checksum;  // version 4: XXH3-64 of the fields table (0 when it is empty);
                             // before: reserved, zero
};
static_assert(sizeof(ShardHeader) == 64, "ShardHeader is 64 bytes on disk");
static_assert(offsetof(ShardHeader, format_version) == 8);
static_assert(offsetof(ShardHeader, first_sample) == 16);
static_assert(offsetof(ShardHeader, index_checksum) == 40);
static_assert(offsetof(ShardHeader, content_hash) == 48);
static_assert(offsetof(ShardHeader, fields_checksum) == 56);

// Version 4: where a sample's var blob (its variable-size field values, docs/FORMAT.md "Fields")
// lives. One per sample, the last column of the shard's fields table, present when the schema
// has variable fields. The blob follows its sample's record in the same chunk, at the first
// offset after the record that is a multiple of 8 (zero padding between). An HDF5 shard holding
// /images has no record stream: its blobs are the var stream, the dataset /shardfeed/var, each at
// the first multiple of 8 at or after the previous sample's blob's end (the first at 0, zero
// padding between, nothing after the last); there chunk is 0 and offset is into that stream,
// which the shard's content hash streams after the chunks.
struct VarEntry {
  uint64_t checksum;  // XXH3-64 (seed 0) of the blob's bytes
  uint32_t chunk;     // chunk number within the shard (HDF5 /images shard: 0)
  uint32_t offset;  // byte offset of the blob within the chunk or the var stream (a multiple of 8)
  uint32_t size;    // blob size in bytes
  uint32_t reserved;  // zero
};
static_assert(sizeof(VarEntry) == 24, "VarEntry is 24 bytes on disk");
static_assert(offsetof(VarEntry, chunk) == 8);
static_assert(offsetof(VarEntry, size) == 16);

// A var blob starts with one of these per variable field (schema order), then the values, each
// at an 8-byte aligned offset from the blob's start. An array/boxes/mask value begins with its
// dims (u32 each, FieldSpec::stored_dims() of them) padded to 8 bytes, then its data (a mask's
// data is a zstd frame of H*W bytes).
struct VarSlot {
  uint32_t offset;  // from the blob's first byte
  uint32_t size;    // bytes of the value, dims included
};
static_assert(sizeof(VarSlot) == 8);

inline constexpr char kShardMagic[8] = {'S', 'F', 'S', 'H', 'A', 'R', 'D', '\0'};

// LMDB keys. Chunks sort before "header" and "index", so a writer appends in key order.
inline constexpr char kLmdbChunkPrefix = 'c';  // 'c' + chunk number as 4 bytes big-endian
inline constexpr std::string_view kLmdbHeaderKey = "header";
inline constexpr std::string_view kLmdbIndexKey = "index";
inline constexpr std::string_view kLmdbFieldsKey = "fields";  // version 4, when not empty

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "shardfeed maps little-endian structs directly; big-endian hosts are unsupported");

}  // namespace shardfeed::format
