// pack, merge and convert with an s3:// OUT: built in a local staging folder, then uploaded
// (storage/upload.h: shards first, manifest last). See cli_internal.h, StagedOut.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "cli_internal.h"
#include "shardfeed/format/manifest.h"
#include "shardfeed/storage/remote.h"
#include "shardfeed/storage/upload.h"

namespace shardfeed::cli {

namespace fs = std::filesystem;

namespace {

// The last component of s3://bucket/a/b ("b"; the bucket when there is no prefix).
std::string LastComponent(std::string location) {
  while (location.size() > 5 && location.back() == '/') location.pop_back();
  const size_t slash = location.find_last_of('/');
  std::string name = location.substr(slash + 1);
  return name.empty() ? "archive" : name;
}

// Whether `name` has the shape of a shard file a writer names (shard-NNNNN.mdb or .h5).
bool ShardFileShape(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (name.rfind("shard-", 0) != 0 || dot == std::string::npos || dot <= 6) return false;
  const std::string digits = name.substr(6, dot - 6), ext = name.substr(dot);
  return digits.find_first_not_of("0123456789") == std::string::npos &&
         (ext == ".mdb" || ext == ".h5");
}

// The shard files the archive now at `location` names (none when it has no manifest). Only a
// manifest that is provably a shardfeed archive's (it parses and checks as one, checksum
// included) names files to remove, and only names of a shard file's shape: --overwrite never
// deletes an object a foreign or edited manifest.json names.
Status OldFiles(const std::string& location, std::vector<std::string>* files) {
  SF_ASSIGN_OR_RETURN(auto remote, storage::Remote::Open(location));
  Result<std::string> text = remote->ReadText("manifest.json", format::kMaxManifestBytes);
  if (!text.ok() && text.status().code() == StatusCode::kNotFound) return Status::OK();
  if (!text.ok()) return text.status();
  SF_ASSIGN_OR_RETURN(const format::Manifest m,
                      format::Manifest::FromJson(*text, location + "/manifest.json"));
  for (const format::ShardInfo& s : m.shards) {
    if (ShardFileShape(s.file)) files->push_back(s.file);
  }
  return Status::OK();
}

std::atomic<int> g_signal{0};  // SIGINT/SIGTERM caught during the upload

void OnInterrupt(int sig) {
  g_signal.store(sig);
  storage::CancelUploads();  // one atomic store
}

// SIGINT and SIGTERM stop the upload (storage::CancelUploads) instead of killing the process
// in the middle of it, for the life of this object; the old handlers come back after.
class InterruptUploads {
 public:
  InterruptUploads() {
    struct sigaction sa {};
    sa.sa_handler = OnInterrupt;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~InterruptUploads() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  InterruptUploads(const InterruptUploads&) = delete;
  InterruptUploads& operator=(const InterruptUploads&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

}  // namespace

Result<StagedOut> StagedOut::Prepare(const std::string& out, const std::string& staging,
                                     bool overwrite) {
  StagedOut s;
  s.out_ = out;
  if (!storage::IsRemote(out)) {
    if (!staging.empty()) {
      return Status::InvalidArgument("--staging goes with an s3:// OUT (", out, " is local)");
    }
    s.path_ = out;
    return s;
  }
  SF_RETURN_IF_ERROR(storage::CheckWritable(out));
  s.overwrite_ = overwrite;
  // Refused before any work: a reader of OUT must never lose its archive by accident.
  SF_ASSIGN_OR_RETURN(bool exists, storage::RemoteHas(out, "manifest.json", overwrite));
  if (exists && !overwrite) {
    return Status::InvalidArgument(out,
                                   "/manifest.json: already exists (pass --overwrite to "
                                   "replace it)");
  }
  if (exists) {  // --overwrite replaces only an archive, as it does locally
    SF_ASSIGN_OR_RETURN(auto remote, storage::Remote::Open(out));
    Result<std::string> text = remote->ReadText("manifest.json", format::kMaxManifestBytes);
    if (text.ok() && !format::IsShardfeedManifest(*text)) {
      return Status::InvalidArgument(
          out,
          "/manifest.json: not a shardfeed archive's manifest; --overwrite replaces only an "
          "archive, so the prefix is left as it is");
    }
  }
  if (!overwrite) {  // no manifest: objects there are not provably an archive of ours
    SF_ASSIGN_OR_RETURN(const std::string key, storage::RemoteFirstObject(out));
    if (!key.empty()) {
      return Status::InvalidArgument(
          out, " holds objects but no manifest (", key,
          " is one): its shards would replace same-named ones there. Pass --overwrite to "
          "write into it anyway (an upload stopped before its manifest leaves such a prefix), "
          "or choose an empty prefix");
    }
  }
  std::string root = staging;
  if (root.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/shardfeed-staging-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      return Status::IOError(pattern, ": cannot make a staging folder (", std::strerror(errno),
                             "); pass --staging DIR");
    }
    root = pattern;
    s.made_root_ = true;
  } else {
    std::error_code ec;
    fs::create_directories(root, ec);
    if (ec) return Status::IOError(root, ": cannot make the staging folder: ", ec.message());
  }
  s.root_ = root;
  s.path_ = (fs::path(root) / LastComponent(out)).string();
  return s;
}

// The replaced archive's shards (--overwrite) that the new build does not overwrite, and their
// ETags now. An old manifest that cannot be read (403 without s3:ListBucket when there is none),
// or that changed while its shards' ETags were read (another job writing the prefix may have
// written under a listed name, an object then taken for the old), leaves them all in place,
// with a warning: `files` empty.
void StagedOut::ReplacedShards(std::vector<std::string>* files,
                               std::vector<std::string>* etags) const {
  const std::vector<std::string> manifest = {"manifest.json"};
  Result<std::vector<std::string>> before = storage::RemoteEtags(out_, manifest);
  Status old = before.status();
  if (old.ok()) old = OldFiles(out_, files);
  std::error_code ec;
  files->erase(
      std::remove_if(files->begin(), files->end(),
                     [&](const std::string& f) { return fs::exists(fs::path(path_) / f, ec); }),
      files->end());
  if (old.ok()) {
    Result<std::vector<std::string>> got = storage::RemoteEtags(out_, *files);
    if (got.ok()) *etags = std::move(*got);
    old = got.status();
  }
  if (old.ok()) {
    Result<std::vector<std::string>> after = storage::RemoteEtags(out_, manifest);
    old = after.status();
    if (old.ok() && *after != *before) {
      old = Status::Changed(out_, "/manifest.json changed while its shards were read");
    }
  }
  if (!old.ok()) {
    std::fprintf(stderr,
                 "shardfeed: warning: cannot read the archive being replaced (%s); shards of it "
                 "that the new archive does not overwrite stay at %s\n",
                 old.message().c_str(), out_.c_str());
    files->clear();
  }
}

// The replaced archive's shards `files` (their ETags before the upload in `etags`) removed where
// they are still those objects, then the new manifest (ETag `manifest_etag`) checked to be still
// this command's: a job that wrote this prefix meanwhile may have had an object removed.
Status StagedOut::RemoveReplaced(const std::vector<std::string>& files,
                                 const std::vector<std::string>& etags,
                                 const std::string& manifest_etag) const {
  size_t kept = 0;
  for (size_t i = 0; i < files.size() && i < etags.size(); ++i) {
    Result<bool> gone = storage::RemoteDeleteIfUnchanged(out_, files[i], etags[i]);
    if (!gone.ok()) {
      std::fprintf(stderr, "shardfeed: warning: cannot remove %s/%s of the replaced archive: %s\n",
                   out_.c_str(), files[i].c_str(), gone.status().message().c_str());
    }
    kept += !(gone.ok() && *gone);
  }
  if (kept > 0) {
    std::fprintf(stderr,
                 "shardfeed: warning: %zu name(s) of the replaced archive not removed from %s: "
                 "changed since the upload began, gone, or not readable to compare\n",
                 kept, out_.c_str());
  }
  // Whenever a DELETE may have been sent (one that failed after its retries may still have been
  // carried out), the manifest is checked once more.
  if (files.empty()) return Status::OK();
  return storage::RemoteUnchanged(out_, "manifest.json", manifest_etag)
      .WithContext("after removing the replaced archive's shards");
}

Status StagedOut::Finish(const Status& built) const {
  if (root_.empty()) return built;  // a local OUT
  Status st = built;
  // The replaced archive's shards (--overwrite) that the new one will not overwrite, and their
  // ETags now: removed after the upload only while still those objects (another job may write
  // the same names meanwhile).
  std::vector<std::string> old_files, old_etags;
  if (st.ok() && overwrite_) ReplacedShards(&old_files, &old_etags);
  storage::UploadResult uploaded;
  if (st.ok()) {
    storage::UploadOptions o;
    o.overwrite = overwrite_;
    InterruptUploads interrupt;
    st = storage::UploadArchive(path_, out_, "manifest.json", o, &uploaded);
  }
  const int sig = g_signal.load();
  if (st.ok() && sig != 0 && !old_files.empty()) {  // interrupted as the upload ended
    std::fprintf(stderr,
                 "shardfeed: warning: interrupted: shards of the replaced archive that the new "
                 "one does not overwrite stay at %s\n",
                 out_.c_str());
  } else if (st.ok()) {
    st = RemoveReplaced(old_files, old_etags, uploaded.last_etag);
  }
  if (!st.ok()) {
    std::error_code ec;
    if (!fs::exists(path_, ec)) {  // nothing was built: nothing to keep
      if (made_root_) fs::remove_all(root_, ec);
      return st;
    }
    if (uploaded.published && !uploaded.landed) {
      std::fprintf(stderr,
                   "shardfeed: %s: %s while its manifest was on its way: the store may have "
                   "written it (run shardfeed verify on it); the local build is kept in %s\n",
                   out_.c_str(), sig != 0 ? "interrupted" : "failed", path_.c_str());
    } else if (uploaded.published) {
      std::fprintf(stderr,
                   "shardfeed: %s: this command's manifest went up, but the archive there may "
                   "mix its objects with another writer's (run shardfeed verify on it); the local "
                   "build is kept in %s\n",
                   out_.c_str(), path_.c_str());
    } else if (st.code() == StatusCode::kChanged) {
      std::fprintf(stderr,
                   "shardfeed: %s: this command's manifest was not written; the local build is "
                   "kept in %s\n",
                   out_.c_str(), path_.c_str());
    } else {
      std::fprintf(stderr,
                   "shardfeed: %s was not written (no manifest there); the local build is kept "
                   "in %s\n",
                   out_.c_str(), path_.c_str());
    }
    if (sig != 0) {
      // Interrupted: the multipart uploads begun were aborted; end as the signal would have.
      std::fprintf(stderr, "shardfeed: interrupted (%s) while uploading\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM");
      std::fflush(stderr);
      ::signal(sig, SIG_DFL);
      ::raise(sig);
    }
    return st;
  }
  // Uploaded: the local copy is ours (made by this command) and no longer needed.
  std::error_code ec;
  fs::remove_all(made_root_ ? fs::path(root_) : fs::path(path_), ec);
  if (ec) {
    std::fprintf(stderr, "shardfeed: warning: cannot remove the staging copy %s: %s\n",
                 path_.c_str(), ec.message().c_str());
  }
  return st;
}

}  // namespace shardfeed::cli
