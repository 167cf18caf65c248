#include "shardfeed/format/archive.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "shard_internal.h"

namespace shardfeed::format {

namespace fs = std::filesystem;

uint64_t RecordChecksum(const void* data, size_t size) { return XXH3_64bits(data, size); }

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

Status ValidateShard(const ShardStore& shard, const std::string& where) {
  const ShardHeader& h = shard.header;
  uint64_t want = XXH3_64bits(shard.index, h.sample_count * sizeof(IndexEntry));
  if (want != h.index_checksum) {
    return Status::ChecksumMismatch(where, ": index checksum mismatch (stored ",
                                    HashToHex(h.index_checksum), ", computed ", HashToHex(want),
                                    ")");
  }
  for (uint64_t i = 0; i < h.sample_count; ++i) {
    const IndexEntry& e = shard.index[i];
    if (e.chunk >= h.chunk_count || uint64_t{e.offset} + e.size > shard.chunk_size[e.chunk]) {
      return Status::Corrupt(where, ": index entry of sample ", h.first_sample + i,
                             " points outside its chunk");
    }
    if (e.encoding < 1 || e.encoding > 3 || e.label < 0) {
      return Status::Corrupt(where, ": index entry of sample ", h.first_sample + i,
                             " is malformed");
    }
  }
  return Status::OK();
}

// ---- Reading ---------------------------------------------------------------------------------

namespace {

Result<std::string> ReadSmallFile(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::IOError(file, ": ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::IOError(file, ": read failed");
  return ss.str();
}

}  // namespace

Archive::~Archive() = default;

Result<std::shared_ptr<Archive>> Archive::Open(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (fs::exists(path, ec)) {
      return Status::InvalidArgument(path, ": not a shardfeed archive (expected a directory)");
    }
    return Status::NotFound(path, ": no such archive");
  }
  std::string manifest_file = (fs::path(path) / kManifestFileName).string();
  if (!fs::exists(manifest_file, ec)) {
    return Status::Corrupt(path, ": no ", kManifestFileName,
                           " (not an archive, or one whose packing never finished)");
  }
  SF_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(manifest_file));
  SF_ASSIGN_OR_RETURN(Manifest manifest, Manifest::FromJson(text, manifest_file));

  std::shared_ptr<Archive> archive(new Archive());
  archive->path_ = path;
  for (size_t s = 0; s < manifest.shards.size(); ++s) {
    const ShardInfo& info = manifest.shards[s];
    std::string file = (fs::path(path) / info.file).string();
    std::unique_ptr<ShardStore> store;
    if (manifest.backend == Backend::kLmdb) {
      SF_ASSIGN_OR_RETURN(store, OpenLmdbShard(file));
    } else {
      SF_ASSIGN_OR_RETURN(store, OpenHdf5Shard(file));
    }
    const ShardHeader& h = store->header;
    if (h.shard_number != s || h.first_sample != info.first_sample ||
        h.sample_count != info.sample_count || h.chunk_count != info.chunk_count ||
        h.content_hash != info.content_hash) {
      return Status::Corrupt(file, ": shard header disagrees with ", kManifestFileName,
                             " (shard from another archive?)");
    }
    SF_RETURN_IF_ERROR(ValidateShard(*store, file));
    for (uint64_t i = 0; i < h.sample_count; ++i) {
      if (static_cast<size_t>(store->index[i].label) >= manifest.class_names.size()) {
        return Status::Corrupt(file, ": sample ", h.first_sample + i, " has label ",
                               store->index[i].label, " but there are ",
                               manifest.class_names.size(), " classes");
      }
    }
    archive->shard_starts_.push_back(info.first_sample);
    archive->shards_.push_back(std::move(store));
  }
  archive->manifest_ = std::move(manifest);
  return archive;
}

size_t Archive::FindShard(uint64_t index) const {
  if (shards_.size() == 1) return 0;
  auto it = std::upper_bound(shard_starts_.begin(), shard_starts_.end(), index);
  return static_cast<size_t>(it - shard_starts_.begin()) - 1;
}

RecordView Archive::Get(uint64_t index) const {
  const ShardStore& shard = *shards_[FindShard(index)];
  const IndexEntry& e = shard.index[index - shard.header.first_sample];
  return RecordView{shard.chunk_data[e.chunk] + e.offset, e.size, &e};
}

Result<RecordView> Archive::At(uint64_t index) const {
  if (index >= size()) {
    return Status::InvalidArgument(path_, ": sample ", index, " out of range (archive has ", size(),
                                   " samples)");
  }
  return Get(index);
}

Status Archive::VerifyRecord(uint64_t index) const {
  SF_ASSIGN_OR_RETURN(RecordView r, At(index));
  uint64_t got = RecordChecksum(r.data, r.size);
  if (got != r.entry->checksum) {
    return Status::ChecksumMismatch(
        path_, ": sample ", index, ": payload checksum mismatch (stored ",
        HashToHex(r.entry->checksum), ", computed ", HashToHex(got), ")");
  }
  return Status::OK();
}

Status Archive::VerifyShard(size_t s) const {
  if (s >= shards_.size()) return Status::InvalidArgument(path_, ": no shard ", s);
  const ShardStore& shard = *shards_[s];
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (size_t c = 0; c < shard.chunk_data.size(); ++c) {
    XXH3_64bits_update(state, shard.chunk_data[c], shard.chunk_size[c]);
  }
  XXH3_64bits_update(state, shard.index, shard.header.sample_count * sizeof(IndexEntry));
  uint64_t got = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (got != shard.header.content_hash || got != manifest_.shards[s].content_hash) {
    return Status::ChecksumMismatch(
        path_, "/", manifest_.shards[s].file, ": shard hash mismatch (manifest ",
        HashToHex(manifest_.shards[s].content_hash), ", computed ", HashToHex(got), ")");
  }
  return Status::OK();
}

void Archive::Advise(Access access) const {
  int advice = access == Access::kSequential ? MADV_SEQUENTIAL
               : access == Access::kRandom   ? MADV_RANDOM
               : access == Access::kWillNeed ? MADV_WILLNEED
                                             : MADV_NORMAL;
  long page = sysconf(_SC_PAGESIZE);
  for (const auto& shard : shards_) {
    if (!shard->map_base) continue;
    uintptr_t start = reinterpret_cast<uintptr_t>(shard->map_base) & ~uintptr_t(page - 1);
    uintptr_t end = reinterpret_cast<uintptr_t>(shard->map_base) + shard->map_size;
    ::madvise(reinterpret_cast<void*>(start), end - start, advice);  // advisory: errors ignored
  }
}

void Archive::WillNeed(uint64_t index) const {
  if (index >= size()) return;
  const RecordView r = Get(index);
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t start = reinterpret_cast<uintptr_t>(r.data) & ~(page - 1);
  uintptr_t end = reinterpret_cast<uintptr_t>(r.data) + r.size;
  ::madvise(reinterpret_cast<void*>(start), end - start, MADV_WILLNEED);  // advisory
}

uint64_t Archive::FileBytes() const {
  uint64_t total = 0;
  for (const auto& shard : shards_) total += shard->file_bytes;
  return total;
}

// ---- Writing ---------------------------------------------------------------------------------

Status SyncPath(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(path, ": open for sync: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Status::IOError(path, ": fsync: ", std::strerror(err));
  return Status::OK();
}

namespace {

std::string NowUtc() {
  std::time_t t = std::time(nullptr);
  std::tm tm;
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

struct ArchiveWriter::HashState {
  HashState() : state(XXH3_createState()) { XXH3_64bits_reset(state); }
  ~HashState() { XXH3_freeState(state); }
  XXH3_state_t* state;
};

Result<std::unique_ptr<ArchiveWriter>> ArchiveWriter::Create(const std::string& path,
                                                             const WriterOptions& options) {
  if (path.empty()) return Status::InvalidArgument("empty output path");
  if (options.chunk_bytes == 0 || options.chunk_bytes > (uint64_t{1} << 31)) {
    return Status::InvalidArgument("chunk size must be between 1 byte and 2 GiB");
  }
  std::error_code ec;
  std::string clean = fs::path(path).lexically_normal().string();
  if (!clean.empty() && clean.back() == '/') clean.pop_back();
  if (fs::exists(clean, ec) && !options.overwrite) {
    return Status::InvalidArgument(clean, ": already exists (pass --overwrite to replace it)");
  }
  if (fs::exists(clean, ec) && options.overwrite && !fs::is_directory(clean, ec)) {
    return Status::InvalidArgument(clean,
                                   ": exists and is not an archive directory; not replacing it");
  }
  std::unique_ptr<ArchiveWriter> w(new ArchiveWriter());
  w->path_ = clean;
  w->partial_path_ = clean + ".partial";
  w->options_ = options;
  if (options.backend == Backend::kHdf5 && options.height > 0 &&
      options.encoding != Encoding::kJpeg) {
    w->options_.chunk_bytes = 1;  // one record per chunk: each is a row of /images
  }
  // A lock beside the output keeps two packs of the same path apart; a stale partial directory
  // (from a killed pack) is only removed while holding it.
  std::string lock_file = clean + ".lock";
  w->lock_fd_ = ::open(lock_file.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (w->lock_fd_ < 0) return Status::IOError(lock_file, ": ", std::strerror(errno));
  if (::flock(w->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return Status::IOError(clean, ": another process is writing this archive (", lock_file,
                           " is locked)");
  }
  fs::remove_all(w->partial_path_, ec);
  if (ec)
    return Status::IOError(w->partial_path_,
                           ": cannot remove stale partial output: ", ec.message());
  fs::create_directories(w->partial_path_, ec);
  if (ec) return Status::IOError(w->partial_path_, ": ", ec.message());
  SF_RETURN_IF_ERROR(w->OpenShard());
  return w;
}

ArchiveWriter::~ArchiveWriter() {
  sink_.reset();
  if (!finished_ && !partial_path_.empty()) {
    std::error_code ec;
    fs::remove_all(partial_path_, ec);
  }
  if (lock_fd_ >= 0) {
    ::unlink((path_ + ".lock").c_str());
    ::close(lock_fd_);
  }
}

Status ArchiveWriter::OpenShard() {
  std::string file =
      (fs::path(partial_path_) / ShardFileName(options_.backend, shards_.size())).string();
  if (options_.backend == Backend::kLmdb) {
    SF_ASSIGN_OR_RETURN(sink_, CreateLmdbSink(file));
  } else {
    SF_ASSIGN_OR_RETURN(sink_, CreateHdf5Sink(file, options_));
  }
  chunk_.clear();
  index_.clear();
  chunk_count_ = 0;
  shard_first_ = samples_;
  shard_payload_ = 0;
  hash_ = std::make_unique<HashState>();
  return Status::OK();
}

Status ArchiveWriter::FlushChunk() {
  if (chunk_.empty()) return Status::OK();
  SF_RETURN_IF_ERROR(sink_->PutChunk(chunk_count_, chunk_.data(), chunk_.size()));
  XXH3_64bits_update(hash_->state, chunk_.data(), chunk_.size());
  ++chunk_count_;
  chunk_.clear();
  return Status::OK();
}

Status ArchiveWriter::Append(IndexEntry entry, const uint8_t* data, size_t size) {
  if (finished_) return Status::InvalidArgument("Append after Finish");
  if (size > (uint64_t{1} << 31))
    return Status::InvalidArgument("record of ", size, " bytes is too large");
  if (entry.label < 0) return Status::InvalidArgument("negative label ", entry.label);
  if (options_.shard_bytes && shard_payload_ > 0 && shard_payload_ + size > options_.shard_bytes) {
    SF_RETURN_IF_ERROR(CloseShard());
    SF_RETURN_IF_ERROR(OpenShard());
  }
  if (!chunk_.empty() && chunk_.size() + size > options_.chunk_bytes) {
    SF_RETURN_IF_ERROR(FlushChunk());
  }
  entry.checksum = RecordChecksum(data, size);
  entry.chunk = chunk_count_;
  entry.offset = static_cast<uint32_t>(chunk_.size());
  entry.size = static_cast<uint32_t>(size);
  chunk_.insert(chunk_.end(), data, data + size);
  index_.push_back(entry);
  if (static_cast<size_t>(entry.label) >= class_counts_.size())
    class_counts_.resize(entry.label + 1);
  ++class_counts_[entry.label];
  ++samples_;
  bytes_ += size;
  shard_payload_ += size;
  return Status::OK();
}

Status ArchiveWriter::NextShard() {
  if (index_.empty()) return Status::OK();
  SF_RETURN_IF_ERROR(CloseShard());
  return OpenShard();
}

Status ArchiveWriter::CloseShard() {
  SF_RETURN_IF_ERROR(FlushChunk());
  ShardHeader h{};
  std::memcpy(h.magic, kShardMagic, sizeof(h.magic));
  h.format_version = kFormatVersion;
  h.shard_number = static_cast<uint32_t>(shards_.size());
  h.first_sample = shard_first_;
  h.sample_count = index_.size();
  h.chunk_count = chunk_count_;
  h.index_checksum = XXH3_64bits(index_.data(), index_.size() * sizeof(IndexEntry));
  XXH3_64bits_update(hash_->state, index_.data(), index_.size() * sizeof(IndexEntry));
  h.content_hash = XXH3_64bits_digest(hash_->state);
  SF_RETURN_IF_ERROR(sink_->Finish(h, index_.data(), index_.size()));
  sink_.reset();
  ShardInfo info;
  info.file = ShardFileName(options_.backend, shards_.size());
  info.first_sample = h.first_sample;
  info.sample_count = h.sample_count;
  info.chunk_count = h.chunk_count;
  info.payload_bytes = shard_payload_;
  info.content_hash = h.content_hash;
  std::error_code ec;
  info.file_bytes = fs::file_size(fs::path(partial_path_) / info.file, ec);
  shards_.push_back(std::move(info));
  index_.clear();
  index_.shrink_to_fit();
  return Status::OK();
}

Status ArchiveWriter::Finish(Manifest manifest) {
  if (finished_) return Status::InvalidArgument("Finish called twice");
  SF_RETURN_IF_ERROR(CloseShard());
  manifest.format_version = kFormatVersion;
  manifest.backend = options_.backend;
  manifest.sample_count = samples_;
  manifest.shards = shards_;
  if (manifest.created_at.empty()) manifest.created_at = NowUtc();
  class_counts_.resize(std::max(class_counts_.size(), manifest.class_names.size()));
  manifest.class_counts = class_counts_;
  if (class_counts_.size() > manifest.class_names.size()) {
    return Status::InvalidArgument("a record has label ", class_counts_.size() - 1, " but only ",
                                   manifest.class_names.size(), " class names were given");
  }
  const std::string manifest_text = manifest.ToJson();
  if (options_.backend == Backend::kHdf5) {
    for (const ShardInfo& info : shards_) {
      SF_RETURN_IF_ERROR(
          AnnotateHdf5Shard((fs::path(partial_path_) / info.file).string(), manifest_text));
    }
  }
  std::string manifest_file = (fs::path(partial_path_) / kManifestFileName).string();
  {
    std::ofstream out(manifest_file, std::ios::binary | std::ios::trunc);
    out << manifest_text;
    out.flush();
    if (!out) return Status::IOError(manifest_file, ": write failed");
  }
  SF_RETURN_IF_ERROR(SyncPath(manifest_file, false));
  SF_RETURN_IF_ERROR(SyncPath(partial_path_, true));
  std::error_code ec;
  std::string old;
  if (fs::exists(path_, ec)) {
    old = path_ + ".old";
    fs::remove_all(old, ec);
    fs::rename(path_, old, ec);
    if (ec)
      return Status::IOError(path_, ": cannot move the previous archive aside: ", ec.message());
  }
  fs::rename(partial_path_, path_, ec);
  if (ec)
    return Status::IOError(path_, ": cannot rename ", partial_path_, " into place: ", ec.message());
  finished_ = true;
  std::string parent = fs::path(path_).parent_path().string();
  SF_RETURN_IF_ERROR(SyncPath(parent.empty() ? "." : parent, true));
  if (!old.empty()) fs::remove_all(old, ec);
  return Status::OK();
}

}  // namespace shardfeed::format
