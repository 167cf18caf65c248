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
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "fault_guard.h"
#include "shard_internal.h"

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

// A shard's slot: opened once (std::call_once), at Open() or, when lazy, on first use.
struct Archive::Shard {
  // Unguarded before `store` is destroyed (which unmaps the range).
  ~Shard() { internal::UnguardRange(guard); }
  mutable std::once_flag once;
  mutable std::atomic<bool> ready{false};
  mutable Status status;  // why it could not be opened (set once, inside `once`)
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

Result<std::shared_ptr<Archive>> Archive::Open(const std::string& path, IndexCheck check) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (fs::exists(path, ec)) {
      return Status::InvalidArgument(path, ": not a shardfeed archive (expected a directory)");
    }
    return Status::NotFound(path, ": no such archive");
  }
  std::string manifest_file = (fs::path(path) / kManifestFileName).string();
  auto read = ReadBoundedFile(manifest_file, kMaxManifestBytes);
  if (read.status().code() == StatusCode::kNotFound) {
    // An image folder given where an archive is expected (a pack that never finished leaves
    // only <path>.partial, never a <path> without its manifest).
    return Status::InvalidArgument(path, ": not a shardfeed archive (no ", kManifestFileName,
                                   "); did you mean `shardfeed pack`?");
  }
  SF_ASSIGN_OR_RETURN(std::string text, std::move(read));
  SF_RETURN_IF_ERROR(CheckShardCount(path, text, manifest_file));
  SF_ASSIGN_OR_RETURN(Manifest manifest, Manifest::FromJson(text, manifest_file));

  std::shared_ptr<Archive> archive(new Archive());
  archive->path_ = path;
  archive->lazy_ = check == IndexCheck::kLazy ||
                   (check == IndexCheck::kAuto && manifest.sample_count > kLazyIndexAbove);
  for (const ShardInfo& info : manifest.shards) {
    archive->shard_starts_.push_back(info.first_sample);
    archive->shards_.push_back(std::make_unique<Shard>());
    archive->shards_.back()->file = (fs::path(path) / info.file).string();
  }
  archive->manifest_ = std::move(manifest);
  if (archive->lazy_) return archive;

  // Full: every shard now, with its index checksum, every entry and the class counts.
  std::vector<uint64_t> class_counts(archive->manifest_.class_names.size());
  for (size_t s = 0; s < archive->shards_.size(); ++s) {
    Status error;
    const Shard* shard = archive->Ready(s, &error);
    if (!shard) return error;
    const std::string file = (fs::path(path) / archive->manifest_.shards[s].file).string();
    SF_RETURN_IF_ERROR(CheckIndexChecksum(*shard->store, file));
    SF_RETURN_IF_ERROR(ValidateEntries(*shard->store, archive->manifest_, archive->shard_starts_[s],
                                       0, shard->store->header.sample_count, file, &class_counts));
  }
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

Status Archive::OpenShard(size_t s) const {
  const ShardInfo& info = manifest_.shards[s];
  const std::string file = (fs::path(path_) / info.file).string();
  std::unique_ptr<ShardStore> store;
  if (manifest_.backend == Backend::kLmdb) {
    SF_ASSIGN_OR_RETURN(store, OpenLmdbShard(file, info, s));
  } else {
    SF_ASSIGN_OR_RETURN(store, OpenHdf5Shard(file, info, s));
  }
  // The guard answers a SIGBUS by mapping zeros over its range: register only what is provably
  // this shard's mapping (never wider than the file it maps, plus LMDB's last page).
  if (store->map_size <= store->file_bytes + kMaxLmdbPage) {
    shards_[s]->guard = internal::GuardRange(store->map_base, store->map_size);
  }
  shards_[s]->store = std::move(store);
  return Status::OK();
}

const Archive::Shard* Archive::Ready(size_t s, Status* error) const {
  Shard& shard = *shards_[s];
  if (!shard.ready.load(std::memory_order_acquire)) {
    std::call_once(shard.once, [&] {
      shard.status = OpenShard(s);
      if (shard.status.ok()) shard.ready.store(true, std::memory_order_release);
    });
    if (!shard.status.ok()) {
      *error = shard.status;
      return nullptr;
    }
  }
  return &shard;
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
  struct stat st {};
  const bool seen = ::stat(shard.file.c_str(), &st) == 0;
  const std::string now = seen ? std::to_string(st.st_size) + " bytes now"
                               : std::string("now unreadable: ") + std::strerror(errno);
  // The kernel raised SIGBUS for a page of the mapping: the file shrank, or (same size) the
  // page could not be read back (an I/O error of the storage).
  const char* what = seen && uint64_t(st.st_size) >= shard.store->file_bytes
                         ? ": could not be read through its mapping (an I/O error?"
                         : ": changed on disk while in use (";
  return Status::Corrupt(shard.file, what, shard.store->file_bytes, " bytes when opened, ", now,
                         "); sample ", index,
                         " and any read from it since are unreliable: reopen the archive");
}

Status Archive::VerifyRecord(uint64_t index) const {
  SF_ASSIGN_OR_RETURN(RecordView r, At(index));
  uint64_t got = RecordChecksum(r.data, r.size);
  SF_RETURN_IF_ERROR(CheckUnchanged(index));
  if (got != r.entry->checksum) {
    return Status::ChecksumMismatch(
        path_, ": sample ", index, ": payload checksum mismatch (stored ",
        HashToHex(r.entry->checksum), ", computed ", HashToHex(got), ")");
  }
  return Status::OK();
}

Status Archive::VerifyShard(size_t s) const {
  if (s >= shards_.size()) return Status::InvalidArgument(path_, ": no shard ", s);
  Status error;
  const Shard* slot = Ready(s, &error);
  if (!slot) return error;
  const ShardStore& shard = *slot->store;
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (size_t c = 0; c < shard.chunk_data.size(); ++c) {
    XXH3_64bits_update(state, shard.chunk_data[c], shard.chunk_size[c]);
  }
  XXH3_64bits_update(state, shard.index, shard.header.sample_count * sizeof(IndexEntry));
  uint64_t got = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (internal::RangeFaulted(slot->guard)) {
    return Status::Corrupt(slot->file, ": changed on disk while being verified (truncated?)");
  }
  if (got != shard.header.content_hash || got != manifest_.shards[s].content_hash) {
    return Status::ChecksumMismatch(
        path_, "/", manifest_.shards[s].file, ": shard hash mismatch (manifest ",
        HashToHex(manifest_.shards[s].content_hash), ", computed ", HashToHex(got), ")");
  }
  return Status::OK();
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
    auto differs = [&](const char* field, uint64_t stored, uint64_t actual) {
      return Status::Corrupt(manifest_file, ": shard ", info.file, ": ", field, " is ", stored,
                             ", the shard holds ", actual);
    };
    if (info.sizes_recorded && info.payload_bytes != records) {
      return differs("payload_bytes", info.payload_bytes, records);
    }
    if (chunks != records) return differs("chunk bytes (sum of records)", records, chunks);
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
