#include "shardfeed/validate/extract.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "sample_context.h"
#include "shardfeed/codec/codec.h"

namespace shardfeed::validate {
namespace {

namespace fs = std::filesystem;

// Class names come from folder names or list labels; keep them usable as one path component.
std::string SafeComponent(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    if (c == '/' || c == 0) c = '_';
  }
  if (out.empty() || out == "." || out == "..") out = "_" + out;
  return out;
}

// A folder this process made (mkdtemp: a fresh name, never an existing one), removed on every
// path that does not rename it into place.
class OwnTempDir {
 public:
  static Result<OwnTempDir> Create(const std::string& beside) {
    std::string tmpl = beside + ".extracting-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back(0);
    if (::mkdtemp(buf.data()) == nullptr) {
      return Status::IOError(tmpl, ": cannot create a temporary folder: ", std::strerror(errno));
    }
    OwnTempDir d;
    d.path_ = buf.data();
    return d;
  }
  OwnTempDir() = default;
  OwnTempDir(OwnTempDir&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }
  OwnTempDir& operator=(OwnTempDir&&) = delete;
  ~OwnTempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  // Moves the folder to `dir` (absent, or an empty directory: rename() replaces only an empty
  // one, so nothing of the user's can be lost even if it filled up meanwhile).
  Status MoveTo(const std::string& dir) {
    if (::rename(path_.c_str(), dir.c_str()) != 0) {
      const int err = errno;
      if (err == ENOTEMPTY || err == EEXIST) {
        return Status::InvalidArgument(dir,
                                       ": is no longer empty; the extracted files were not "
                                       "moved there");
      }
      return Status::IOError(dir, ": ", std::strerror(err));
    }
    path_.clear();
    return Status::OK();
  }

 private:
  std::string path_;
};

}  // namespace

Status WriteNewFile(const std::string& path, const uint8_t* data, size_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EEXIST) {
    return Status::InvalidArgument(path,
                                   ": exists; shardfeed writes only new files here "
                                   "(remove it or choose another name)");
  }
  if (fd < 0) return Status::IOError(path, ": ", std::strerror(errno));
  size_t off = 0;
  while (off < size) {
    ssize_t n = ::write(fd, data + off, size - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return Status::IOError(path, ": ", std::strerror(err));
    }
    off += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return Status::IOError(path, ": ", std::strerror(errno));
  return Status::OK();
}

Result<uint64_t> Extract(const format::Archive& archive, const std::string& dir,
                         const ExtractOptions& options) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec))) {
    return Status::InvalidArgument(dir, ": exists and is not an empty directory");
  }
  std::string target = fs::path(dir).lexically_normal().string();
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  SF_ASSIGN_OR_RETURN(OwnTempDir tmp, OwnTempDir::Create(target));
  const format::Manifest& m = archive.manifest();
  for (const std::string& name : m.class_names) {
    fs::create_directories(fs::path(tmp.path()) / SafeComponent(name), ec);
    if (ec) return Status::IOError(tmp.path(), "/", name, ": ", ec.message());
  }
  codec::Context ctx;
  std::vector<uint8_t> file;
  const int digits = std::max<int>(8, static_cast<int>(std::to_string(archive.size()).size()));
  for (uint64_t i = 0; i < archive.size(); ++i) {
    auto extract_one = [&]() -> Status {
      SF_ASSIGN_OR_RETURN(const format::RecordView r, archive.At(i));
      SF_RETURN_IF_ERROR(archive.VerifyRecord(i));
      const format::IndexEntry& e = *r.entry;
      // Before anything is decompressed: a crafted record cannot make extract allocate more
      // than verify --decode or the loader would.
      SF_RETURN_IF_ERROR(format::CheckPixelLimit(e, options.max_pixels));
      SF_ASSIGN_OR_RETURN(const codec::Codec* c, codec::CodecFor(e));
      std::string name = std::to_string(i);
      name = std::string(static_cast<size_t>(std::max<int>(0, digits - int(name.size()))), '0') +
             name + c->file_extension();
      SF_RETURN_IF_ERROR(c->ExtractFile(ctx, r, &file));
      const std::string path =
          (fs::path(tmp.path()) / SafeComponent(m.class_names[e.label]) / name).string();
      return WriteNewFile(path, file.data(), file.size());
    };
    SF_RETURN_IF_ERROR(ForSample(archive.path(), i, extract_one()));
  }
  SF_RETURN_IF_ERROR(tmp.MoveTo(target));
  return archive.size();
}

}  // namespace shardfeed::validate
