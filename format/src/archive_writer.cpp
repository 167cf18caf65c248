// ArchiveWriter: shards into "<path>.partial/", then an atomic swap into place. The safety rules
// are in archive.h; each is tested in tests/format/writer_safety_test.cpp.
// long file: one state machine (create, recover, append, close shards, commit, swap in) whose
// safety rules read best in one place; its helpers are the file-system steps it alone uses.
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <vector>

#include "shard_internal.h"
#include "shardfeed/base/file_io.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/format/stats_record.h"
#include "shardfeed/storage/remote.h"

namespace shardfeed::format {

namespace fs = std::filesystem;

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

constexpr const char* kPartialMarker = ".shardfeed-partial";
// Written into an archive just before it is moved aside to <path>.old (the fallback swap without
// RENAME_EXCHANGE): "replaced-by DEV INO", the identity of the directory that replaces it. Only
// a <path>.old carrying it is ever restored or removed by recovery.
constexpr const char* kReplacedMarker = ".shardfeed-replaced";

std::string Identity(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return "";
  return "replaced-by " + std::to_string(st.st_dev) + " " + std::to_string(st.st_ino);
}

// An entry of an archive folder that shardfeed did not write, or "" when there is none: --overwrite
// replaces the folder whole, so a user's file kept inside it (notes, an extract, a convert) would
// go with it. Ours: the manifest, shards (and the lock file LMDB makes beside one when another
// program opens it without MDB_NOLOCK), stats.json and its temporary, the replace marker.
std::string ForeignEntry(const std::string& dir) {
  auto digits = [](std::string_view s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  auto ours = [&](std::string_view name) {
    if (name == kManifestFileName || name == kReplacedMarker ||
        name == kPartialMarker) {  // the partial marker rides along until it is unlinked
      return true;
    }
    if (name == kStatsFileName) {  // a stats.json of the user's own is theirs (a note, say)
      return WhyNotOurStatsRecord((fs::path(dir) / kStatsFileName).string()).empty();
    }
    const std::string_view stats_tmp = ".tmp-";
    if (name.substr(0, kStatsFileName.size()) == kStatsFileName &&
        name.substr(kStatsFileName.size(), stats_tmp.size()) == stats_tmp) {
      return digits(name.substr(kStatsFileName.size() + stats_tmp.size()));
    }
    if (name.substr(0, 6) != "shard-") return false;
    name.remove_prefix(6);
    for (std::string_view ext : {".mdb-lock", ".mdb", ".h5"}) {
      if (name.size() > ext.size() && name.substr(name.size() - ext.size()) == ext) {
        return digits(name.substr(0, name.size() - ext.size()));
      }
    }
    return false;
  };
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!ours(name) || it->symlink_status(ec).type() != fs::file_type::regular) return name;
  }
  return ec ? std::string("(unreadable: ") + ec.message() + ")" : "";
}

Status CheckOnlyOurs(const std::string& dir) {
  const std::string foreign = ForeignEntry(dir);
  if (foreign.empty()) return Status::OK();
  return Status::InvalidArgument(dir, ": holds ", foreign,
                                 ", which shardfeed did not write; --overwrite replaces an archive "
                                 "only when everything in it is the archive's own, so it is left "
                                 "as it is (move ",
                                 foreign, " out first)");
}

// The identity a <path>.old's marker records, or "" when it carries none (not ours).
std::string ReplacedMarkerOf(const std::string& old) {
  auto text = ReadBoundedFile((fs::path(old) / kReplacedMarker).string(), 256);
  if (!text.ok()) return "";
  std::string t = *text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  return t.rfind("replaced-by ", 0) == 0 ? t : "";
}

std::string NowUtc() {
  std::time_t t = std::time(nullptr);
  std::tm tm;
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string ParentOf(const std::string& path) {
  std::string parent = fs::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

// `inner` equals `outer` or lies below it (both absolute, normalised).
bool Within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin(), o = outer.begin();
  for (; o != outer.end(); ++o, ++i) {
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

fs::path Resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? fs::absolute(path).lexically_normal() : p;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// A partial directory is ours only when it carries the marker (kept until after the swap, so a
// writer killed between writing the manifest and the swap leaves it too). An archive there
// without it is someone's own folder.
bool IsOurPartial(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
         ::lstat((fs::path(path) / kPartialMarker).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// renameat2 with flags; ENOSYS/EINVAL where the kernel or the filesystem lacks them.
int Rename2(const std::string& from, const std::string& to, unsigned flags) {
  return ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags);
}

std::string SystemError(int err) {
  return err == ENOSPC ? "no space left on device" : std::strerror(err);
}

// Copies a file's bytes to a new file `to` (created, never replaced) and syncs it; errors name the
// system's reason (std::filesystem::copy_file reports a full disk as an I/O error).
Status CopyFileData(const std::string& from, const std::string& to) {
  int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return Status::IOError(from, ": ", SystemError(errno));
  int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (out < 0) {
    const int err = errno;
    ::close(in);
    return Status::IOError(to, ": ", SystemError(err));
  }
  std::vector<char> buf(size_t{1} << 20);
  Status status;
  for (;;) {
    ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = Status::IOError(from, ": read: ", SystemError(errno));
      break;
    }
    if (n == 0) break;
    if (const int err = WriteAll(out, buf.data(), static_cast<size_t>(n)); err != 0) {
      status = Status::IOError(to, ": ", SystemError(err));
      break;
    }
  }
  if (status.ok() && ::fsync(out) != 0) status = Status::IOError(to, ": ", SystemError(errno));
  if (::close(out) != 0 && status.ok()) status = Status::IOError(to, ": ", SystemError(errno));
  ::close(in);
  if (!status.ok()) ::unlink(to.c_str());
  return status;
}

bool FlagsUnsupported(int err) { return err == EINVAL || err == ENOSYS || err == EOPNOTSUPP; }

// Removes each of `folders` (deepest first) that is empty; one that is missing (never made, or
// removed already) is passed over; stops at the first that holds something.
void RemoveEmptyFolders(const std::vector<std::string>& folders) {
  for (const std::string& f : folders) {
    if (::rmdir(f.c_str()) != 0 && errno != ENOENT) break;
  }
}

// Takes <path>.lock: created if missing (and then ours to remove), never truncated; locked with
// flock; re-checked after locking so a lock file unlinked meanwhile by the previous owner is not
// mistaken for the current one.
Result<int> TakeLock(const std::string& lock_file, const std::string& what, bool* created) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    int fd = ::open(lock_file.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0644);
    *created = fd >= 0;
    if (fd < 0 && errno == EEXIST) {
      fd = ::open(lock_file.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    }
    if (fd < 0)
      return Status::IOError(lock_file, ": cannot create the lock: ", std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != 0) {
      ::close(fd);
      return Status::InvalidArgument(lock_file,
                                     ": exists and is not a shardfeed lock file; not touching it");
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      return Status::IOError(what, ": another process is writing this archive (", lock_file,
                             " is locked by a running process; the lock dies with its owner, so "
                             "a killed writer never holds it: wait for that process or stop it, "
                             "`fuser ",
                             lock_file, "` names it)");
    }
    struct stat now;
    if (::stat(lock_file.c_str(), &now) == 0 && now.st_ino == st.st_ino &&
        now.st_dev == st.st_dev) {
      return fd;
    }
    ::close(fd);  // the previous owner removed it after we opened it: take the new one
  }
  return Status::IOError(what, ": could not take ", lock_file, " (it keeps changing)");
}

// Makes the folders above `clean` that are missing (`made` lists them, deepest first: removed
// again, while empty, if the writer never finishes, so a typo in a path leaves nothing behind)
// and takes the output's lock in them. Another writer that made the same folders and gave up
// removes them while they are empty: between our making (or finding) them and our lock file
// appearing in them. They are made again then (bounded).
Result<int> LockOutput(const std::string& clean, std::vector<std::string>* made) {
  for (int attempt = 0;; ++attempt) {
    std::error_code ec;
    std::vector<std::string> missing;  // deepest first: the made folders of all attempts are
    for (fs::path p = ParentOf(clean); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
      missing.push_back(p.string());  // the longest such list
      if (p == p.parent_path()) break;
    }
    if (missing.size() > made->size()) *made = std::move(missing);
    fs::create_directories(ParentOf(clean), ec);
    bool created = false;
    Result<int> locked = ec ? Result<int>(Status::IOError(ParentOf(clean), ": ", ec.message()))
                            : TakeLock(clean + ".lock", clean, &created);
    if (locked.ok()) return locked;
    const bool vanished = !fs::exists(ParentOf(clean), ec);
    if (!vanished || attempt >= 20) {
      RemoveEmptyFolders(*made);
      return locked.status();
    }
  }
}

}  // namespace

struct ArchiveWriter::HashState {
  HashState() : state(XXH3_createState()) { XXH3_64bits_reset(state); }
  ~HashState() { XXH3_freeState(state); }
  XXH3_state_t* state;
};

bool PathInside(const std::string& inner, const std::string& outer) {
  return Within(Resolved(inner), Resolved(outer));
}

Result<std::unique_ptr<ArchiveWriter>> ArchiveWriter::Create(const std::string& path,
                                                             const WriterOptions& options) {
  if (path.empty()) return Status::InvalidArgument("empty output path");
  SF_RETURN_IF_ERROR(storage::CheckScheme(path));  // not a local folder named "gs:"
  if (options.chunk_bytes == 0 || options.chunk_bytes > (uint64_t{1} << 31)) {
    return Status::InvalidArgument("chunk size must be between 1 byte and 2 GiB");
  }
  std::string clean = fs::path(path).lexically_normal().string();
  while (clean.size() > 1 && clean.back() == '/') clean.pop_back();
  const fs::path resolved = Resolved(clean);
  if (clean == "." || clean == ".." || clean == "/" || resolved == resolved.root_path()) {
    return Status::InvalidArgument(path, ": not a usable output path");
  }
  for (const std::string& p : options.protect) {
    const fs::path source = Resolved(p);
    if (resolved == source) {
      return Status::InvalidArgument(clean, ": is the source (", p, "); choose another output");
    }
    if (Within(source, resolved)) {
      return Status::InvalidArgument(clean, ": contains the source (", p,
                                     "); choose an output outside it");
    }
  }
  for (const std::string& p : options.sealed) {
    if (Within(resolved, Resolved(p))) {
      return Status::InvalidArgument(clean, ": lies inside the archive ", p,
                                     ", whose folder holds only what shardfeed writes there; "
                                     "choose an output outside it");
    }
  }
  // The lock first: a writer that does not get it has touched nothing (but folders it made for
  // the output, removed again), and its destructor touches nothing either (lock_fd_ and
  // partial_path_ stay unset).
  std::vector<std::string> made;
  SF_ASSIGN_OR_RETURN(const int lock_fd, LockOutput(clean, &made));
  std::unique_ptr<ArchiveWriter> w(new ArchiveWriter());
  w->made_parents_ = std::move(made);
  w->lock_fd_ = lock_fd;
  w->path_ = clean;
  w->options_ = options;
  SF_RETURN_IF_ERROR(w->Recover());

  if (Exists(clean)) {
    std::error_code link_ec;
    if (fs::is_symlink(clean, link_ec)) {
      // --overwrite would not help: the swap would replace the link itself with a folder and
      // leave the archive it names as it was, neither what the link's owner meant.
      return Status::InvalidArgument(
          clean, ": is a symbolic link (to ", fs::read_symlink(clean, link_ec).string(),
          "); shardfeed writes an archive at its own path, never through or over a link: give "
          "that path or a new one");
    }
    if (!options.overwrite) {
      return Status::InvalidArgument(
          clean, ": already exists (replace it with --overwrite; in Python, overwrite=True)");
    }
    if (!IsArchiveDirectory(clean)) {
      return Status::InvalidArgument(clean,
                                     ": exists and is not a shardfeed archive; --overwrite "
                                     "replaces only an archive, so it is left as it is");
    }
    SF_RETURN_IF_ERROR(CheckOnlyOurs(clean));
    for (const std::string& p : options.protect) {
      if (Within(resolved, Resolved(p))) {
        return Status::InvalidArgument(clean, ": lies inside the source (", p,
                                       "); --overwrite never deletes anything there");
      }
    }
  }
  const std::string partial = clean + ".partial";
  if (::mkdir(partial.c_str(), 0755) != 0) {
    return Status::IOError(partial, ": ", std::strerror(errno));
  }
  w->partial_path_ = partial;  // ours from here on: removed unless Finish() succeeds
  {
    std::ofstream marker(fs::path(partial) / kPartialMarker);
    marker << "a shardfeed archive being written; removed when it is complete\n";
    if (!marker) return Status::IOError(partial, ": cannot write ", kPartialMarker);
  }
  if (Hdf5ImagesMode(options)) {
    w->options_.chunk_bytes = 1;  // one record per chunk: each is a row of /images
    // and the var blobs (when the schema has variable fields) go to the var stream /shardfeed/var
    w->var_separate_ = options.schema.has_var_fields();
  }
  SF_RETURN_IF_ERROR(w->OpenShard());
  return w;
}

Status ArchiveWriter::Recover() {
  const std::string old = path_ + ".old", partial = path_ + ".partial";
  // <path>.old is touched only when it carries the marker this program wrote into it before
  // moving it aside (kReplacedMarker); a user's own backup of that name is never ours.
  const std::string moved = Exists(old) ? ReplacedMarkerOf(old) : "";
  if (!moved.empty()) {
    if (!Exists(path_)) {
      // A writer died between moving the old archive aside and moving the new one in.
      if (::rename(old.c_str(), path_.c_str()) != 0) {
        return Status::IOError(old, ": cannot restore it to ", path_, ": ", std::strerror(errno));
      }
      ::unlink((fs::path(path_) / kReplacedMarker).c_str());
    } else if (Identity(path_) == moved) {
      // It died after the new archive was in place: the old one is what it was replacing.
      std::error_code ec;
      fs::remove_all(old, ec);
      if (ec) return Status::IOError(old, ": cannot remove: ", ec.message());
    } else {
      return Status::InvalidArgument(old, ": left by an interrupted overwrite, but ", path_,
                                     " is not the archive that replaced it; move one of them "
                                     "away");
    }
  }
  if (Exists(partial)) {
    if (!IsOurPartial(partial)) {
      return Status::InvalidArgument(partial,
                                     ": exists and is not a shardfeed partial archive; move it "
                                     "away");
    }
    std::error_code ec;
    fs::remove_all(partial, ec);
    if (ec) return Status::IOError(partial, ": cannot remove stale partial output: ", ec.message());
  }
  return Status::OK();
}

ArchiveWriter::~ArchiveWriter() {
  sink_.reset();
  if (lock_fd_ < 0) return;  // never held the lock: nothing here is ours
  if (!finished_ && !partial_path_.empty()) {
    std::error_code ec;
    fs::remove_all(partial_path_, ec);
  }
  // The lock file is removed while still holding it, whoever created it: one left by a killed
  // writer (flock died with it) goes with the next writer that finishes. Only if it is still the
  // file this writer locked; a writer that opened it meanwhile re-checks the inode (TakeLock).
  const std::string lock_file = path_ + ".lock";
  struct stat held, now;
  if (::fstat(lock_fd_, &held) == 0 && ::lstat(lock_file.c_str(), &now) == 0 &&
      held.st_ino == now.st_ino && held.st_dev == now.st_dev) {
    ::unlink(lock_file.c_str());
  }
  ::close(lock_fd_);
  if (!finished_) RemoveEmptyFolders(made_parents_);
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
  columns_.assign(FixedColumns(options_.schema), {});
  var_entries_.clear();
  var_stream_.clear();
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
  const Schema& schema = options_.schema;
  if (schema.size() != 1 + (schema.label_field() >= 0)) {
    return Status::InvalidArgument("the schema has fields besides the image and label (",
                                   schema.ToJson(), "): append their values too");
  }
  SF_RETURN_IF_ERROR(CheckRecord(entry, size));
  return Place(entry, data, size, /*with_blob=*/false);
}

Status ArchiveWriter::Append(IndexEntry entry, const uint8_t* data, size_t size,
                             const FieldValues& values) {
  const Schema& schema = options_.schema;
  SF_RETURN_IF_ERROR(CheckRecord(entry, size));
  if (values.size() != schema.size()) {
    return Status::InvalidArgument(values.size(), " field values for a schema of ", schema.size(),
                                   " fields");
  }
  // Every value first: nothing of the sample is written unless all of them are good.
  for (size_t f = 0; f < schema.size(); ++f) {
    const FieldSpec& spec = schema.fields()[f];
    if (static_cast<int>(f) == schema.image_field() || static_cast<int>(f) == schema.label_field())
      continue;
    int64_t box_rows = -1;
    if (!spec.per.empty()) {
      const FieldValue& boxes = values[schema.Find(spec.per)];  // checked before (declared so)
      box_rows = boxes.ndim > 0 ? boxes.dims[0] : -1;
    }
    ValueChecks checks;
    checks.inverted_boxes_ok = options_.inverted_boxes_ok;
    SF_RETURN_IF_ERROR(CheckValue(spec, values[f], entry.height, entry.width, box_rows, checks));
  }
  blob_.clear();
  if (schema.has_var_fields()) {
    SF_RETURN_IF_ERROR(EncodeVarBlob(schema, values, options_.zstd_level, &blob_));
  }
  SF_RETURN_IF_ERROR(Place(entry, data, size, schema.has_var_fields()));
  size_t column = 0;
  for (size_t f = 0; f < schema.size(); ++f) {
    if (!IsColumn(schema, f)) continue;
    const auto* v = static_cast<const uint8_t*>(values[f].data);
    std::vector<uint8_t>& out = columns_[column++];
    out.insert(out.end(), v, v + schema.fields()[f].item_bytes());
  }
  return Status::OK();
}

Status ArchiveWriter::CheckRecord(const IndexEntry& entry, size_t size) const {
  if (finished_) return Status::InvalidArgument("Append after Finish");
  if (options_.schema.label_field() < 0 && entry.label != 0) {
    return Status::InvalidArgument("label ", entry.label,
                                   " given, but the schema has no class field (label): 0 expected");
  }
  if (size > (uint64_t{1} << 31))
    return Status::InvalidArgument("record of ", size, " bytes is too large");
  if (entry.label < 0) return Status::InvalidArgument("negative label ", entry.label);
  if (entry.height == 0 || entry.width == 0) {
    return Status::InvalidArgument("record of ", entry.width, "x", entry.height,
                                   " pixels: images have at least one pixel");
  }
  if (options_.encoding == Encoding::kAuto ? !IsRecordEncoding(entry.encoding)
                                           : entry.encoding != uint8_t(options_.encoding)) {
    Encoding got;
    const bool known = IsRecordEncoding(entry.encoding);
    if (known) got = static_cast<Encoding>(entry.encoding);
    return Status::InvalidArgument(
        "record of encoding ",
        known ? std::string(EncodingName(got)) : std::to_string(entry.encoding),
        " appended to an archive of encoding ", EncodingName(options_.encoding));
  }
  return Status::OK();
}

// The record, then (version 4, when the schema has variable fields) zero padding to a multiple
// of 8 and the var blob, in the same chunk: the pair is one unit for the chunk and shard rules.
// HDF5 /images shards (var_separate_): the blob goes to the var stream instead, at its next
// multiple of 8, and a shard closes before its var stream would pass 4 GiB (u32 offsets).
Status ArchiveWriter::Place(IndexEntry& entry, const uint8_t* data, size_t size, bool with_blob) {
  const uint64_t extra = with_blob ? 7 + blob_.size() : 0;  // padding at most 7
  const uint64_t in_chunk = var_separate_ ? 0 : extra;
  constexpr uint64_t kMaxOffset = (uint64_t{1} << 32) - 1;
  if ((options_.shard_bytes && shard_payload_ > 0 &&
       shard_payload_ + size + extra > options_.shard_bytes) ||
      (var_separate_ && with_blob && !index_.empty() && var_stream_.size() + extra > kMaxOffset)) {
    SF_RETURN_IF_ERROR(CloseShard());
    SF_RETURN_IF_ERROR(OpenShard());
  }
  if (!chunk_.empty() && chunk_.size() + size + in_chunk > options_.chunk_bytes) {
    SF_RETURN_IF_ERROR(FlushChunk());
  }
  if (chunk_.size() + size + in_chunk > kMaxOffset || (var_separate_ && extra > kMaxOffset)) {
    return Status::InvalidArgument("a sample of ", size + extra, " bytes is too large");
  }
  NoteShape(UprightHeight(entry), UprightWidth(entry));
  entry.checksum = RecordChecksum(data, size);
  entry.chunk = chunk_count_;
  entry.offset = static_cast<uint32_t>(chunk_.size());
  entry.size = static_cast<uint32_t>(size);
  chunk_.insert(chunk_.end(), data, data + size);
  index_.push_back(entry);
  if (with_blob) {
    std::vector<uint8_t>& out = var_separate_ ? var_stream_ : chunk_;
    out.resize((out.size() + 7) & ~size_t{7}, 0);
    VarEntry v{};
    v.checksum = RecordChecksum(blob_.data(), blob_.size());
    v.chunk = var_separate_ ? 0 : chunk_count_;
    v.offset = static_cast<uint32_t>(out.size());
    v.size = static_cast<uint32_t>(blob_.size());
    out.insert(out.end(), blob_.begin(), blob_.end());
    var_entries_.push_back(v);
    bytes_ += blob_.size();
    shard_payload_ += blob_.size();
  }
  if (options_.schema.label_field() >= 0) {
    if (static_cast<size_t>(entry.label) >= class_counts_.size())
      class_counts_.resize(entry.label + 1);
    ++class_counts_[entry.label];
  }
  ++samples_;
  bytes_ += size;
  shard_payload_ += size;
  return Status::OK();
}

void ArchiveWriter::NoteShape(uint32_t height, uint32_t width) {
  if (height == 0 || width == 0) variable_ = true;
  if (samples_ == 0 && shape_h_ == 0 && !variable_) {
    shape_h_ = height;
    shape_w_ = width;
  } else if (height != shape_h_ || width != shape_w_) {
    variable_ = true;
  }
}

Status ArchiveWriter::NextShard() {
  if (index_.empty()) return Status::OK();
  SF_RETURN_IF_ERROR(CloseShard());
  return OpenShard();
}

Status ArchiveWriter::LinkShard(const std::string& file, const ShardInfo& source,
                                uint32_t source_number, const std::vector<uint64_t>& counts,
                                bool* copied, uint32_t height, uint32_t width) {
  if (finished_) return Status::InvalidArgument("LinkShard after Finish");
  if (!index_.empty()) return Status::InvalidArgument("LinkShard needs an empty current shard");
  // Drop the empty shard opened for appending; the linked file takes its number.
  const std::string name = ShardFileName(options_.backend, shards_.size());
  const std::string dst = (fs::path(partial_path_) / name).string();
  sink_.reset();
  ::unlink(dst.c_str());
  bool was_copied = false;
  if (::link(file.c_str(), dst.c_str()) != 0) {
    if (errno != EXDEV && errno != EPERM) {
      return Status::IOError(file, ": cannot link into ", dst, ": ", std::strerror(errno));
    }
    SF_RETURN_IF_ERROR(CopyFileData(file, dst));
    was_copied = true;
  }
  if (copied) *copied = was_copied;
  ShardInfo info = source;
  info.file = name;
  info.first_sample = samples_;
  info.header_override = true;
  info.header_number = source.header_override ? source.header_number : source_number;
  info.header_first_sample =
      source.header_override ? source.header_first_sample : source.first_sample;
  if (info.header_number == shards_.size() && info.header_first_sample == samples_) {
    info.header_override = false;  // the header already says where it is
  }
  if (source.sample_count > 0) NoteShape(height, width);
  shards_.push_back(info);
  linked_.push_back(true);
  samples_ += source.sample_count;
  bytes_ += source.payload_bytes;
  if (options_.schema.label_field() >= 0) {
    if (counts.size() > class_counts_.size()) class_counts_.resize(counts.size());
    for (size_t c = 0; c < counts.size(); ++c) class_counts_[c] += counts[c];
  }
  return OpenShard();
}

Status ArchiveWriter::CloseShard() {
  SF_RETURN_IF_ERROR(FlushChunk());
  if (var_separate_) {  // the content hash streams the chunks, then the var stream
    SF_RETURN_IF_ERROR(sink_->PutVarStream(var_stream_.data(), var_stream_.size()));
    XXH3_64bits_update(hash_->state, var_stream_.data(), var_stream_.size());
  }
  ShardHeader h{};
  std::memcpy(h.magic, kShardMagic, sizeof(h.magic));
  h.format_version = kFormatVersion;
  h.shard_number = static_cast<uint32_t>(shards_.size());
  h.first_sample = shard_first_;
  h.sample_count = index_.size();
  h.chunk_count = chunk_count_;
  h.index_checksum = XXH3_64bits(index_.data(), index_.size() * sizeof(IndexEntry));
  XXH3_64bits_update(hash_->state, index_.data(), index_.size() * sizeof(IndexEntry));
  // The fields table: each fixed column padded to 8 bytes, then the var entries.
  std::vector<uint8_t> table;
  for (const auto& column : columns_) {
    table.insert(table.end(), column.begin(), column.end());
    table.resize((table.size() + 7) & ~size_t{7}, 0);
  }
  const auto* var = reinterpret_cast<const uint8_t*>(var_entries_.data());
  table.insert(table.end(), var, var + var_entries_.size() * sizeof(VarEntry));
  if (table.size() != options_.schema.TableSize(index_.size())) {
    return Status::Internal("fields table of ", table.size(), " bytes, the schema needs ",
                            options_.schema.TableSize(index_.size()));
  }
  if (!table.empty()) {
    h.fields_checksum = XXH3_64bits(table.data(), table.size());
    XXH3_64bits_update(hash_->state, table.data(), table.size());
  }
  h.content_hash = XXH3_64bits_digest(hash_->state);
  SF_RETURN_IF_ERROR(sink_->Finish(h, index_.data(), index_.size(), table.data(), table.size()));
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
  linked_.push_back(false);
  index_.clear();
  index_.shrink_to_fit();
  columns_.clear();
  var_entries_.clear();
  var_entries_.shrink_to_fit();
  var_stream_.clear();
  var_stream_.shrink_to_fit();
  return Status::OK();
}

Status ArchiveWriter::MeasureShardFiles(Manifest* manifest) {
  for (ShardInfo& info : manifest->shards) {
    const std::string file = (fs::path(partial_path_) / info.file).string();
    std::error_code ec;
    const uint64_t bytes = fs::file_size(file, ec);
    if (ec) return Status::IOError(file, ": cannot read its size: ", ec.message());
    info.file_bytes = bytes;
  }
  shards_ = manifest->shards;
  return Status::OK();
}

// long: the commit sequence (shard, manifest, sync, swap in) reads in the order it happens.
Status ArchiveWriter::Finish(Manifest manifest) {
  if (finished_) return Status::InvalidArgument("Finish called twice");
  if (index_.empty() && !shards_.empty()) {
    // Nothing was appended after the last shard (linked ones, or NextShard): no empty shard.
    sink_.reset();
    ::unlink((fs::path(partial_path_) / ShardFileName(options_.backend, shards_.size())).c_str());
  } else {
    SF_RETURN_IF_ERROR(CloseShard());
  }
  manifest.format_version = kFormatVersion;
  manifest.backend = options_.backend;
  manifest.schema = options_.schema;  // what every shard was written with
  manifest.sample_count = samples_;
  manifest.shards = shards_;
  if (manifest.created_at.empty()) manifest.created_at = NowUtc();
  if (manifest.height == 0 && samples_ > 0 && !variable_) {
    manifest.height = shape_h_;
    manifest.width = shape_w_;
    manifest.channels = 3;
  }
  if (options_.schema.label_field() >= 0) {
    class_counts_.resize(std::max(class_counts_.size(), manifest.class_names.size()));
  }
  manifest.class_counts = class_counts_;  // none without a class field
  if (class_counts_.size() > manifest.class_names.size()) {
    return Status::InvalidArgument("a record has label ", class_counts_.size() - 1, " but only ",
                                   manifest.class_names.size(), " class names were given");
  }
  SF_RETURN_IF_ERROR(CheckClassNames(manifest.class_names));
  std::string manifest_text = manifest.ToJson();
  if (options_.backend == Backend::kHdf5) {
    for (size_t s = 0; s < shards_.size(); ++s) {
      if (linked_[s]) continue;  // shared with its part (hard link): keeps the part's manifest
      SF_RETURN_IF_ERROR(
          AnnotateHdf5Shard((fs::path(partial_path_) / shards_[s].file).string(), manifest_text));
    }
    // The attribute grew each file: manifest.json gives the sizes as they are now (a remote read
    // fetches exactly file_bytes). The copy inside each shard keeps the sizes from before its
    // own annotation (FORMAT.md, "HDF5 shards").
    SF_RETURN_IF_ERROR(MeasureShardFiles(&manifest));
    manifest_text = manifest.ToJson();
  }
  std::string manifest_file = (fs::path(partial_path_) / kManifestFileName).string();
  {
    errno = 0;
    std::ofstream out(manifest_file, std::ios::binary | std::ios::trunc);
    out << manifest_text;
    out.flush();
    if (!out) {
      return Status::IOError(manifest_file, ": write failed",
                             errno ? ": " + SystemError(errno) : std::string());
    }
  }
  SF_RETURN_IF_ERROR(SyncPath(manifest_file, false));
  SF_RETURN_IF_ERROR(SyncPath(partial_path_, true));
  // The partial marker stays until the swap is done (ours until then, see IsOurPartial).
  const std::string marker_after = (fs::path(path_) / kPartialMarker).string();

  const std::string parent = ParentOf(path_);
  if (!Exists(path_)) {
    // RENAME_NOREPLACE: a directory that appeared at the path meanwhile is never replaced.
    if (Rename2(partial_path_, path_, RENAME_NOREPLACE) != 0) {
      const int err = errno;
      if (!FlagsUnsupported(err) || ::rename(partial_path_.c_str(), path_.c_str()) != 0) {
        return Status::IOError(path_, ": cannot rename ", partial_path_,
                               " into place: ", std::strerror(FlagsUnsupported(err) ? errno : err));
      }
    }
    finished_ = true;
    ::unlink(marker_after.c_str());
    return SyncPath(parent, true);
  }
  // Replace (Create checked --overwrite and that this is an archive; check again, it may have
  // changed since): exchange, so the path is the old or the new archive at every instant.
  if (!IsArchiveDirectory(path_)) {
    return Status::InvalidArgument(path_, ": is no longer a shardfeed archive; not replacing it");
  }
  SF_RETURN_IF_ERROR(CheckOnlyOurs(path_));  // nothing of the user's put there meanwhile
  if (Rename2(partial_path_, path_, RENAME_EXCHANGE) == 0) {
    finished_ = true;  // partial_path_ now holds the old archive
    ::unlink(marker_after.c_str());
    SF_RETURN_IF_ERROR(SyncPath(parent, true));
    std::error_code ec;
    fs::remove_all(partial_path_, ec);
    return Status::OK();
  }
  if (!FlagsUnsupported(errno)) {
    return Status::IOError(path_, ": cannot swap in the new archive: ", std::strerror(errno));
  }
  // No RENAME_EXCHANGE here: old aside, new in. A crash in between leaves <path>.old, which the
  // next writer restores (Recover).
  const std::string old = path_ + ".old";
  if (Exists(old)) {
    return Status::InvalidArgument(old, ": exists (not ours); move it away so that ", path_,
                                   " can be replaced");
  }
  const std::string replaced = (fs::path(path_) / kReplacedMarker).string();
  {
    std::ofstream marker(replaced, std::ios::trunc);
    marker << Identity(partial_path_) << "\n";
    marker.flush();
    if (!marker) return Status::IOError(replaced, ": cannot write");
  }
  SF_RETURN_IF_ERROR(SyncPath(replaced, false));
  if (::rename(path_.c_str(), old.c_str()) != 0) {
    const int err = errno;
    ::unlink(replaced.c_str());
    return Status::IOError(path_, ": cannot move the previous archive aside: ", std::strerror(err));
  }
  if (::rename(partial_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    if (::rename(old.c_str(), path_.c_str()) == 0) ::unlink(replaced.c_str());  // put it back
    return Status::IOError(path_, ": cannot rename ", partial_path_,
                           " into place: ", std::strerror(err));
  }
  ::unlink(marker_after.c_str());
  finished_ = true;
  SF_RETURN_IF_ERROR(SyncPath(parent, true));
  std::error_code ec;
  fs::remove_all(old, ec);
  return Status::OK();
}

}  // namespace shardfeed::format
