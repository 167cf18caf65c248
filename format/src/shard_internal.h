// Backend-neutral view of one opened shard, and the sink a writer fills. Private to format/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardfeed/base/status.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/format/layout.h"
#include "shardfeed/format/manifest.h"

namespace shardfeed::format {

// An opened shard: pointers into a read-only mapping owned by the concrete subclass.
class ShardStore {
 public:
  virtual ~ShardStore() = default;
  ShardHeader header{};
  const IndexEntry* index = nullptr;  // header.sample_count entries
  // Version 4: the fields table (Schema::TableSize bytes, 8-byte aligned), or null and 0.
  const uint8_t* fields = nullptr;
  uint64_t fields_size = 0;
  std::vector<const uint8_t*> chunk_data;  // header.chunk_count pointers
  std::vector<uint64_t> chunk_size;        // their sizes
  // Version 4, HDF5 shards holding /images (var_stream true): the var stream /shardfeed/var,
  // every sample's var blob in sample order; a VarEntry of such a shard has chunk 0 and an
  // offset into it (docs/FORMAT.md, "A shard (HDF5)"). var_data may be null when var_size is 0.
  // Every other shard: false, its blobs lie in the chunks.
  bool var_stream = false;
  const uint8_t* var_data = nullptr;
  uint64_t var_size = 0;
  uint64_t file_bytes = 0;
  // The mapped region, for madvise.
  const uint8_t* map_base = nullptr;
  size_t map_size = 0;
};

// The one shard validator, in two steps every backend runs.
// CheckShardHeader: right after the 64-byte header is read, before anything is sized from it:
// magic, a readable version, and equality with the manifest's entry for shard `number` (so
// counts are bounded by the manifest, which is bounded by its own checks), plus counts that the
// file's size can hold.
Status CheckShardHeader(const ShardHeader& header, const ShardInfo& info, size_t number,
                        uint64_t file_bytes, const std::string& where);
// Then, with the index and chunk table in memory: the index checksum (all of it, IndexCheck::kFull
// only), and the entries [begin, end) (all at once, or a page at a time when lazy): inside their
// chunk, the manifest's encoding (and fixed shape), at least one pixel, a channel count the
// encoding allows, a raw record's exact size, a label below the class count. `first_sample` is
// the shard's first global sample (messages name global samples); labels are added to
// `class_counts` when given (sized to the class count).
Status CheckIndexChecksum(const ShardStore& shard, const std::string& where);
Status ValidateEntries(const ShardStore& shard, const Manifest& manifest, uint64_t first_sample,
                       uint64_t begin, uint64_t end, const std::string& where,
                       std::vector<uint64_t>* class_counts);

// Version 4: field f of `schema` is a column of the fields table (fixed, not the class field).
inline bool IsColumn(const Schema& schema, size_t f) {
  return schema.fields()[f].fixed() && static_cast<int>(f) != schema.label_field();
}
inline size_t FixedColumns(const Schema& schema) {
  size_t n = 0;
  for (size_t f = 0; f < schema.size(); ++f) n += IsColumn(schema, f);
  return n;
}

// HDF5 stores fixed-shape raw/zstd records as /images (one record per HDF5 chunk), whatever the
// schema: var blobs then go to the var stream /shardfeed/var instead of the chunks.
inline bool Hdf5ImagesMode(const WriterOptions& o) {
  return o.backend == Backend::kHdf5 && o.height > 0 &&
         (o.encoding == Encoding::kRaw || o.encoding == Encoding::kZstd);
}

// Version 4 (fields_table.cpp). The table's size against the schema (every shard open), its
// checksum (a full open, verify), one sample's VarEntry (copied: the table need not be aligned
// for it), the entries [begin, end) inside their chunks (a full open; lazily, each when read),
// and verify's exact check of where blobs lie (after their record, same chunk), summing the
// blobs' bytes and the padding before them (HDF5 /images shards: back to back in the var
// stream). Errors name `where` (the shard) and the sample.
Status CheckFieldsTable(const ShardStore& shard, const Schema& schema, const std::string& where);
Status CheckFieldsChecksum(const ShardStore& shard, const std::string& where);
VarEntry VarEntryOf(const ShardStore& shard, const Schema& schema, uint64_t i);
Status ValidateVarEntries(const ShardStore& shard, const Schema& schema, uint64_t first_sample,
                          uint64_t begin, uint64_t end, const std::string& where);
Status VarLayout(const ShardStore& shard, const Schema& schema, uint64_t first_sample,
                 const std::string& where, uint64_t* blobs, uint64_t* padding);
// The bytes a VarEntry checked by ValidateVarEntries addresses (its chunk, or the HDF5 /images
// shard's var stream).
const uint8_t* VarBlobData(const ShardStore& shard, const VarEntry& v);

Result<std::unique_ptr<ShardStore>> OpenLmdbShard(const std::string& file, const ShardInfo& info,
                                                  size_t number);

class ArchiveWriter::ShardSink {
 public:
  virtual ~ShardSink() = default;
  virtual Status PutChunk(uint32_t number, const uint8_t* data, size_t size) = 0;
  // HDF5 /images shards with variable fields: the shard's var stream, once, before Finish.
  virtual Status PutVarStream(const uint8_t* data, size_t size) {
    (void)data, (void)size;
    return Status::Internal("this backend keeps var blobs in its chunks");
  }
  // Writes the fields table (when `fields_size` > 0), header and index, syncs and closes the file.
  virtual Status Finish(const ShardHeader& header, const IndexEntry* index, size_t count,
                        const uint8_t* fields, size_t fields_size) = 0;
};

Result<std::unique_ptr<ArchiveWriter::ShardSink>> CreateLmdbSink(const std::string& file);

Result<std::unique_ptr<ShardStore>> OpenHdf5Shard(const std::string& file, const ShardInfo& info,
                                                  size_t number);
Result<std::unique_ptr<ArchiveWriter::ShardSink>> CreateHdf5Sink(const std::string& file,
                                                                 const WriterOptions& options);
// verify's check of what an HDF5 shard holds for h5py users beside the index (VerifyDerived):
// the root attributes `format` and `format_version` (the header's), and /labels, /shapes,
// /record_offsets and /record_sizes against the index, as the writer derives them. `file` is the
// local file (a remote shard's cached copy); errors name `where` and the first sample that
// differs. Takes the HDF5 lock; reads the datasets through HDF5 (O(samples)).
Status CheckHdf5Mirrors(const std::string& file, const ShardStore& shard, uint64_t first_sample,
                        const std::string& where);
// Adds the final manifest (JSON) as an attribute of a finished HDF5 shard.
Status AnnotateHdf5Shard(const std::string& file, const std::string& manifest_json);

std::string ShardFileName(Backend backend, size_t number);

// fsync(2) of a file or directory, with the path in the error.
Status SyncPath(const std::string& path, bool directory);

// Reads a whole file that must be a regular file of at most `max_bytes` (not a FIFO, a device
// or a link to /dev/zero): opened non-blocking, checked with fstat before any read.
Result<std::string> ReadBoundedFile(const std::string& path, uint64_t max_bytes);

}  // namespace shardfeed::format
