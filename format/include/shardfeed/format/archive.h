// Reading and writing shardfeed archives.
//
// An archive is a directory holding manifest.json and one or more shard files. Reading maps each
// shard read-only and serves records as views into the map: no copy, no per-record syscall and no
// library call once a shard is open (so threads never queue on a library lock). Opened with
// IndexCheck::kFull every shard is open when Open returns, and a handle opened before fork()
// keeps working in the child without any library call; opened lazily, a shard is opened (LMDB or
// HDF5 calls, under the HDF5 mutex) on its first access, in whichever process makes it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardfeed/base/cancel.h"
#include "shardfeed/base/status.h"
#include "shardfeed/format/layout.h"
#include "shardfeed/format/manifest.h"
#include "shardfeed/storage/remote.h"

namespace shardfeed::format {

// How CheckUnchanged's error (kChanged) ends, after "sample N".
inline constexpr const char* kReadSinceUnreliable =
    " and any read from it since are unreliable: reopen the archive";

class ShardStore;  // one opened shard (backend-specific), see src/*_internal.h

// A record: a pointer into the archive's mapping plus its index entry. `data` stays valid while
// the Archive that produced it is alive (Archive is reference-counted; hold the shared_ptr).
struct RecordView {
  const uint8_t* data = nullptr;
  size_t size = 0;
  const IndexEntry* entry = nullptr;
};

// How much of the shards Open() checks before it returns.
enum class IndexCheck {
  // Every shard is opened and checked at once: headers, the index checksum, every index entry,
  // class counts against the labels stored. Open costs O(samples). What verify, inspect,
  // convert, merge and extract use.
  kFull,
  // Only the manifest at once; a shard is opened and its header checked when a record of it is
  // first asked for, and each index entry is checked (bounds, encoding, shape, label) every time
  // it is read, a few comparisons. Open and the first batch cost O(shards touched), independent
  // of the archive's size (a rank of a large job). The index checksum and class counts are then
  // left to verify. Every access is still bounds-checked: damage is an error, never a fault.
  kLazy,
  kAuto,  // kFull up to kLazyIndexAbove samples, else kLazy
};
inline constexpr uint64_t kLazyIndexAbove = uint64_t{1} << 22;

struct OpenOptions {
  IndexCheck check = IndexCheck::kAuto;
  // A remote location's cache (storage::CacheOptionTable: cache_dir, cache_limit); unset fields
  // come from storage::SetCacheOptions, then SHARDFEED_CACHE_DIR / SHARDFEED_CACHE_LIMIT.
  storage::CacheOptions cache;
  // Stops Open (base/cancel.h; null: it cannot be). Read only while Open runs: the caller owns
  // the token and keeps it alive until Open returns, and the archive keeps no pointer to it
  // (open_options().cancel is null; accesses after Open are not cancelled by it). Once it is
  // cancelled, Open stops within about a second: the manifest's and shards' downloads in flight
  // are abandoned, no further shard is begun (each download's ".part" file is removed; shards
  // that finished stay in the cache, verified, for the next open), the checks of a full open
  // stop at the next shard, and Open returns kCancelled; nothing of the archive is kept.
  const CancelToken* cancel = nullptr;
};

class Archive {
 public:
  // Opens `path` (an archive directory): reads and checks the manifest, then the shards as
  // `check` says (IndexCheck), so no later access can read outside the mapping. Payload
  // checksums are checked by VerifyRecord(). `path` may also be s3://bucket/prefix or
  // http(s)://host/path (storage/remote.h): each shard is then downloaded whole into the local
  // cache and checked against the manifest's content hash when first opened, and held in the
  // cache until the Archive is destroyed or ReleaseShard() gives it back. With kFull, every
  // shard is held at once, so the cache limit must cover them all (kResourceExhausted at Open,
  // giving the minimum); with kAuto and a cache limit below the archive's shard bytes, the
  // archive is opened lazily instead, and a read that needs more shards held than the cache
  // allows fails with kResourceExhausted (never a hang): read such an archive through a
  // Loader with shuffle="block", which releases shards as it goes.
  static Result<std::shared_ptr<Archive>> Open(const std::string& path,
                                               IndexCheck check = IndexCheck::kAuto);
  static Result<std::shared_ptr<Archive>> Open(const std::string& path, const OpenOptions& options);
  ~Archive();

  const std::string& path() const { return path_; }
  const Manifest& manifest() const { return manifest_; }
  uint64_t size() const { return manifest_.sample_count; }
  bool lazy() const { return lazy_; }

  // The record `index`: O(1) once its shard is open (the first access to a shard of a lazy
  // archive opens it). Errors name the archive, the shard and the sample. Thread-safe. The only
  // way to a record: every accessor opens its shard or fails with a Status (there is no
  // unchecked variant; a shard not opened yet is never dereferenced).
  Result<RecordView> At(uint64_t index) const;
  // The schema (manifest().schema): Schema::Legacy() for archives of versions 1-3.
  const Schema& schema() const { return manifest_.schema; }
  // Field `f` (position in schema()) of sample `index` (version 4; any field but the image and
  // the class field, which At() gives: kInvalidArgument): a view into the shard's column (fixed
  // fields: dims the type's, no parsing) or into the sample's var blob (FieldView, VarField;
  // a mask's dims are checked against the image's stored shape). With `verify`, the var blob's
  // checksum is checked first (kChecksumMismatch); fixed columns are covered by the fields
  // table's checksum (a full open, VerifyDerived). Damage is kCorrupt naming the shard, the
  // sample and the field, never a read outside the blob. Thread-safe, O(1) plus the checksum;
  // the first access to a shard of a lazy archive opens it. The view lives as long as the
  // Archive, like a RecordView, and is covered by the same SIGBUS guard: call CheckUnchanged
  // after reading it.
  Result<FieldView> Field(uint64_t index, size_t f, bool verify = false) const;
  // The label of `index`, or -1 when its record cannot be read (At() says why).
  int32_t Label(uint64_t index) const {
    auto r = At(index);
    return r.ok() ? r->entry->label : -1;
  }

  // kChanged, naming the shard file and its size then and now, when the shard holding `index`
  // was truncated on disk after it was mapped (or a page of it could not be read back). Reads past
  // the new end would raise SIGBUS; the archive answers them with zeros instead
  // (format/src/fault_guard.h), so readers call this after reading a record's bytes and drop what
  // they read. OK otherwise. Thread-safe, O(1).
  Status CheckUnchanged(uint64_t index) const;
  // Recomputes a record's XXH3 and compares it with the index and, with `fields` (version 4,
  // a schema with variable fields), its var blob's with its VarEntry, and the blob's layout
  // against the manifest's fields (kCorrupt). kChecksumMismatch names the shard and the sample. A
  // reader that uses no variable field passes false: the check then touches nothing but the record,
  // as before version 4. A remote archive's mismatch in a cached copy that no longer has the
  // manifest's content hash names the copy and discards it, as VerifyShard does
  // (DiscardDamagedCopy); one whose copy still has it is the archive's damage.
  Status VerifyRecord(uint64_t index, bool fields = true) const;
  // Recomputes a shard's content hash and compares it with the header and the manifest.
  // A remote archive's copy whose hash differs from the manifest's changed in the cache
  // (downloads are checked against it): the message names that file, and the copy is discarded
  // (storage::Remote::Discard) so the next Archive opened downloads the shard again; this one
  // keeps its mapping of the old copy.
  Status VerifyShard(size_t shard) const;
  // Remote archives: one line per cached copy this archive found damaged and removed, naming the
  // shard, the file and why, in order: at open (a copy found in the cache that no longer opens
  // is removed and downloaded once more, transparently), or by a check (VerifyShard,
  // VerifyRecord, a var blob's checksum) whose copy no longer has the manifest's content hash.
  // Thread-safe.
  std::vector<std::string> DiscardNotes() const;
  // Cross-checks every field of the manifest that is derived from the shards against the shards
  // themselves (what a recomputed "manifest_xxh3" does not catch): per shard, payload_bytes (the
  // sum of its records' sizes, and of its chunks), file_bytes (LMDB: the file's size; HDF5
  // records the size before the manifest attribute was added, so it is not compared),
  // sample_count, chunk_count and first_sample (header); for the archive, class_counts against
  // the labels stored and the fixed shape against every record. Also runs every check of
  // IndexCheck::kFull (index checksums, every entry), so a lazily opened archive is checked
  // as fully as a fully opened one. kCorrupt naming the shard and the field. O(samples).
  // Thread-safe. verify calls it.
  Status VerifyDerived() const;

  // Advises the kernel about the access pattern of every shard mapping (madvise).
  enum class Access { kNormal, kSequential, kRandom, kWillNeed };
  void Advise(Access access) const;
  // Asks the kernel to start reading a record's pages (madvise WILLNEED) without waiting:
  // readers call it for samples they will need soon, so cold data arrives in parallel.
  void WillNeed(uint64_t index) const;
  // Bytes of all shard files (the manifest's figure for shards not opened yet).
  uint64_t FileBytes() const;
  // Shards opened so far (all of them unless lazy); shards released since do not count.
  size_t OpenedShards() const;

  // Remote archives: the cache this archive reads through (nullptr for a local archive).
  const storage::Remote* remote() const { return remote_.get(); }
  const OpenOptions& open_options() const { return open_options_; }
  // Unmaps shard `s` and gives its cached file back to the cache (its shared flock is released,
  // so eviction may remove it); the next access to one of its records opens it again (for a
  // remote archive: from the cache, or downloaded again if evicted). Every RecordView,
  // FieldView and other pointer into that shard dies here. The caller guarantees that no
  // thread is inside an access to shard `s` (At, Field, VerifyRecord, WillNeed, Label, ...)
  // and that no view of it is used afterwards: the loader calls it only on an archive of its
  // own, for a shard none of whose samples is being decoded. Accesses to other shards may run
  // concurrently. A shard that failed to open keeps its error until ReleaseShard, which forgets
  // it (the next access tries to open it again: a transient failure, such as a network outage,
  // need not last), or, for a remote shard whose download failed with kIOError or kTimeout,
  // for 2 s: an access after that downloads it again; one the cache refused for room
  // (kResourceExhausted) until this process gives cache room back (a cached file released or
  // evicted: storage::CacheRoomGeneration) or 50 ms doubling to 2 s pass (room other processes
  // give back). Otherwise a no-op if `s` is not open.
  void ReleaseShard(size_t s);
  // Opens shard `s` now (for a remote archive: downloads it into the cache if absent), so that
  // the first access does not wait; its error, if any, is also what accesses will report (a
  // remote download's I/O error or timeout until 2 s have passed, then it is tried again; a
  // refusal for cache room until room is given back, as ReleaseShard says).
  // `cancel` (may be null) ends a download with kCancelled, which is not kept: the next access
  // tries again. Thread-safe. True when the shard is open (mapped) now.
  Status OpenShardNow(size_t s, const CancelToken* cancel = nullptr) const;
  bool ShardOpen(size_t s) const;
  bool ShardFailed(size_t s) const;  // its open failed (and ReleaseShard has not forgotten it)
  size_t shard_count() const { return shards_.size(); }
  size_t ShardOf(uint64_t index) const { return FindShard(index); }  // index < size()

 private:
  struct Shard;  // a shard's slot: opened once, on first use when lazy
  Archive();
  // `cancel`: OpenOptions::cancel, given only by Open (a shard's slot then keeps kCancelled
  // as its error, and Open drops the archive).
  Status OpenShard(size_t s, const CancelToken* cancel = nullptr) const;
  // Remote: every shard, 4 downloads at a time, none begun after one failed; that failure (the
  // lowest shard's, of those that failed) is returned, final for this open (no retry).
  Status FetchAll(const CancelToken* cancel) const;
  const Shard* Ready(size_t s, Status* error, const CancelToken* cancel = nullptr) const;
  RecordView Record(const Shard& shard, size_t s, uint64_t index) const;  // shard s is ready
  // A sample's var blob (version 4), its VarEntry checked; `file` names its shard.
  struct VarBlob {
    const uint8_t* data;
    size_t size;
    uint64_t checksum;
    const std::string* file;
  };
  Result<VarBlob> Blob(uint64_t index) const;
  Status CheckBlob(uint64_t index, const VarBlob& blob) const;
  // A remote shard's checksum mismatch: when its cached copy no longer has the manifest's
  // content hash (`hash` if known, else computed once per shard), discards it
  // (Remote::Discard) and says so, naming the file, for the end of the message; "" for a local
  // archive or a copy as downloaded (the archive's own damage).
  std::string DiscardDamagedCopy(const Shard& slot, size_t s, const uint64_t* hash = nullptr) const;
  std::string CopyName(const Shard& slot) const;  // the URL and, remote, the cached file
  void Note(std::string note) const;              // to DiscardNotes()

  std::string path_;
  Manifest manifest_;
  bool lazy_ = false;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<uint64_t> shard_starts_;       // first_sample per shard, ascending
  std::shared_ptr<storage::Remote> remote_;  // set for a remote location
  OpenOptions open_options_;                 // as given to Open
  mutable std::mutex discard_mu_;
  mutable std::vector<std::string> discard_notes_;  // DiscardNotes(), under discard_mu_
  size_t FindShard(uint64_t index) const;
};

// Whether local path `inner` is `outer` or lies below it, both made absolute and resolved
// (symbolic links followed as far as the paths exist). The writer's own test, for tools that
// write elsewhere (extract).
bool PathInside(const std::string& inner, const std::string& outer);

struct WriterOptions {
  Backend backend = Backend::kLmdb;
  uint64_t chunk_bytes = 1 << 20;  // a chunk closes once it holds at least this many bytes
  uint64_t shard_bytes = 0;        // a shard closes once its payload reaches this; 0: one shard
  bool overwrite = false;          // replace an existing archive (only an archive) at the path
  // Paths the writer must never replace or contain: the sources being packed or converted.
  // Create() refuses an output equal to one of them or containing one, and --overwrite of an
  // output inside one.
  std::vector<std::string> protect;
  // Archives being read (convert's, merge's parts): Create() also refuses an output inside one,
  // whose folder holds only what shardfeed wrote there (a later --overwrite of it would refuse).
  std::vector<std::string> sealed;  // see PathInside
  // What the records hold. HDF5 stores fixed-shape (height > 0) raw/zstd records as an
  // N x height x width x 3 data set, one HDF5 chunk per record (zstd through filter 32015).
  Encoding encoding = Encoding::kJpeg;
  uint32_t height = 0, width = 0;
  int zstd_level = 1;  // recorded as the HDF5 filter's parameter (and the masks' zstd level)
  // Version 4: the fields every Append gives (the manifest records it). Legacy(): image, label.
  // HDF5 /images shards keep the var blobs in a var stream (/shardfeed/var) beside /images.
  Schema schema = Schema::Legacy();
  // Values copied from an archive (convert): inverted boxes kept (format::CheckValue).
  bool inverted_boxes_ok = false;
};

// Writes an archive atomically and never destroys anything that is not provably its own
// (docs/DESIGN.md, "Data safety"):
// - Create() takes an exclusive lock (flock on <path>.lock, released when its process dies, so a
//   killed writer never blocks the next) before touching anything; a writer that does
//   not get it fails and, destroyed, touches nothing.
// - Everything is written to "<path>.partial/" (marked as ours by a ".shardfeed-partial" file,
//   kept until the swap is done). Finish() writes and syncs the manifest, then swaps the partial
//   directory into place with renameat2(RENAME_EXCHANGE): at every instant <path> is the old
//   archive or the new one. (On a filesystem without it: a ".shardfeed-replaced" marker naming
//   the new directory's identity is written into the old archive, which is renamed to
//   <path>.old and the new one in; refused if a <path>.old exists.)
// - An existing <path> is replaced only with `overwrite`, only if it is a shardfeed archive
//   (its manifest names this format), and never if it is or contains a `protect` path.
// - Destroying the writer without Finish() removes its own partial directory, and the folders
//   above <path> that Create() made for it (while they are empty). Leftovers of a
//   killed writer are recovered by the next writer of the same path, under the lock, and only
//   what carries this program's markers: a <path>.old with the ".shardfeed-replaced" marker is
//   restored if <path> is missing, removed if <path> is the directory the marker names, else an
//   error; a <path>.old without it (a user's backup) is never touched. A partial directory is
//   removed only if it carries ".shardfeed-partial"; anything else there is an error naming it.
// Not thread-safe: one thread appends.
class ArchiveWriter {
 public:
  static Result<std::unique_ptr<ArchiveWriter>> Create(const std::string& path,
                                                       const WriterOptions& options);
  ~ArchiveWriter();

  // Appends one record. `entry` gives label, shape, encoding, orientation and flags; its
  // checksum/chunk/offset/size fields are filled in here. Only for schemas whose every field is
  // the image or the class field (else kInvalidArgument: use the overload with values).
  Status Append(IndexEntry entry, const uint8_t* data, size_t size);
  // Appends one sample of the schema: the image record as above, `values[f]` for every other
  // field f (CheckValue'd here against the stored shape entry.height x entry.width: a bad value
  // is kInvalidArgument naming the field, and nothing of the sample is written).
  // `values` has one entry per schema field (those of the image and the class field are not
  // read; without a class field entry.label must be 0). The variable values become the sample's
  // var blob, written right after the record in the same chunk; the fixed ones go to the shard's
  // columns. Errors name the field; the caller adds the sample.
  Status Append(IndexEntry entry, const uint8_t* data, size_t size, const FieldValues& values);
  // Closes the current shard (if it holds any record) so the next record starts a new one.
  Status NextShard();
  // Adds an existing, validated shard file of another archive as the next shard, without
  // copying its records: a hard link (a copy only across filesystems; `*copied` says which).
  // `source` is its entry in that archive's manifest and `source_number` its position there; its
  // header keeps that position (the manifest records it). `class_counts` are the labels it
  // holds, per class. The current shard must be empty. `merge` builds archives with it. The
  // file's archive must have options.schema as its schema (the caller checks: merge compares
  // the manifests); its fields table travels inside the file.
  Status LinkShard(const std::string& file, const ShardInfo& source, uint32_t source_number,
                   const std::vector<uint64_t>& class_counts, bool* copied = nullptr,
                   uint32_t height = 0, uint32_t width = 0);
  // Closes the last shard, fills `manifest.shards`, sample counts, backend and schema
  // (options.schema; without a class field the class counts stay empty), writes
  // manifest.json and renames the partial directory into place. When every record appended
  // decodes to one shape (UprightHeight x UprightWidth x 3) and `manifest` gives none, that shape
  // is recorded; linked shards count with the shape their manifest gave (none: variable).
  Status Finish(Manifest manifest);

  uint64_t samples_written() const { return samples_; }
  uint64_t bytes_written() const { return bytes_; }

  class ShardSink;  // backend-specific, see src/*_internal.h

 private:
  ArchiveWriter() = default;
  Status OpenShard();
  Status FlushChunk();
  Status CloseShard();
  Status MeasureShardFiles(Manifest* manifest);  // file_bytes of every shard as it is now
  Status CheckRecord(const IndexEntry& entry, size_t size) const;
  // Places `size` record bytes and then `blob_` (when `with_blob`) in the chunk stream.
  Status Place(IndexEntry& entry, const uint8_t* data, size_t size, bool with_blob);

  Status Recover();  // leftovers of a killed writer (lock held)

  std::string path_, partial_path_;
  std::vector<std::string> made_parents_;  // folders Create() made above path_, deepest first
  WriterOptions options_;
  std::unique_ptr<ShardSink> sink_;
  std::vector<ShardInfo> shards_;
  std::vector<bool> linked_;  // per shard: a linked file of another archive (LinkShard)
  std::vector<uint64_t> class_counts_;
  std::vector<uint8_t> chunk_;     // the chunk being filled
  std::vector<IndexEntry> index_;  // the open shard's index
  // Version 4: the open shard's fixed columns (one per Schema::ColumnOffset field, in schema
  // order) and var entries; blob_ is the sample being appended.
  std::vector<std::vector<uint8_t>> columns_;
  std::vector<VarEntry> var_entries_;
  std::vector<uint8_t> blob_;
  // HDF5 /images shards with variable fields: the blobs go to var_stream_ (/shardfeed/var).
  bool var_separate_ = false;
  std::vector<uint8_t> var_stream_;
  uint32_t chunk_count_ = 0;  // chunks flushed in the open shard
  uint64_t shard_first_ = 0;  // global index of the open shard's first sample
  struct HashState;
  std::unique_ptr<HashState> hash_;  // the open shard's content hash
  uint64_t samples_ = 0, bytes_ = 0, shard_payload_ = 0;
  // The shape every record so far decodes to; variable_ once two differ (or one is unknown).
  uint32_t shape_h_ = 0, shape_w_ = 0;
  bool variable_ = false;
  void NoteShape(uint32_t height, uint32_t width);
  bool finished_ = false;
  int lock_fd_ = -1;
};

// Bytes a raw/zstd record holds once decoded: height * width * channels.
inline size_t PixelBytes(const IndexEntry& e) { return size_t{e.height} * e.width * e.channels; }

// kResourceExhausted when a record's index entry declares more than `max_pixels` pixels: every
// decode path checks it before allocating (the default is the packer's, imaging::Limits).
Status CheckPixelLimit(const IndexEntry& entry, uint64_t max_pixels);

// Checks a raw/zstd record against its index entry and writes its PixelBytes() pixels to `out`
// (raw: copied; zstd: decompressed with `dctx`, a ZSTD_DCtx* the caller owns, or a temporary one
// when null). kCorrupt for a wrong size, a frame that does not decompress, or another encoding.
Status ReadPixelRecord(const RecordView& record, void* dctx, uint8_t* out);

// True when `path` is a directory holding a manifest of this format (IsShardfeedManifest): what
// --overwrite may replace, and what packing never takes for a class folder.
bool IsArchiveDirectory(const std::string& path);

// XXH3-64 of a byte range (seed 0): the record checksum.
uint64_t RecordChecksum(const void* data, size_t size);

}  // namespace shardfeed::format
