// Backend-neutral view of one opened shard, and the sink a writer fills. Private to format/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardfeed/format/archive.h"
#include "shardfeed/format/layout.h"
#include "shardfeed/format/status.h"

namespace shardfeed::format {

// An opened shard: pointers into a read-only mapping owned by the concrete subclass.
class ShardStore {
 public:
  virtual ~ShardStore() = default;
  ShardHeader header{};
  const IndexEntry* index = nullptr;       // header.sample_count entries
  std::vector<const uint8_t*> chunk_data;  // header.chunk_count pointers
  std::vector<uint64_t> chunk_size;        // their sizes
  uint64_t file_bytes = 0;
  // The mapped region, for madvise.
  const uint8_t* map_base = nullptr;
  size_t map_size = 0;
};

// Checks header magic/version, the index checksum and every entry's bounds. `where` names the
// shard in messages.
Status ValidateShard(const ShardStore& shard, const std::string& where);

Result<std::unique_ptr<ShardStore>> OpenLmdbShard(const std::string& file);

class ArchiveWriter::ShardSink {
 public:
  virtual ~ShardSink() = default;
  virtual Status PutChunk(uint32_t number, const uint8_t* data, size_t size) = 0;
  // Writes header and index, syncs and closes the file.
  virtual Status Finish(const ShardHeader& header, const IndexEntry* index, size_t count) = 0;
};

Result<std::unique_ptr<ArchiveWriter::ShardSink>> CreateLmdbSink(const std::string& file);

Result<std::unique_ptr<ShardStore>> OpenHdf5Shard(const std::string& file);
Result<std::unique_ptr<ArchiveWriter::ShardSink>> CreateHdf5Sink(const std::string& file,
                                                                 const WriterOptions& options);
// Adds the final manifest (JSON) as an attribute of a finished HDF5 shard.
Status AnnotateHdf5Shard(const std::string& file, const std::string& manifest_json);

std::string ShardFileName(Backend backend, size_t number);

// fsync(2) of a file or directory, with the path in the error.
Status SyncPath(const std::string& path, bool directory);

}  // namespace shardfeed::format
