// The version-4 checks of a shard's fields table and var entries (docs/FORMAT.md "Fields"),
// shared by Archive's open, Field() and the verify paths. Declared in shard_internal.h.
#include <xxhash.h>

#include <cstring>

#include "shard_internal.h"

namespace shardfeed::format {

Status CheckFieldsTable(const ShardStore& shard, const Schema& schema, const std::string& where) {
  const uint64_t want = schema.TableSize(shard.header.sample_count);
  if (shard.fields_size != want) {
    return Status::Corrupt(where, ": fields table is ", shard.fields_size, " bytes, the fields (",
                           schema.ToJson(), ") of ", shard.header.sample_count, " samples need ",
                           want);
  }
  return Status::OK();
}

Status CheckFieldsChecksum(const ShardStore& shard, const std::string& where) {
  if (shard.fields_size == 0) return Status::OK();
  const uint64_t got = XXH3_64bits(shard.fields, shard.fields_size);
  if (got != shard.header.fields_checksum) {
    return Status::ChecksumMismatch(where, ": fields table checksum mismatch (stored ",
                                    HashToHex(shard.header.fields_checksum), ", computed ",
                                    HashToHex(got), ")");
  }
  return Status::OK();
}

VarEntry VarEntryOf(const ShardStore& shard, const Schema& schema, uint64_t i) {
  VarEntry v;
  std::memcpy(
      &v, shard.fields + schema.VarColumnOffset(shard.header.sample_count) + i * sizeof(VarEntry),
      sizeof v);
  return v;
}

Status ValidateVarEntries(const ShardStore& shard, const Schema& schema, uint64_t first_sample,
                          uint64_t begin, uint64_t end, const std::string& where) {
  if (!schema.has_var_fields()) return Status::OK();
  for (uint64_t i = begin; i < end; ++i) {
    const VarEntry v = VarEntryOf(shard, schema, i);
    // An HDF5 /images shard addresses its var stream (chunk 0), every other shard its chunks.
    const bool inside = shard.var_stream
                            ? v.chunk == 0 && uint64_t{v.offset} + v.size <= shard.var_size
                            : v.chunk < shard.header.chunk_count &&
                                  uint64_t{v.offset} + v.size <= shard.chunk_size[v.chunk];
    if (!inside || v.offset % 8 != 0 || v.reserved != 0) {
      const std::string what = !inside ? std::string("points outside ") +
                                             (shard.var_stream ? "/shardfeed/var" : "its chunk")
                               : v.offset % 8 != 0 ? std::string("is not 8-byte aligned")
                                                   : std::string("has a non-zero reserved field");
      return Status::Corrupt(where, ": var entry of sample ", first_sample + i, " (chunk ", v.chunk,
                             ", offset ", v.offset, ", size ", v.size, ") ", what);
    }
  }
  return Status::OK();
}

// The bytes a VarEntry checked by ValidateVarEntries addresses.
const uint8_t* VarBlobData(const ShardStore& shard, const VarEntry& v) {
  return (shard.var_stream ? shard.var_data : shard.chunk_data[v.chunk]) + v.offset;
}

// Every var entry in bounds and where the writer puts it: in its record's chunk, at the first
// multiple of 8 after the record. Sums the blobs' bytes and the padding before them.
Status VarLayout(const ShardStore& shard, const Schema& schema, uint64_t first_sample,
                 const std::string& where, uint64_t* blobs, uint64_t* padding) {
  const uint64_t n = shard.header.sample_count;
  SF_RETURN_IF_ERROR(ValidateVarEntries(shard, schema, first_sample, 0, n, where));
  if (!schema.has_var_fields()) return Status::OK();
  if (shard.var_stream) {  // HDF5 /images: blobs back to back in the var stream, 8-aligned
    uint64_t end = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const VarEntry v = VarEntryOf(shard, schema, i);
      if (v.offset != ((end + 7) & ~uint64_t{7})) {
        return Status::Corrupt(where, ": var blob of sample ", first_sample + i,
                               " does not follow the previous one in /shardfeed/var (offset ",
                               v.offset, ", the previous ends at ", end, ")");
      }
      *blobs += v.size;
      *padding += v.offset - end;
      end = uint64_t{v.offset} + v.size;
    }
    if (end != shard.var_size) {
      return Status::Corrupt(where, ": /shardfeed/var holds ", shard.var_size,
                             " bytes, its blobs end at ", end);
    }
    return Status::OK();
  }
  for (uint64_t i = 0; i < n; ++i) {
    const VarEntry v = VarEntryOf(shard, schema, i);
    const IndexEntry& e = shard.index[i];
    const uint64_t end = uint64_t{e.offset} + e.size;
    if (v.chunk != e.chunk || v.offset != ((end + 7) & ~uint64_t{7})) {
      return Status::Corrupt(where, ": var blob of sample ", first_sample + i,
                             " does not follow its record (chunk ", v.chunk, " offset ", v.offset,
                             ", the record ends in chunk ", e.chunk, " at ", end, ")");
    }
    *blobs += v.size;
    *padding += v.offset - end;
  }
  return Status::OK();
}

}  // namespace shardfeed::format
