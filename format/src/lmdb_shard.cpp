// LMDB shard files: one environment per file (MDB_NOSUBDIR), one unnamed database holding the
// chunks, the header and the index. Read-only opens use MDB_NOLOCK, so no lock file is created
// and nothing is shared between processes but the read-only map.
#include <fcntl.h>
#include <lmdb.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

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
  std::vector<uint64_t> owned_fields;  // a misaligned fields table, copied (8-byte aligned)
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

  Status Finish(const ShardHeader& header, const IndexEntry* index, size_t count,
                const uint8_t* fields, size_t fields_size) override {
    // Several transactions are fine: the shard counts only once the manifest names it. Keys go
    // in LMDB's order (MDB_APPEND): "fields" < "header" < "index".
    if (fields_size > 0) {
      SF_RETURN_IF_ERROR(Put(kLmdbFieldsKey.data(), kLmdbFieldsKey.size(), fields, fields_size));
    }
    SF_RETURN_IF_ERROR(Put(kLmdbHeaderKey.data(), kLmdbHeaderKey.size(), &header, sizeof(header)));
    SF_RETURN_IF_ERROR(
        Put(kLmdbIndexKey.data(), kLmdbIndexKey.size(), index, count * sizeof(IndexEntry)));
    int rc = mdb_env_sync(env_, 1);
    if (rc) return WriteError(rc, 0);
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
      if (rc != MDB_MAP_FULL) return WriteError(rc, size);
      map_size_ = std::max(map_size_ * 2, map_size_ + 2 * size);
      rc = mdb_env_set_mapsize(env_, map_size_);
      if (rc) return LmdbError(file_, "grow map", rc);
    }
  }

  // LMDB reports a short write (a full disk) as EIO: say what it was when the disk is full.
  Status WriteError(int rc, size_t writing) const {
    struct statvfs fs;
    const std::string dir = file_.substr(0, file_.find_last_of('/') + 1);
    if ((rc == EIO || rc == ENOSPC) && ::statvfs(dir.empty() ? "." : dir.c_str(), &fs) == 0) {
      const uint64_t free_bytes = uint64_t{fs.f_bavail} * fs.f_frsize;
      if (free_bytes < writing + (uint64_t{16} << 20)) {
        return Status::IOError(file_, ": no space left on device (", free_bytes,
                               " bytes free while writing ", writing, ")");
      }
    }
    if (rc == EFBIG) {
      return Status::IOError(file_, ": file too large (the file-size limit, ulimit -f, was hit)");
    }
    return LmdbError(file_, "write", rc);
  }

  static constexpr uint64_t kWritebackBytes = 32 << 20;
  std::string file_;
  MDB_env* env_ = nullptr;
  size_t map_size_ = 0;
  uint64_t unflushed_ = 0;
};

// ---- A bounds-checked walk of an LMDB file (the on-disk layout of LMDB 0.9, 64-bit) --------
// Page header (16 bytes): pgno u64 @0, pad u16 @8, flags u16 @10, lower u16 @12, upper u16 @14
// (overflow pages: page count u32 @12), then u16 node offsets from @16. Meta pages 0 and 1 hold,
// after the header: magic u32 @0, version u32 @4, then two MDB_db records of 48 bytes @24 (free
// list; main), each: pad u32 (the free record's pad is the page size), flags u16, depth u16,
// branch/leaf/overflow page counts, entries, root u64 @40; last page u64 @120, txnid u64 @128.
// Nodes: lo u16, hi u16, flags u16, key size u16, key, data. Leaf data size = lo | hi << 16;
// branch child = lo | hi << 16 | flags << 32; F_BIGDATA data is the u64 number of an overflow
// page run.

constexpr uint32_t kLmdbMagic = 0xBEEFC0DE;
constexpr uint16_t kPageBranch = 0x01, kPageLeaf = 0x02, kPageOverflow = 0x04;
constexpr uint16_t kNodeBigData = 0x01;
constexpr size_t kPageHeader = 16, kNodeHeader = 8;

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

class LmdbWalker {
 public:
  LmdbWalker(int fd, uint64_t file_bytes, const std::string& file)
      : fd_(fd), file_bytes_(file_bytes), file_(file) {}

  Status Run() {
    // Both meta pages; LMDB reads the one with the larger transaction id.
    uint8_t meta[2][kPageHeader + 136];
    for (int m = 0; m < 2; ++m) {
      const uint64_t at = m == 0 ? 0 : psize_or_4096(meta[0]);
      if (!ReadAt(at, meta[m], sizeof(meta[m]))) return Bad("cannot read meta page ", m);
    }
    int best = -1;
    for (int m = 0; m < 2; ++m) {
      const uint8_t* b = meta[m] + kPageHeader;
      if (Load<uint32_t>(b) != kLmdbMagic) continue;
      if (best < 0 || Load<uint64_t>(b + 128) > Load<uint64_t>(meta[best] + kPageHeader + 128)) {
        best = m;
      }
    }
    if (best < 0) return Bad("no valid LMDB meta page");
    const uint8_t* b = meta[best] + kPageHeader;
    psize_ = Load<uint32_t>(b + 24);  // the free-list record's pad: the page size
    if (psize_ < 512 || psize_ > 65536 || (psize_ & (psize_ - 1)) != 0) {
      return Bad("page size ", psize_, " is impossible");
    }
    if (psize_or_4096(meta[0]) != psize_) return Bad("meta pages disagree on the page size");
    pages_ = file_bytes_ / psize_;
    const uint64_t last = Load<uint64_t>(b + 120);
    if (last >= pages_) {  // pages are numbered from 0: the last in use needs last + 1 of them
      return Bad("pages 0..", last, " (", last + 1, ") are in use, the file holds ", pages_,
                 " (truncated?)");
    }
    const uint8_t* main_db = b + 24 + 48;
    if (Load<uint16_t>(main_db + 4) != 0) return Bad("the main database has unexpected flags");
    const uint64_t root = Load<uint64_t>(main_db + 40);
    depth_limit_ = Load<uint16_t>(main_db + 6);
    if (root == ~uint64_t{0}) return Status::OK();  // empty database: LMDB reports not found
    if (depth_limit_ == 0 || depth_limit_ > 16) return Bad("tree depth ", depth_limit_);
    page_.resize(psize_);
    return Walk(root, 1);
  }

 private:
  static uint32_t psize_or_4096(const uint8_t* meta0) {
    uint32_t p = Load<uint32_t>(meta0 + kPageHeader + 24);
    return (p >= 512 && p <= 65536 && (p & (p - 1)) == 0) ? p : 4096;
  }

  template <typename... Args>
  Status Bad(Args&&... args) {
    std::ostringstream os;
    (os << ... << args);
    return Status::Corrupt(file_, ": damaged LMDB file: ", os.str());
  }

  bool ReadAt(uint64_t at, uint8_t* out, size_t n) {
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd_, out + done, n - done, static_cast<off_t>(at + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      done += static_cast<size_t>(r);
    }
    return true;
  }

  // Reads page `pgno` (expected to be a tree page) into a buffer of its own for this level.
  Status Walk(uint64_t pgno, int depth) {
    if (depth > depth_limit_) return Bad("tree deeper than its meta page says");
    if (pgno < 2 || pgno >= pages_) return Bad("page number ", pgno, " outside the file");
    if (++visited_ > pages_) return Bad("page references form a cycle");
    std::vector<uint8_t> page(psize_);
    if (!ReadAt(pgno * psize_, page.data(), psize_)) return Bad("cannot read page ", pgno);
    const uint8_t* p = page.data();
    if (Load<uint64_t>(p) != pgno)
      return Bad("page ", pgno, " says it is page ", Load<uint64_t>(p));
    const uint16_t flags = Load<uint16_t>(p + 10);
    const uint16_t lower = Load<uint16_t>(p + 12), upper = Load<uint16_t>(p + 14);
    const bool branch = flags == kPageBranch, leaf = flags == kPageLeaf;
    if (!branch && !leaf) return Bad("page ", pgno, " has flags ", flags);
    if (lower < kPageHeader || lower > upper || upper > psize_ || (lower - kPageHeader) % 2) {
      return Bad("page ", pgno, " has a broken free-space range");
    }
    const size_t keys = (lower - kPageHeader) / 2;
    if (keys == 0) return Bad("page ", pgno, " is empty");
    for (size_t k = 0; k < keys; ++k) {
      const uint16_t off = Load<uint16_t>(p + kPageHeader + 2 * k);
      if (off < upper || off + kNodeHeader > psize_) {
        return Bad("page ", pgno, " node ", k, " lies outside the page");
      }
      const uint8_t* node = p + off;
      const uint32_t lo = Load<uint16_t>(node), hi = Load<uint16_t>(node + 2);
      const uint16_t nflags = Load<uint16_t>(node + 4), ksize = Load<uint16_t>(node + 6);
      const size_t key_end = off + kNodeHeader + size_t{ksize};
      if (key_end > psize_) return Bad("page ", pgno, " node ", k, " key runs past the page");
      if (branch) {
        const uint64_t child = lo | (uint64_t{hi} << 16) | (uint64_t{nflags} << 32);
        SF_RETURN_IF_ERROR(Walk(child, depth + 1));
        continue;
      }
      const uint64_t dsize = lo | (uint64_t{hi} << 16);
      if (nflags & ~kNodeBigData) return Bad("page ", pgno, " node ", k, " has flags ", nflags);
      if (!(nflags & kNodeBigData)) {
        if (key_end + dsize > psize_) return Bad("page ", pgno, " node ", k, " data past the page");
        continue;
      }
      if (key_end + 8 > psize_) return Bad("page ", pgno, " node ", k, " runs past the page");
      SF_RETURN_IF_ERROR(CheckOverflow(Load<uint64_t>(p + key_end), dsize));
    }
    return Status::OK();
  }

  Status CheckOverflow(uint64_t pgno, uint64_t dsize) {
    if (pgno < 2 || pgno >= pages_) return Bad("overflow page ", pgno, " outside the file");
    uint8_t head[kPageHeader];
    if (!ReadAt(pgno * psize_, head, sizeof(head))) return Bad("cannot read page ", pgno);
    if (Load<uint64_t>(head) != pgno || Load<uint16_t>(head + 10) != kPageOverflow) {
      return Bad("page ", pgno, " is not the overflow page a value points to");
    }
    const uint64_t count = Load<uint32_t>(head + 12);
    const uint64_t need = (dsize + kPageHeader + psize_ - 1) / psize_;
    if (count < need || count > pages_ - pgno) {
      return Bad("overflow run at page ", pgno, " of ", count, " pages cannot hold ", dsize,
                 " bytes inside the file");
    }
    return Status::OK();
  }

  int fd_;
  uint64_t file_bytes_;
  std::string file_;
  uint32_t psize_ = 0;
  uint64_t pages_ = 0, visited_ = 0;
  int depth_limit_ = 0;
  std::vector<uint8_t> page_;
};

Status CheckLmdbPages(const std::string& file, uint64_t file_bytes) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(file, ": ", std::strerror(errno));
  Status s = LmdbWalker(fd, file_bytes, file).Run();
  ::close(fd);
  return s;
}

}  // namespace

// long: every check comes before the first access through the map, in the order that makes
// each access safe; split, that order would be spread over helpers.
Result<std::unique_ptr<ShardStore>> OpenLmdbShard(const std::string& file,
                                                  const ShardInfo& expected, size_t number) {
  auto store = std::make_unique<LmdbShardStore>();
  struct stat st;
  if (::stat(file.c_str(), &st) != 0) {
    return Status::IOError(file, ": ", std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return Status::Corrupt(file, ": not a regular file");
  store->file_bytes = static_cast<uint64_t>(st.st_size);
  // LMDB trusts its pages: a damaged node offset or page number makes mdb_get read outside the
  // map (SIGSEGV/SIGBUS). Walk, bounds-checked, every page a lookup can reach first.
  SF_RETURN_IF_ERROR(CheckLmdbPages(file, store->file_bytes));
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
  SF_RETURN_IF_ERROR(CheckShardHeader(store->header, expected, number, store->file_bytes, file));
  SF_RETURN_IF_ERROR(get(kLmdbIndexKey.data(), kLmdbIndexKey.size(), &v, "index"));
  if (v.mv_size != store->header.sample_count * sizeof(IndexEntry)) {
    return Status::Corrupt(file, ": index is ", v.mv_size, " bytes, header promises ",
                           store->header.sample_count, " entries");
  }
  // Where the index lies in the map (its copy below, if any, is on the heap: never part of the
  // mapped range the fault guard acts on).
  const uint8_t* index_in_map = static_cast<const uint8_t*>(v.mv_data);
  if (v.mv_size > 0 && reinterpret_cast<uintptr_t>(v.mv_data) % alignof(IndexEntry) != 0) {
    // Small values live inside B-tree leaf pages at any offset; large ones (overflow pages) are
    // 8-byte aligned. Copy the rare small, misaligned index rather than read it unaligned.
    store->owned_index.resize(store->header.sample_count);
    std::memcpy(store->owned_index.data(), v.mv_data, v.mv_size);
    store->index = store->owned_index.data();
  } else {
    store->index = static_cast<const IndexEntry*>(v.mv_data);
  }
  // Version 4: the fields table, when the shard has one (its size is checked by the archive
  // against the schema). Copied when LMDB stored it misaligned, like the index.
  const uint8_t* fields_in_map = nullptr;
  {
    MDB_val k{kLmdbFieldsKey.size(), const_cast<char*>(kLmdbFieldsKey.data())};
    int r = mdb_get(store->txn_, dbi, &k, &v);
    if (r && r != MDB_NOTFOUND) return LmdbError(file, "get fields", r);
    if (r == 0 && v.mv_size > 0) {
      fields_in_map = static_cast<const uint8_t*>(v.mv_data);
      store->fields_size = v.mv_size;
      if (reinterpret_cast<uintptr_t>(v.mv_data) % 8 != 0) {
        store->owned_fields.resize((v.mv_size + 7) / 8);
        std::memcpy(store->owned_fields.data(), v.mv_data, v.mv_size);
        store->fields = reinterpret_cast<const uint8_t*>(store->owned_fields.data());
      } else {
        store->fields = fields_in_map;
      }
    }
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
  // LMDB does not expose its map address; the chunks and the index as stored span it (overflow
  // pages are contiguous). Only pointers into the map count: store->index may be a heap copy.
  const uint8_t* lo = index_in_map;
  const uint8_t* hi = lo + store->header.sample_count * sizeof(IndexEntry);
  for (size_t c = 0; c < store->chunk_data.size(); ++c) {
    lo = std::min(lo, store->chunk_data[c]);
    hi = std::max(hi, store->chunk_data[c] + store->chunk_size[c]);
  }
  if (fields_in_map) {
    lo = std::min(lo, fields_in_map);
    hi = std::max(hi, fields_in_map + store->fields_size);
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
