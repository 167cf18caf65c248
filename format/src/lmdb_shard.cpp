// LMDB shard files: one environment per file (MDB_NOSUBDIR), one unnamed database holding the
// chunks, the header and the index. Read-only opens use MDB_NOLOCK, so no lock file is created
// and nothing is shared between processes but the read-only map.
#include <fcntl.h>
#include <lmdb.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "shard_internal.h"

namespace shardfeed::format {
namespace {

Status LmdbError(const std::string& file, const char* what, int rc) {
  return Status::IOError(file, ": LMDB ", what, ": ", mdb_strerror(rc));
}

void ChunkKey(uint32_t number, uint8_t key[5]) {
  key[0] = static_cast<uint8_t>(kLmdbChunkPrefix);
  key[1] = static_cast<uint8_t>(number >> 24);
  key[2] = static_cast<uint8_t>(number >> 16);
  key[3] = static_cast<uint8_t>(number >> 8);
  key[4] = static_cast<uint8_t>(number);
}

class LmdbShardStore : public ShardStore {
 public:
  ~LmdbShardStore() override {
    if (txn_) mdb_txn_abort(txn_);
    if (env_) mdb_env_close(env_);
  }
  MDB_env* env_ = nullptr;
  MDB_txn* txn_ = nullptr;  // held for the store's lifetime: keeps every pointer valid
  std::vector<IndexEntry> owned_index;
};

class LmdbSink : public ArchiveWriter::ShardSink {
 public:
  ~LmdbSink() override {
    if (env_) mdb_env_close(env_);
  }

  Status Open(const std::string& file) {
    file_ = file;
    int rc = mdb_env_create(&env_);
    if (rc) return LmdbError(file, "env_create", rc);
    // Start small and double on MDB_MAP_FULL: a huge fixed reservation fails under address
    // space limits (ulimit -v, valgrind).
    map_size_ = size_t{256} << 20;
    rc = mdb_env_set_mapsize(env_, map_size_);
    if (rc) return LmdbError(file, "set_mapsize", rc);
    // One writer owns the partial directory: no lock file; durability comes from the explicit
    // sync in Finish() before the manifest is written.
    rc = mdb_env_open(env_, file.c_str(), MDB_NOSUBDIR | MDB_NOLOCK | MDB_NOSYNC | MDB_NOMETASYNC,
                      0644);
    if (rc) return LmdbError(file, "env_open", rc);
    return Status::OK();
  }

  Status PutChunk(uint32_t number, const uint8_t* data, size_t size) override {
    uint8_t key_bytes[5];
    ChunkKey(number, key_bytes);
    SF_RETURN_IF_ERROR(Put(key_bytes, sizeof(key_bytes), data, size));
    // Start writing back what is committed so far, without waiting for it: the final fsync then
    // finds little left to do, and the disk works while the workers decode.
    unflushed_ += size;
    if (unflushed_ >= kWritebackBytes) {
      unflushed_ = 0;
      int fd = -1;
      if (mdb_env_get_fd(env_, &fd) == 0 && fd >= 0) {
        ::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);  // advisory: errors surface at fsync
      }
    }
    return Status::OK();
  }

  Status Finish(const ShardHeader& header, const IndexEntry* index, size_t count) override {
    // Two transactions are fine: the shard counts only once the manifest names it.
    SF_RETURN_IF_ERROR(Put(kLmdbHeaderKey.data(), kLmdbHeaderKey.size(), &header, sizeof(header)));
    SF_RETURN_IF_ERROR(
        Put(kLmdbIndexKey.data(), kLmdbIndexKey.size(), index, count * sizeof(IndexEntry)));
    int rc = mdb_env_sync(env_, 1);
    if (rc) return LmdbError(file_, "sync", rc);
    mdb_env_close(env_);
    env_ = nullptr;
    return Status::OK();
  }

 private:
  // Puts one value in its own transaction, growing the map while it is full.
  Status Put(const void* key, size_t key_size, const void* data, size_t size) {
    for (;;) {
      MDB_txn* txn = nullptr;
      int rc = mdb_txn_begin(env_, nullptr, 0, &txn);
      if (rc) return LmdbError(file_, "txn_begin", rc);
      MDB_dbi dbi;
      rc = mdb_dbi_open(txn, nullptr, 0, &dbi);
      if (rc) {
        mdb_txn_abort(txn);
        return LmdbError(file_, "dbi_open", rc);
      }
      MDB_val k{key_size, const_cast<void*>(key)};
      MDB_val v{size, const_cast<void*>(data)};
      rc = mdb_put(txn, dbi, &k, &v, MDB_APPEND);
      if (rc == 0) {
        rc = mdb_txn_commit(txn);
        if (rc == 0) return Status::OK();
      } else {
        mdb_txn_abort(txn);
      }
      if (rc != MDB_MAP_FULL) return LmdbError(file_, "put", rc);
      map_size_ = std::max(map_size_ * 2, map_size_ + 2 * size);
      rc = mdb_env_set_mapsize(env_, map_size_);
      if (rc) return LmdbError(file_, "grow map", rc);
    }
  }

  static constexpr uint64_t kWritebackBytes = 32 << 20;
  std::string file_;
  MDB_env* env_ = nullptr;
  size_t map_size_ = 0;
  uint64_t unflushed_ = 0;
};

}  // namespace

Result<std::unique_ptr<ShardStore>> OpenLmdbShard(const std::string& file) {
  auto store = std::make_unique<LmdbShardStore>();
  struct stat st;
  if (::stat(file.c_str(), &st) != 0) {
    return Status::IOError(file, ": ", std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return Status::Corrupt(file, ": not a regular file");
  store->file_bytes = static_cast<uint64_t>(st.st_size);
  int rc = mdb_env_create(&store->env_);
  if (rc) return LmdbError(file, "env_create", rc);
  // Map exactly the file: the writer's 1 TiB reservation is not needed to read.
  size_t page = 4096;
  rc = mdb_env_set_mapsize(store->env_, (store->file_bytes + page - 1) / page * page + page);
  if (rc) return LmdbError(file, "set_mapsize", rc);
  rc = mdb_env_open(store->env_, file.c_str(), MDB_RDONLY | MDB_NOSUBDIR | MDB_NOLOCK | MDB_NOTLS,
                    0);
  if (rc) return LmdbError(file, "open (is it an LMDB file?)", rc);
  // A truncated file would SIGBUS on the first access past its end: check the size LMDB's meta
  // page promises against the file before touching any page through the map.
  MDB_envinfo info;
  MDB_stat stat;
  mdb_env_info(store->env_, &info);
  mdb_env_stat(store->env_, &stat);
  if ((uint64_t{info.me_last_pgno} + 1) * stat.ms_psize > store->file_bytes) {
    return Status::Corrupt(file, ": truncated (LMDB pages up to ", info.me_last_pgno,
                           " are promised, the file holds ", store->file_bytes, " bytes)");
  }
  rc = mdb_txn_begin(store->env_, nullptr, MDB_RDONLY, &store->txn_);
  if (rc) return LmdbError(file, "txn_begin", rc);
  MDB_dbi dbi;
  rc = mdb_dbi_open(store->txn_, nullptr, 0, &dbi);
  if (rc) return LmdbError(file, "dbi_open", rc);

  auto get = [&](const void* key, size_t key_size, MDB_val* out, const char* what) -> Status {
    MDB_val k{key_size, const_cast<void*>(key)};
    int r = mdb_get(store->txn_, dbi, &k, out);
    if (r == MDB_NOTFOUND) return Status::Corrupt(file, ": missing ", what);
    if (r) return LmdbError(file, "get", r);
    return Status::OK();
  };
  MDB_val v;
  SF_RETURN_IF_ERROR(get(kLmdbHeaderKey.data(), kLmdbHeaderKey.size(), &v, "shard header"));
  if (v.mv_size != sizeof(ShardHeader)) {
    return Status::Corrupt(file, ": shard header is ", v.mv_size, " bytes, expected ",
                           sizeof(ShardHeader));
  }
  std::memcpy(&store->header, v.mv_data, sizeof(ShardHeader));
  if (std::memcmp(store->header.magic, kShardMagic, sizeof(kShardMagic)) != 0) {
    return Status::Corrupt(file, ": bad shard magic");
  }
  if (store->header.format_version != kFormatVersion) {
    return Status::Unsupported(file, ": shard format version ", store->header.format_version,
                               ", this build reads version ", kFormatVersion);
  }
  SF_RETURN_IF_ERROR(get(kLmdbIndexKey.data(), kLmdbIndexKey.size(), &v, "index"));
  if (v.mv_size != store->header.sample_count * sizeof(IndexEntry)) {
    return Status::Corrupt(file, ": index is ", v.mv_size, " bytes, header promises ",
                           store->header.sample_count, " entries");
  }
  if (reinterpret_cast<uintptr_t>(v.mv_data) % alignof(IndexEntry) != 0) {
    // Small values live inside B-tree leaf pages at any offset; large ones (overflow pages) are
    // 8-byte aligned. Copy the rare small, misaligned index rather than read it unaligned.
    store->owned_index.resize(store->header.sample_count);
    std::memcpy(store->owned_index.data(), v.mv_data, v.mv_size);
    store->index = store->owned_index.data();
  } else {
    store->index = static_cast<const IndexEntry*>(v.mv_data);
  }
  if (store->header.chunk_count > (uint64_t{1} << 32)) {
    return Status::Corrupt(file, ": implausible chunk count ", store->header.chunk_count);
  }
  store->chunk_data.resize(store->header.chunk_count);
  store->chunk_size.resize(store->header.chunk_count);
  for (uint32_t c = 0; c < store->header.chunk_count; ++c) {
    uint8_t key[5];
    ChunkKey(c, key);
    SF_RETURN_IF_ERROR(get(key, sizeof(key), &v, ("chunk " + std::to_string(c)).c_str()));
    store->chunk_data[c] = static_cast<const uint8_t*>(v.mv_data);
    store->chunk_size[c] = v.mv_size;
  }
  // LMDB does not expose its map address; the chunks span it (overflow pages are contiguous).
  const uint8_t* lo = reinterpret_cast<const uint8_t*>(store->index);
  const uint8_t* hi = lo + store->header.sample_count * sizeof(IndexEntry);
  for (size_t c = 0; c < store->chunk_data.size(); ++c) {
    lo = std::min(lo, store->chunk_data[c]);
    hi = std::max(hi, store->chunk_data[c] + store->chunk_size[c]);
  }
  store->map_base = lo;
  store->map_size = static_cast<size_t>(hi - lo);
  return std::unique_ptr<ShardStore>(std::move(store));
}

Result<std::unique_ptr<ArchiveWriter::ShardSink>> CreateLmdbSink(const std::string& file) {
  auto sink = std::make_unique<LmdbSink>();
  SF_RETURN_IF_ERROR(sink->Open(file));
  return std::unique_ptr<ArchiveWriter::ShardSink>(std::move(sink));
}

}  // namespace shardfeed::format
