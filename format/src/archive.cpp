// long file: Archive is one class whose open, shard lifecycle (open on first use, ReleaseShard) and
// accessors all work on the Shard slot defined here; splitting them would expose that slot.
#include "shardfeed/format/archive.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "fault_guard.h"
#include "shard_internal.h"
#include "shardfeed/storage/remote.h"

namespace shardfeed::format {

namespace fs = std::filesystem;

uint64_t RecordChecksum(const void* data, size_t size) { return XXH3_64bits(data, size); }

Status CheckPixelLimit(const IndexEntry& e, uint64_t max_pixels) {
  const uint64_t pixels = uint64_t{e.width} * e.height;
  if (pixels > max_pixels) {
    return Status::ResourceExhausted("record declares ", e.width, "x", e.height, " = ", pixels,
                                     " pixels, above the limit of ", max_pixels,
                                     " (max_pixels; raise it to read such images)");
  }
  return Status::OK();
}

Status ReadPixelRecord(const RecordView& r, void* dctx, uint8_t* out) {
  const IndexEntry& e = *r.entry;
  const size_t bytes = PixelBytes(e);
  if (e.channels != 3) return Status::Corrupt("pixel record with ", int{e.channels}, " channels");
  if (e.encoding == uint8_t(Encoding::kRaw)) {
    if (r.size != bytes)
      return Status::Corrupt("raw record of ", r.size, " bytes, expected ", bytes);
    std::memcpy(out, r.data, bytes);
    return Status::OK();
  }
  if (e.encoding != uint8_t(Encoding::kZstd)) return Status::Corrupt("not a pixel record");
  unsigned long long content = ZSTD_getFrameContentSize(r.data, r.size);
  if (content != bytes) {
    return Status::Corrupt("zstd frame declares ", content, " bytes, expected ", bytes);
  }
  size_t n = dctx ? ZSTD_decompressDCtx(static_cast<ZSTD_DCtx*>(dctx), out, bytes, r.data, r.size)
                  : ZSTD_decompress(out, bytes, r.data, r.size);
  if (ZSTD_isError(n)) return Status::Corrupt("zstd: ", ZSTD_getErrorName(n));
  if (n != bytes) {
    return Status::Corrupt("zstd record decompressed to ", n, " bytes, expected ", bytes);
  }
  return Status::OK();
}

std::string ShardFileName(Backend backend, size_t number) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard-%05zu.%s", number,
                backend == Backend::kLmdb ? "mdb" : "h5");
  return buf;
}

Status CheckShardHeader(const ShardHeader& h, const ShardInfo& info, size_t number,
                        uint64_t file_bytes, const std::string& where) {
  if (std::memcmp(h.magic, kShardMagic, sizeof(kShardMagic)) != 0) {
    return Status::Corrupt(where, ": bad shard magic");
  }
  if (!IsReadableVersion(h.format_version)) {
    return Status::Unsupported(where, ": shard format version ", h.format_version,
                               ", this build reads versions ", kMinFormatVersion, " to ",
                               kFormatVersion);
  }
  const uint64_t want_number = info.header_override ? info.header_number : number;
  const uint64_t want_first = info.header_override ? info.header_first_sample : info.first_sample;
  if (h.shard_number != want_number || h.first_sample != want_first ||
      h.sample_count != info.sample_count || h.chunk_count != info.chunk_count ||
      h.content_hash != info.content_hash) {
    return Status::Corrupt(where, ": shard header disagrees with ", kManifestFileName,
                           " (shard from another archive?)");
  }
  if (h.sample_count > file_bytes / sizeof(IndexEntry) || h.chunk_count > h.sample_count ||
      (h.sample_count > 0 && h.chunk_count == 0)) {
    return Status::Corrupt(where, ": ", h.sample_count, " samples in ", h.chunk_count,
                           " chunks cannot fit in a file of ", file_bytes, " bytes");
  }
  return Status::OK();
}

Status CheckIndexChecksum(const ShardStore& shard, const std::string& where) {
  const ShardHeader& h = shard.header;
  uint64_t want = XXH3_64bits(shard.index, h.sample_count * sizeof(IndexEntry));
  if (want != h.index_checksum) {
    return Status::ChecksumMismatch(where, ": index checksum mismatch (stored ",
                                    HashToHex(h.index_checksum), ", computed ", HashToHex(want),
                                    ")");
  }
  return Status::OK();
}

Status ValidateEntries(const ShardStore& shard, const Manifest& manifest, uint64_t first_sample,
                       uint64_t begin, uint64_t end, const std::string& where,
                       std::vector<uint64_t>* class_counts) {
  const ShardHeader& h = shard.header;
  const uint8_t encoding = static_cast<uint8_t>(manifest.encoding);
  const bool any = manifest.encoding == Encoding::kAuto;  // each entry's own encoding
  const size_t classes = manifest.class_names.size();
  const bool labelled = manifest.schema.label_field() >= 0;  // else every label is 0
  for (uint64_t i = begin; i < end; ++i) {
    const IndexEntry& e = shard.index[i];
    const uint64_t sample = first_sample + i;
    auto bad = [&](const char* why) {
      return Status::Corrupt(where, ": index entry of sample ", sample, " ", why);
    };
    if (e.chunk >= h.chunk_count || uint64_t{e.offset} + e.size > shard.chunk_size[e.chunk]) {
      return bad("points outside its chunk");
    }
    if (any ? !IsRecordEncoding(e.encoding) : e.encoding != encoding) {
      return bad("has another encoding than the manifest");
    }
    const bool jpeg = e.encoding == static_cast<uint8_t>(Encoding::kJpeg);
    if (e.height == 0 || e.width == 0) return bad("has no pixels (0 width or height)");
    if (jpeg ? (e.channels != 1 && e.channels != 3 && e.channels != 4) : e.channels != 3) {
      return bad("has an impossible channel count");
    }
    if (jpeg ? (e.orientation < 1 || e.orientation > 8) : e.orientation != 1) {
      return bad("has an impossible orientation");
    }
    if ((e.flags & ~kKnownFlags) != 0) return bad("has unknown flags");
    if (e.encoding == static_cast<uint8_t>(Encoding::kRaw) && e.size != PixelBytes(e)) {
      return bad("has a raw payload of the wrong size");
    }
    if (manifest.height &&
        (UprightHeight(e) != manifest.height || UprightWidth(e) != manifest.width)) {
      return bad("has another shape than the manifest");
    }
    if (!labelled) {
      if (e.label != 0) {
        return Status::Corrupt(where, ": sample ", sample, " has label ", e.label,
                               " but the fields have no class field (0 expected)");
      }
      continue;
    }
    if (e.label < 0 || static_cast<size_t>(e.label) >= classes) {
      return Status::Corrupt(where, ": sample ", sample, " has label ", e.label, " but there are ",
                             classes, " classes");
    }
    if (class_counts) ++(*class_counts)[e.label];
  }
  return Status::OK();
}

// ---- Reading ---------------------------------------------------------------------------------

namespace {}  // namespace

Result<std::string> ReadBoundedFile(const std::string& path, uint64_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path, ": no such file");
    return Status::IOError(path, ": ", std::strerror(errno));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::IOError(path, ": ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Status::Corrupt(path, ": not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return Status::Corrupt(path, ": ", st.st_size, " bytes, more than the ", max_bytes,
                           " this file may hold");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IOError(path, ": read: ", std::strerror(errno));
    if (n == 0) break;  // shrank meanwhile
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return text;
}

bool IsArchiveDirectory(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return false;
  auto text = ReadBoundedFile((fs::path(path) / kManifestFileName).string(), kMaxManifestBytes);
  return text.ok() && IsShardfeedManifest(*text);
}

constexpr uint64_t kMaxLmdbPage = 64 * 1024;
constexpr std::chrono::seconds kRetryFailedShardAfter{2};

// A shard's slot: opened at Open() or, when lazy, on first use (under `mu`); ReleaseShard
// closes it again, and the next use reopens it.
struct Archive::Shard {
  // Unguarded before `store` is destroyed (which unmaps the range).
  ~Shard() { internal::UnguardRange(guard); }
  mutable std::mutex mu;  // opening and releasing
  mutable std::atomic<bool> ready{false};
  // `status` says why it could not be opened (until ReleaseShard forgets it); written under `mu`
  mutable std::atomic<bool> failed{false};
  // A remote shard's cached copy against the manifest's content hash, once a check needed it
  // (DiscardDamagedCopy): 0 not known, 1 the same, 2 different. Reset with each open.
  mutable std::atomic<int> copy_state{0};
  mutable Status status;
  // When it failed: a remote shard whose download failed for a reason that may pass (an I/O
  // error, a timeout: the server down) is tried again kRetryFailedShardAfter later.
  mutable std::chrono::steady_clock::time_point failed_at{};
  // A download the cache refused for room: storage::CacheRoomGeneration() before that attempt,
  // and how many refusals in a row (the wait before the next try without room given back).
  mutable uint64_t refused_generation = 0;
  mutable uint32_t refusals = 0;
  // A remote archive's cached copy of the file, held while mapped (destroyed after `store`).
  mutable std::unique_ptr<storage::CachedFile> lease;
  mutable std::unique_ptr<ShardStore> store;
  std::string file;        // its path, for messages
  mutable int guard = -1;  // internal::GuardRange id of the mapping, or -1
};

namespace {

// Every shard the manifest lists is a file of the directory: a manifest listing more shards than
// the directory has files is refused before its document (about 2 KB of memory a shard entry) is
// built. Counts the directory's entries only up to what the manifest claims. Up to
// kShardsBuiltUnchecked shards (a few MB of document) are built without it, so that a missing
// shard file of an ordinary archive is reported by name, as damage of that shard (verify).
constexpr uint64_t kShardsBuiltUnchecked = 4096;
Status CheckShardCount(const std::string& dir, const std::string& text,
                       const std::string& manifest_file) {
  SF_ASSIGN_OR_RETURN(uint64_t listed, CountManifestShards(text, manifest_file));
  if (listed <= kShardsBuiltUnchecked) return Status::OK();
  uint64_t files = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end && files <= listed;
       it.increment(ec)) {
    if (it->path().filename() != kManifestFileName) ++files;
  }
  if (listed > files) {
    return Status::Corrupt(manifest_file, ": lists ", listed,
                           " shards, the archive directory holds ", files, " other files");
  }
  return Status::OK();
}

}  // namespace

Archive::Archive() = default;
Archive::~Archive() = default;

namespace {

// XXH3 of a shard's chunks, its var stream (HDF5 /images shards), its index and its fields
// table: the content hash its header and the manifest hold.
uint64_t ShardContentHash(const ShardStore& shard) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (size_t c = 0; c < shard.chunk_data.size(); ++c) {
    XXH3_64bits_update(state, shard.chunk_data[c], shard.chunk_size[c]);
  }
  if (shard.var_size > 0) XXH3_64bits_update(state, shard.var_data, shard.var_size);
  XXH3_64bits_update(state, shard.index, shard.header.sample_count * sizeof(IndexEntry));
  if (shard.fields_size > 0) XXH3_64bits_update(state, shard.fields, shard.fields_size);
  uint64_t got = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return got;
}

Result<std::unique_ptr<ShardStore>> OpenShardFile(Backend backend, const std::string& file,
                                                  const ShardInfo& info, size_t s) {
  return backend == Backend::kLmdb ? OpenLmdbShard(file, info, s) : OpenHdf5Shard(file, info, s);
}

// The manifest's text, from a directory or a remote location (`remote` set for the latter).
Result<std::string> ReadManifestText(const std::string& path, const OpenOptions& options,
                                     std::string* manifest_file,
                                     std::shared_ptr<storage::Remote>* remote) {
  if (storage::IsRemote(path)) {
    SF_ASSIGN_OR_RETURN(*remote, storage::Remote::Open(path, options.cache));
    const std::string name(kManifestFileName);
    *manifest_file = (*remote)->UrlOf(name);
    return (*remote)->ReadText(name, kMaxManifestBytes, options.cancel);
  }
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (fs::exists(path, ec)) {
      return Status::InvalidArgument(path, ": not a shardfeed archive (expected a directory)");
    }
    SF_RETURN_IF_ERROR(storage::CheckScheme(path));  // gs://...: said so, not "no such archive"
    return Status::NotFound(path, ": no such archive");
  }
  *manifest_file = (fs::path(path) / kManifestFileName).string();
  auto read = ReadBoundedFile(*manifest_file, kMaxManifestBytes);
  if (read.status().code() == StatusCode::kNotFound) {
    // An image folder given where an archive is expected (a pack that never finished leaves
    // only <path>.partial, never a <path> without its manifest).
    return Status::InvalidArgument(path, ": not a shardfeed archive (no ", kManifestFileName,
                                   "); did you mean `shardfeed pack`?");
  }
  return read;
}

}  // namespace

Result<std::shared_ptr<Archive>> Archive::Open(const std::string& path, IndexCheck check) {
  OpenOptions options;
  options.check = check;
  return Open(path, options);
}

Result<std::shared_ptr<Archive>> Archive::Open(const std::string& path,
                                               const OpenOptions& options) {
  IndexCheck check = options.check;
  std::string manifest_file;
  std::shared_ptr<storage::Remote> remote;
  SF_ASSIGN_OR_RETURN(std::string text, ReadManifestText(path, options, &manifest_file, &remote));
  // A remote manifest is bounded by kMaxManifestBytes alone (no directory to count).
  if (!remote) SF_RETURN_IF_ERROR(CheckShardCount(path, text, manifest_file));
  SF_ASSIGN_OR_RETURN(Manifest manifest, Manifest::FromJson(text, manifest_file));
  if (remote) {
    uint64_t bytes = 0;
    for (const ShardInfo& info : manifest.shards) bytes += info.file_bytes;
    // A cache below the whole archive: opened lazily, shards held only while read (kAuto).
    if (check == IndexCheck::kAuto && remote->cache_limit() != 0 && remote->cache_limit() < bytes) {
      check = IndexCheck::kLazy;
    }
    if (check == IndexCheck::kFull) {
      SF_RETURN_IF_ERROR(remote->CheckLimit(
          bytes, "of " + path + "'s shards (a fully checked archive holds every shard at once)"));
    }
  }

  std::shared_ptr<Archive> archive(new Archive());
  archive->path_ = path;
  archive->remote_ = remote;
  archive->open_options_ = options;
  archive->open_options_.cancel = nullptr;  // the caller's, for this call only
  archive->lazy_ = check == IndexCheck::kLazy ||
                   (check == IndexCheck::kAuto && manifest.sample_count > kLazyIndexAbove);
  for (const ShardInfo& info : manifest.shards) {
    archive->shard_starts_.push_back(info.first_sample);
    archive->shards_.push_back(std::make_unique<Shard>());
    archive->shards_.back()->file =
        remote ? remote->UrlOf(info.file) : (fs::path(path) / info.file).string();
  }
  archive->manifest_ = std::move(manifest);
  if (archive->lazy_) return archive;

  // Full: every shard now, with its index checksum, every entry and the class counts.
  if (remote) SF_RETURN_IF_ERROR(archive->FetchAll(options.cancel));
  std::vector<uint64_t> class_counts(archive->manifest_.class_names.size());
  for (size_t s = 0; s < archive->shards_.size(); ++s) {
    if (Cancelled(options.cancel)) return Status::Cancelled(path, ": opening it was cancelled");
    Status error;
    const Shard* shard = archive->Ready(s, &error);
    if (!shard) return error;
    const std::string& file = shard->file;
    SF_RETURN_IF_ERROR(CheckIndexChecksum(*shard->store, file));
    SF_RETURN_IF_ERROR(ValidateEntries(*shard->store, archive->manifest_, archive->shard_starts_[s],
                                       0, shard->store->header.sample_count, file, &class_counts));
    SF_RETURN_IF_ERROR(CheckFieldsChecksum(*shard->store, file));
    SF_RETURN_IF_ERROR(ValidateVarEntries(*shard->store, archive->manifest_.schema,
                                          archive->shard_starts_[s], 0,
                                          shard->store->header.sample_count, file));
  }
  if (archive->manifest_.schema.label_field() < 0) class_counts.clear();  // none without labels
  // The manifest's counts are checked against the labels stored, so an edited manifest (a count,
  // a class added or dropped) cannot pass even where it carries no checksum (version 1).
  const Manifest& m = archive->manifest_;
  if (!m.class_counts.empty() && m.class_counts != class_counts) {
    for (size_t c = 0; c < class_counts.size(); ++c) {
      if (m.class_counts[c] != class_counts[c]) {
        return Status::Corrupt(manifest_file, ": class ", c, " has ", class_counts[c],
                               " samples in the shards, the manifest says ", m.class_counts[c]);
      }
    }
  }
  archive->manifest_.class_counts = class_counts;
  return archive;
}

Status Archive::OpenShard(size_t s, const CancelToken* cancel) const {
  const ShardInfo& info = manifest_.shards[s];
  auto open = [&](const std::string& file) -> Result<std::unique_ptr<ShardStore>> {
    SF_ASSIGN_OR_RETURN(std::unique_ptr<ShardStore> store,
                        OpenShardFile(manifest_.backend, file, info, s));
    SF_RETURN_IF_ERROR(CheckFieldsTable(*store, manifest_.schema, shards_[s]->file));
    return store;
  };
  Result<std::unique_ptr<ShardStore>> opened = Status::Internal("not opened");
  if (!remote_) {
    opened = open((fs::path(path_) / info.file).string());
  } else {  // the cached copy, downloaded and checked against the content hash if absent
    const Backend backend = manifest_.backend;
    const std::string url = shards_[s]->file;
    auto verify = [&](const std::string& local) -> Status {
      auto store = OpenShardFile(backend, local, info, s);
      if (!store.ok()) {
        return Status::ChecksumMismatch(url, ": downloaded copy is damaged (",
                                        store.status().message(), ")");
      }
      const uint64_t got = ShardContentHash(**store);
      if (got != info.content_hash) {
        return Status::ChecksumMismatch(url, ": shard hash mismatch (manifest ",
                                        HashToHex(info.content_hash), ", downloaded ",
                                        HashToHex(got), ")", storage::kNotTheListedObject);
      }
      return Status::OK();
    };
    // A copy found in the cache was verified when it was downloaded: one that no longer opens
    // was damaged since (a disk fault, a truncation), so it is discarded and downloaded once more.
    // One downloaded just now that does not open is the archive's damage: reported as it is.
    for (int attempt = 0;; ++attempt) {
      SF_ASSIGN_OR_RETURN(
          shards_[s]->lease,
          remote_->Fetch(info.file, info.file_bytes, HashToHex(info.content_hash), verify, cancel));
      opened = open(shards_[s]->lease->path());
      if (!opened.ok() && attempt < 2 && !shards_[s]->lease->named()) {
        // Another process discarded the copy (or replaced it) between the fetch and the open:
        // not this copy's fault, fetched once more.
        shards_[s]->lease.reset();
        continue;
      }
      const StatusCode code = opened.status().code();
      const bool damaged = code == StatusCode::kCorrupt || code == StatusCode::kChecksumMismatch;
      if (opened.ok() || !damaged || shards_[s]->lease->downloaded() || attempt >= 2) break;
      // A copy that passes the download's own check (it opens, it has the content hash) is as
      // stored: what failed (the fields table) is the archive's damage, and it stays.
      if (verify(shards_[s]->lease->path()).ok()) break;
      bool removed = false;
      if (Status gone = remote_->Discard(*shards_[s]->lease, &removed); !gone.ok()) {
        return Status::IOError(CopyName(*shards_[s]), " no longer opens (",
                               opened.status().message(),
                               ") and could not be removed: ", gone.message());
      }
      Note(CopyName(*shards_[s]) + " no longer opened (" + opened.status().message() + "): " +
           (removed ? "discarded" : "replaced in the cache meanwhile") + "; downloaded again");
      shards_[s]->lease.reset();
    }
    if (!opened.ok()) shards_[s]->lease.reset();
  }
  if (!opened.ok()) return opened.status();
  std::unique_ptr<ShardStore> store = std::move(*opened);
  // The guard answers a SIGBUS by mapping zeros over its range: register only what is provably
  // this shard's mapping (never wider than the file it maps, plus LMDB's last page).
  if (store->map_size <= store->file_bytes + kMaxLmdbPage) {
    shards_[s]->guard = internal::GuardRange(store->map_base, store->map_size);
  }
  shards_[s]->store = std::move(store);
  shards_[s]->copy_state.store(0, std::memory_order_release);
  return Status::OK();
}

const Archive::Shard* Archive::Ready(size_t s, Status* error, const CancelToken* cancel) const {
  Shard& shard = *shards_[s];
  if (!shard.ready.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(shard.mu);
    // A failure is kept (every access reports it at once, no storm of retries) unless it is a
    // remote shard's download that failed for a reason that may pass and a while has gone by:
    // a loader whose epoch failed while the server was down reads again once it is back. A
    // download the cache refused for room is tried again as soon as this process gave room
    // back (the room is not the shard's: shards in use are given back all the time, and a
    // refusal met by a download ahead of the reads must not become the reads' error), else
    // after 50 ms doubling to 2 s (room other processes give back). Each try lists the whole
    // cache under its lock: trying at every access cost 4 system calls a cached file per
    // sample, and held up every process sharing the cache.
    const StatusCode code = shard.status.code();
    const bool may_pass = remote_ && (code == StatusCode::kIOError || code == StatusCode::kTimeout);
    const bool refused = remote_ && code == StatusCode::kResourceExhausted;
    const auto now = std::chrono::steady_clock::now();
    const std::chrono::milliseconds backoff(std::min<int64_t>(
        2000, int64_t{50} << std::min<uint32_t>(shard.refusals - 1, 6)));  // refusals >= 1 here
    // A cancelled open was the caller's choice, not the shard's state: tried again at once.
    const bool cancelled = code == StatusCode::kCancelled;
    const bool retry =
        shard.failed.load() &&
        (cancelled || (refused ? storage::CacheRoomGeneration() != shard.refused_generation ||
                                     now - shard.failed_at >= backoff
                               : may_pass && now - shard.failed_at >= kRetryFailedShardAfter));
    if (!shard.ready.load(std::memory_order_relaxed) && (!shard.failed.load() || retry)) {
      // Being opened, not failed, while this retry downloads (holding shard.mu): a reader's
      // keeper that sees a failed shard releases it (ReleaseShard takes shard.mu), and would
      // wait here for the whole download with its loader's lock held.
      shard.failed.store(false);
      const uint64_t generation = storage::CacheRoomGeneration();  // before: room given meanwhile
      shard.status = OpenShard(s, cancel);
      shard.failed.store(!shard.status.ok());
      if (!shard.status.ok()) shard.failed_at = std::chrono::steady_clock::now();
      const bool room = remote_ && shard.status.code() == StatusCode::kResourceExhausted;
      shard.refusals = room ? shard.refusals + 1 : 0;
      shard.refused_generation = generation;
      if (shard.status.ok()) shard.ready.store(true, std::memory_order_release);
    }
    if (shard.failed.load()) {
      *error = shard.status;
      return nullptr;
    }
  }
  return &shard;
}

Status Archive::OpenShardNow(size_t s, const CancelToken* cancel) const {
  if (s >= shards_.size()) return Status::InvalidArgument(path_, ": no shard ", s);
  Status error;
  return Ready(s, &error, cancel) ? Status::OK() : error;
}

bool Archive::ShardOpen(size_t s) const {
  return s < shards_.size() && shards_[s]->ready.load(std::memory_order_acquire);
}

bool Archive::ShardFailed(size_t s) const {
  return s < shards_.size() && shards_[s]->failed.load();
}

void Archive::ReleaseShard(size_t s) {
  if (s >= shards_.size()) return;
  Shard& shard = *shards_[s];
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.failed.load()) {  // forgotten: the next access tries to open it again
    shard.failed.store(false);
    shard.status = Status::OK();
    return;
  }
  if (!shard.ready.load(std::memory_order_relaxed)) return;
  shard.ready.store(false, std::memory_order_release);
  internal::UnguardRange(shard.guard);  // before the range is unmapped
  shard.guard = -1;
  shard.store.reset();  // unmaps
  shard.lease.reset();  // then the cached file goes back to the cache
}

Status Archive::FetchAll(const CancelToken* cancel) const {
  // A few downloads at once (each shard whole). After a failure none is begun: the open fails
  // with it whatever the rest would do (against a store that stalls, every shard would take its
  // timeouts and retries first).
  std::atomic<size_t> next{0};
  std::mutex mu;
  size_t failed_shard = shards_.size();
  Status failed;
  auto work = [&] {
    for (size_t s; !Cancelled(cancel) && (s = next.fetch_add(1)) < shards_.size();) {
      Status error;
      if (Ready(s, &error, cancel)) continue;
      next.store(shards_.size());
      std::lock_guard<std::mutex> lock(mu);
      if (s < failed_shard) failed_shard = s, failed = error;
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < std::min<size_t>(4, shards_.size()); ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  return failed;
}

size_t Archive::FindShard(uint64_t index) const {
  if (shards_.size() == 1) return 0;
  auto it = std::upper_bound(shard_starts_.begin(), shard_starts_.end(), index);
  return static_cast<size_t>(it - shard_starts_.begin()) - 1;
}

RecordView Archive::Record(const Shard& slot, size_t s, uint64_t index) const {
  const ShardStore& shard = *slot.store;
  const IndexEntry& e = shard.index[index - shard_starts_[s]];
  return RecordView{shard.chunk_data[e.chunk] + e.offset, e.size, &e};
}

Result<RecordView> Archive::At(uint64_t index) const {
  if (index >= size()) {
    return Status::InvalidArgument(path_, ": sample ", index, " out of range (archive has ", size(),
                                   " samples)");
  }
  const size_t s = FindShard(index);
  Status error;
  const Shard* shard = Ready(s, &error);
  if (!shard) return error;
  if (lazy_) {  // entries were not checked at open: check this one (a few comparisons)
    const uint64_t local = index - shard_starts_[s];
    Status st = ValidateEntries(*shard->store, manifest_, shard_starts_[s], local, local + 1,
                                shard->file, nullptr);
    if (!st.ok()) return st;
  }
  return Record(*shard, s, index);
}

Status Archive::CheckUnchanged(uint64_t index) const {
  // Every sample of the loader passes here: one atomic load unless a SIGBUS was ever answered.
  if (!internal::AnyFaulted() || index >= size()) return Status::OK();
  const size_t s = FindShard(index);
  const Shard& shard = *shards_[s];
  if (!shard.ready.load(std::memory_order_acquire) || !internal::RangeFaulted(shard.guard)) {
    return Status::OK();
  }
  // A remote shard's file is its cached copy (shard.file is its URL): the copy is what changed.
  const std::string& local = shard.lease ? shard.lease->path() : shard.file;
  const std::string named = CopyName(shard);
  struct stat st {};
  const bool seen = ::stat(local.c_str(), &st) == 0;
  const std::string now = seen ? std::to_string(st.st_size) + " bytes now"
                               : std::string("now unreadable: ") + std::strerror(errno);
  // The kernel raised SIGBUS for a page of the mapping: the file shrank, or (same size) the
  // page could not be read back (an I/O error of the storage).
  const char* what = seen && uint64_t(st.st_size) >= shard.store->file_bytes
                         ? ": could not be read through its mapping (an I/O error?"
                         : ": changed on disk while in use (";
  return Status::Changed(named, what, shard.store->file_bytes, " bytes when opened, ", now,
                         "); sample ", index, kReadSinceUnreliable);
}

Status Archive::VerifyRecord(uint64_t index, bool fields) const {
  SF_ASSIGN_OR_RETURN(RecordView r, At(index));
  uint64_t got = RecordChecksum(r.data, r.size);
  SF_RETURN_IF_ERROR(CheckUnchanged(index));
  if (got != r.entry->checksum) {
    return Status::ChecksumMismatch(
        path_, ": sample ", index, ": payload checksum mismatch (stored ",
        HashToHex(r.entry->checksum), ", computed ", HashToHex(got), ")",
        DiscardDamagedCopy(*shards_[FindShard(index)], FindShard(index)));
  }
  if (!fields || !manifest_.schema.has_var_fields()) return Status::OK();
  SF_ASSIGN_OR_RETURN(VarBlob blob, Blob(index));
  SF_RETURN_IF_ERROR(CheckBlob(index, blob));
  // The blob as the manifest's fields lay it out (slots in bounds, dims that fit): a blob whose
  // checksum holds can still disagree with a schema edited in the manifest (a field added),
  // which every reader of that field would then fail on.
  for (int f : manifest_.schema.var_fields()) {
    Result<FieldView> view = VarField(manifest_.schema, blob.data, blob.size, f);
    if (!view.ok()) {
      return Status::Corrupt(*blob.file, ": sample ", index, ": ", view.status().message(),
                             " (the manifest's fields do not match the shard's var blob)");
    }
  }
  return Status::OK();
}

Result<Archive::VarBlob> Archive::Blob(uint64_t index) const {
  const size_t s = FindShard(index);
  Status error;
  const Shard* slot = Ready(s, &error);
  if (!slot) return error;
  const ShardStore& shard = *slot->store;
  const uint64_t local = index - shard_starts_[s];
  // Checked here every time (a few comparisons): a lazily opened shard's entries were not.
  SF_RETURN_IF_ERROR(
      ValidateVarEntries(shard, manifest_.schema, shard_starts_[s], local, local + 1, slot->file));
  const VarEntry v = VarEntryOf(shard, manifest_.schema, local);
  return VarBlob{VarBlobData(shard, v), v.size, v.checksum, &slot->file};
}

Status Archive::CheckBlob(uint64_t index, const VarBlob& blob) const {
  const uint64_t got = RecordChecksum(blob.data, blob.size);
  SF_RETURN_IF_ERROR(CheckUnchanged(index));
  if (got != blob.checksum) {
    // Named by the damaged value where one no longer decodes, not by the field being read (the
    // blob holds them all: the first a reader asks for is not the one that is damaged).
    const Schema& schema = manifest_.schema;
    const std::string damaged = DamagedVarField(schema, blob.data, blob.size);
    std::string which = damaged.empty() ? "" : ": field '" + damaged + "'";
    std::string held;
    for (int f : schema.var_fields())
      held += (held.empty() ? "'" : ", '") + schema.fields()[f].name + "'";
    return Status::ChecksumMismatch(
        *blob.file, ": sample ", index, which, ": var blob (the sample's variable fields ", held,
        ") checksum mismatch (stored ", HashToHex(blob.checksum), ", computed ", HashToHex(got),
        ")", DiscardDamagedCopy(*shards_[FindShard(index)], FindShard(index)),
        damaged.empty() ? "; every value still decodes, so which one is damaged is unknown" : "");
  }
  return Status::OK();
}

Result<FieldView> Archive::Field(uint64_t index, size_t f, bool verify) const {
  const Schema& schema = manifest_.schema;
  if (index >= size()) {
    return Status::InvalidArgument(path_, ": sample ", index, " out of range (archive has ", size(),
                                   " samples)");
  }
  if (f >= schema.size() || static_cast<int>(f) == schema.image_field() ||
      static_cast<int>(f) == schema.label_field()) {
    return Status::InvalidArgument(path_, ": field ", f,
                                   f < schema.size() ? " ('" + schema.fields()[f].name + "')" : "",
                                   " is not a stored field (the image and the class field come "
                                   "from At)");
  }
  const FieldSpec& spec = schema.fields()[f];
  const std::string field = ": field '" + spec.name + "'";
  if (spec.fixed()) {
    const size_t s = FindShard(index);
    Status error;
    const Shard* slot = Ready(s, &error);
    if (!slot) return error;
    const ShardStore& shard = *slot->store;
    const uint64_t n = shard.header.sample_count;
    FieldView view;
    view.data =
        shard.fields + schema.ColumnOffset(f, n) + (index - shard_starts_[s]) * spec.item_bytes();
    view.size = spec.item_bytes();
    view.ndim = static_cast<uint32_t>(spec.dims.size());
    for (size_t d = 0; d < spec.dims.size(); ++d)
      view.dims[d] = static_cast<uint32_t>(spec.dims[d]);
    view.aligned = reinterpret_cast<uintptr_t>(view.data) % ElemSize(spec.elem) == 0;
    return view;
  }
  auto found = Blob(index);
  if (!found.ok()) return found.status().WithContext("reading field '" + spec.name + "'");
  const VarBlob& blob = *found;
  if (verify) SF_RETURN_IF_ERROR(CheckBlob(index, blob));
  auto view = VarField(schema, blob.data, blob.size, f);
  if (!view.ok()) {
    return view.status().WithContext(*blob.file + ": sample " + std::to_string(index));
  }
  if (spec.kind == FieldKind::kMask) {  // a reader sizes its buffer from these: the image's
    SF_ASSIGN_OR_RETURN(RecordView r, At(index));
    if (view->dims[0] != r.entry->height || view->dims[1] != r.entry->width) {
      return Status::Corrupt(*blob.file, ": sample ", index, field, ": mask is ", view->dims[0],
                             "x", view->dims[1], ", the image is stored as ", r.entry->height, "x",
                             r.entry->width);
    }
  }
  return view;
}

Status Archive::VerifyShard(size_t s) const {
  if (s >= shards_.size()) return Status::InvalidArgument(path_, ": no shard ", s);
  Status error;
  const Shard* slot = Ready(s, &error);
  if (!slot) return error;
  const ShardStore& shard = *slot->store;
  const uint64_t got = ShardContentHash(shard);
  if (internal::RangeFaulted(slot->guard)) {
    return Status::Corrupt(slot->file, ": changed on disk while being verified (truncated?)");
  }
  if (got != shard.header.content_hash || got != manifest_.shards[s].content_hash) {
    const std::string mismatch = shards_[s]->file + ": shard hash mismatch (manifest " +
                                 HashToHex(manifest_.shards[s].content_hash) + ", computed " +
                                 HashToHex(got) + ")";
    return Status::ChecksumMismatch(mismatch, DiscardDamagedCopy(*slot, s, &got));
  }
  slot->copy_state.store(1, std::memory_order_release);  // the copy is as downloaded
  return Status::OK();
}

std::string Archive::CopyName(const Shard& slot) const {
  return slot.lease ? slot.file + " (cached copy " + slot.lease->path() + ")" : slot.file;
}

void Archive::Note(std::string note) const {
  std::lock_guard<std::mutex> lock(discard_mu_);
  discard_notes_.push_back(std::move(note));
}

std::string Archive::DiscardDamagedCopy(const Shard& slot, size_t s, const uint64_t* hash) const {
  if (!remote_ || !slot.lease) return "";
  // Downloads are checked against the manifest's content hash, which covers every record, blob,
  // index entry and field: a copy that still has it holds the archive as stored, so the damage
  // is the archive's. One that no longer has it changed in the cache since: it is removed, so
  // that the next open of the shard downloads it again. Hashed once per shard (a whole read),
  // under the shard's lock; the first to find it changed notes it (DiscardNotes).
  bool first = false;
  int state = slot.copy_state.load(std::memory_order_acquire);
  if (state == 0) {
    std::lock_guard<std::mutex> lock(slot.mu);
    state = slot.copy_state.load(std::memory_order_acquire);
    if (state == 0) {
      const uint64_t got = hash ? *hash : ShardContentHash(*slot.store);
      state = got == manifest_.shards[s].content_hash ? 1 : 2;
      slot.copy_state.store(state, std::memory_order_release);
      first = state == 2;
    }
  }
  if (state == 1) return "";
  bool removed = false;
  const Status gone = remote_->Discard(*slot.lease, &removed);
  const std::string where = " in the cached copy " + slot.lease->path();
  if (first) {
    Note(slot.file + ": shard hash mismatch" + where + ", damaged since its download: " +
         (!gone.ok() ? "could not be removed (" + gone.message() + ")"
          : removed  ? "discarded; the next open downloads it again"
                     : "replaced in the cache meanwhile; the next open reads the new copy"));
  }
  return where + ", damaged since its download" +
         (!gone.ok() ? "; it could not be discarded (" + gone.message() + ")"
          : removed  ? " and now discarded: the next open of the shard downloads it again"
                    : " and no longer in the cache: the next open of the shard downloads it again");
}

std::vector<std::string> Archive::DiscardNotes() const {
  std::lock_guard<std::mutex> lock(discard_mu_);
  return discard_notes_;
}

Status Archive::VerifyDerived() const {
  const std::string manifest_file = (fs::path(path_) / kManifestFileName).string();
  std::vector<uint64_t> class_counts(manifest_.class_names.size());
  for (size_t s = 0; s < shards_.size(); ++s) {
    Status error;
    const Shard* slot = Ready(s, &error);
    if (!slot) return error;
    const ShardStore& shard = *slot->store;
    const ShardInfo& info = manifest_.shards[s];
    SF_RETURN_IF_ERROR(CheckIndexChecksum(shard, slot->file));
    SF_RETURN_IF_ERROR(ValidateEntries(shard, manifest_, shard_starts_[s], 0,
                                       shard.header.sample_count, slot->file, &class_counts));
    uint64_t records = 0, chunks = 0;
    for (uint64_t i = 0; i < shard.header.sample_count; ++i) records += shard.index[i].size;
    for (uint64_t size : shard.chunk_size) chunks += size;
    chunks += shard.var_size;  // HDF5 /images shards: the var stream holds the blobs
    auto differs = [&](const char* field, uint64_t stored, uint64_t actual) {
      return Status::Corrupt(manifest_file, ": shard ", info.file, ": ", field, " is ", stored,
                             ", the shard holds ", actual);
    };
    SF_RETURN_IF_ERROR(CheckFieldsChecksum(shard, slot->file));
    if (manifest_.backend == Backend::kHdf5) {  // what h5py users read instead of the index
      SF_RETURN_IF_ERROR(CheckHdf5Mirrors(slot->lease ? slot->lease->path() : slot->file, shard,
                                          shard_starts_[s], CopyName(*slot)));
    }
    uint64_t blobs = 0, padding = 0;
    SF_RETURN_IF_ERROR(
        VarLayout(shard, manifest_.schema, shard_starts_[s], slot->file, &blobs, &padding));
    // Var blobs count as payload; the padding before each blob belongs to the chunk only.
    const uint64_t payload = records + blobs;
    if (info.sizes_recorded && info.payload_bytes != payload) {
      return differs("payload_bytes", info.payload_bytes, payload);
    }
    if (chunks != payload + padding) {
      return differs("chunk bytes (sum of records, var blobs and their padding)", payload + padding,
                     chunks);
    }
    if (info.sizes_recorded && manifest_.backend == Backend::kLmdb &&
        info.file_bytes != shard.file_bytes) {
      return differs("file_bytes", info.file_bytes, shard.file_bytes);
    }
  }
  if (!manifest_.class_counts.empty()) {
    for (size_t c = 0; c < class_counts.size(); ++c) {
      if (manifest_.class_counts[c] != class_counts[c]) {
        return Status::Corrupt(manifest_file, ": class ", c, " has ", class_counts[c],
                               " samples in the shards, the manifest says ",
                               manifest_.class_counts[c]);
      }
    }
  }
  return Status::OK();
}

void Archive::Advise(Access access) const {
  int advice = access == Access::kSequential ? MADV_SEQUENTIAL
               : access == Access::kRandom   ? MADV_RANDOM
               : access == Access::kWillNeed ? MADV_WILLNEED
                                             : MADV_NORMAL;
  long page = sysconf(_SC_PAGESIZE);
  for (const auto& slot : shards_) {
    if (!slot->ready.load(std::memory_order_acquire)) continue;  // not mapped yet
    const ShardStore& shard = *slot->store;
    if (!shard.map_base) continue;
    uintptr_t start = reinterpret_cast<uintptr_t>(shard.map_base) & ~uintptr_t(page - 1);
    uintptr_t end = reinterpret_cast<uintptr_t>(shard.map_base) + shard.map_size;
    ::madvise(reinterpret_cast<void*>(start), end - start, advice);  // advisory: errors ignored
  }
}

void Archive::WillNeed(uint64_t index) const {
  auto r = At(index);  // a record that cannot be read gets no advice: its reader reports why
  if (!r.ok()) return;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t start = reinterpret_cast<uintptr_t>(r->data) & ~(page - 1);
  uintptr_t end = reinterpret_cast<uintptr_t>(r->data) + r->size;
  ::madvise(reinterpret_cast<void*>(start), end - start, MADV_WILLNEED);  // advisory
}

size_t Archive::OpenedShards() const {
  size_t n = 0;
  for (const auto& slot : shards_) n += slot->ready.load(std::memory_order_acquire);
  return n;
}

uint64_t Archive::FileBytes() const {
  uint64_t total = 0;
  for (size_t s = 0; s < shards_.size(); ++s) {
    total += shards_[s]->ready.load(std::memory_order_acquire) ? shards_[s]->store->file_bytes
                                                               : manifest_.shards[s].file_bytes;
  }
  return total;
}

}  // namespace shardfeed::format
