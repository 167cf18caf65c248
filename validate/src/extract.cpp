#include "shardfeed/validate/extract.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "fields_io.h"
#include "sample_context.h"
#include "shardfeed/base/file_io.h"
#include "shardfeed/codec/codec.h"
#include "shardfeed/imaging/image.h"

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

constexpr char kExtractingMarker[] = ".shardfeed-extracting";

// The process's umask, read without changing it (umask(2) would, for every thread):
// /proc/self/status's "Umask:" line; 022 where it cannot be read.
mode_t Umask() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Umask:", 0) == 0) {
      char* end = nullptr;
      const unsigned long mask = std::strtoul(line.c_str() + 6, &end, 8);
      if (end != line.c_str() + 6 && mask <= 0777) return static_cast<mode_t>(mask);
    }
  }
  return 022;
}

// Folders "<beside>.extracting-XXXXXX" left by an extract that was killed (Ctrl-C, kill -9, a
// crash): removed when they carry our marker and nobody holds its lock (a running extract holds
// it for its whole life; the kernel releases it with the process). Anything else is left alone.
void RemoveDeadLeftovers(const std::string& beside) {
  const fs::path target(beside);
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = target.filename().string() + ".extracting-";
  std::error_code ec;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() != prefix.size() + 6 || name.compare(0, prefix.size(), prefix) != 0) continue;
    std::error_code entry_ec;  // its own: an entry that vanished must not end the listing
    if (!it->is_directory(entry_ec) || it->is_symlink(entry_ec)) continue;
    // (".new": an extract killed while making its marker, between creating and renaming it.)
    int fd = ::open((it->path() / kExtractingMarker).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      fd = ::open((it->path() / (std::string(kExtractingMarker) + ".new")).c_str(),
                  O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0) continue;  // not ours
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      std::error_code ignored;
      fs::remove_all(it->path(), ignored);
    }
    ::close(fd);
  }
}

// A folder this process made (mkdtemp: a fresh name, never an existing one), removed on every
// path that does not rename it into place. It holds a marker file, locked while this object
// lives, so that a later extract to the same DIR removes it if this process dies first.
class OwnTempDir {
 public:
  static Result<OwnTempDir> Create(const std::string& beside) {
    RemoveDeadLeftovers(beside);
    std::string tmpl = beside + ".extracting-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back(0);
    if (::mkdtemp(buf.data()) == nullptr) {
      return Status::IOError(tmpl, ": cannot create a temporary folder: ", std::strerror(errno));
    }
    OwnTempDir d;
    d.path_ = buf.data();
    // The marker appears under its name already locked (made under another name, locked,
    // renamed): an extract cleaning up leftovers never finds it free while this one lives.
    const std::string marker = d.path_ + "/" + kExtractingMarker;
    const std::string making = marker + ".new";
    d.lock_ = ::open(making.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (d.lock_ < 0 || ::flock(d.lock_, LOCK_EX | LOCK_NB) != 0 ||
        ::rename(making.c_str(), marker.c_str()) != 0) {
      return Status::IOError(marker, ": ", std::strerror(errno));
    }
    return d;
  }
  OwnTempDir() = default;
  OwnTempDir(OwnTempDir&& o) noexcept : path_(std::move(o.path_)), lock_(o.lock_), mode_(o.mode_) {
    o.path_.clear();
    o.lock_ = -1;
  }
  OwnTempDir& operator=(OwnTempDir&&) = delete;
  ~OwnTempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
    if (lock_ >= 0) ::close(lock_);
  }
  const std::string& path() const { return path_; }
  // Gives the folder `like`'s mode, owner and group (as far as this process may: a group it is
  // not in is left as it is), or, without `like`, a new folder's mode: 0777 less the umask.
  // The owner, group and setgid bit now (so what is written inside takes the group, as it
  // would in DIR); the permission bits at MoveTo (a read-only mode would stop the writing).
  void TakeModeOf(const struct stat* like) {
    mode_ = 0777 & ~Umask();
    if (like) {
      if (::chown(path_.c_str(), like->st_uid, like->st_gid) != 0) {
        (void)!::chown(path_.c_str(), static_cast<uid_t>(-1), like->st_gid);
      }
      mode_ = like->st_mode & 07777;
    }
    (void)::chmod(path_.c_str(), (mode_ & 07000) | 0700);
  }
  // Moves the folder to `dir` (absent, or an empty directory: rename() replaces only an empty
  // one, so nothing of the user's can be lost even if it filled up meanwhile), without its
  // marker, with the mode TakeModeOf chose. kIOError if the marker is no longer the one this
  // extract made (the folder was taken for a leftover and removed: its files are incomplete).
  Status MoveTo(const std::string& dir) {
    const std::string marker = path_ + "/" + kExtractingMarker;
    struct stat mine {
    }, named{};
    if (::fstat(lock_, &mine) != 0 || ::lstat(marker.c_str(), &named) != 0 ||
        mine.st_ino != named.st_ino || mine.st_dev != named.st_dev) {
      return Status::IOError(path_, ": removed while the extract ran; nothing was moved to ", dir);
    }
    if (::unlink(marker.c_str()) != 0) return Status::IOError(marker, ": ", std::strerror(errno));
    if (::chmod(path_.c_str(), mode_) != 0) {
      return Status::IOError(path_, ": chmod: ", std::strerror(errno));
    }
    if (::rename(path_.c_str(), dir.c_str()) != 0) {
      const int err = errno;
      (void)::chmod(path_.c_str(), 0700);  // so that it can be removed, whatever mode_ is
      if (err == ENOTEMPTY || err == EEXIST) {
        return Status::InvalidArgument(dir,
                                       ": is no longer empty; the extracted files were not "
                                       "moved there");
      }
      if (err == EBUSY) {
        return Status::IOError(dir,
                               ": busy (a mount point?), so the extracted files could not be "
                               "moved there: give a folder inside it");
      }
      return Status::IOError(dir, ": ", std::strerror(err));
    }
    path_.clear();
    return Status::OK();
  }

 private:
  std::string path_;
  int lock_ = -1;
  mode_t mode_ = 0755;
};

// The `path` field's value as a relative path inside DIR, or "" when it is not one (absolute,
// "..", empty components, NUL): such samples are written under their class instead.
std::string SafeRelative(const std::string& path) {
  if (path.empty() || path[0] == '/' || path.find('\0') != std::string::npos) return "";
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find('/', start), path.size());
    const std::string part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return "";
    start = end + 1;
  }
  return path;
}

bool SameExtension(const std::string& path, const std::string& ext) {
  const size_t dot = path.rfind('.');
  if (dot == std::string::npos || path.find('/', dot) != std::string::npos) return false;
  std::string have = path.substr(dot);
  for (char& c : have) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return have == ext || (ext == ".jpg" && have == ".jpeg");
}

// The files and folders an extract writes, relative to DIR: a name is free when it is no file or
// folder taken yet and no folder above it is a file taken yet.
class Names {
 public:
  explicit Names(bool jsonl) {
    Take(kExtractingMarker);
    if (jsonl) {
      for (const char* ours : {"samples.jsonl", "schema.json", "class_names.json", "masks"}) {
        Take(ours);
      }
    }
  }
  bool Free(const std::string& rel) const {
    if (files_.count(rel) || folders_.count(rel)) return false;
    for (size_t slash = rel.find('/'); slash != std::string::npos; slash = rel.find('/', slash + 1))
      if (files_.count(rel.substr(0, slash))) return false;
    return true;
  }
  bool FreeFolder(const std::string& folder) const { return !files_.count(folder); }
  void Take(const std::string& rel) {
    files_.insert(rel);
    for (size_t slash = rel.find('/'); slash != std::string::npos; slash = rel.find('/', slash + 1))
      folders_.insert(rel.substr(0, slash));
  }

 private:
  std::set<std::string> files_, folders_;
};

// Where sample i's image would go, relative to DIR: its `path` (with the record's extension when
// it was stored in another form) when the schema has one and it is a safe relative path; "" when
// it has none.
std::string SourceName(const format::Archive& archive, uint64_t i, const std::string& ext,
                       int path_field) {
  if (path_field < 0) return "";
  auto v = archive.Field(i, static_cast<size_t>(path_field));
  if (!v.ok()) return "";  // a damaged blob: the record's own check reports it
  std::string rel = SafeRelative(std::string(reinterpret_cast<const char*>(v->data), v->size));
  if (!rel.empty() && !SameExtension(rel, ext)) {
    const size_t dot = rel.rfind('.');
    const size_t slash = rel.rfind('/');
    if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) rel.erase(dot);
    rel += ext;
  }
  return rel;
}

// Whether a sample of a class field's archive has a source path outside its class's folder
// (a list, JSONL or CSV pack: imgs/0.png): its image alone, at that path, would lose its label
// (a folder pack's paths are <class>/<file>, which a re-pack reads the labels from).
// Samples per class: the manifest's class_counts, or (archives written before them) counted
// from the labels.
std::vector<uint64_t> ClassCounts(const format::Archive& archive) {
  const auto& classes = archive.manifest().class_names;
  std::vector<uint64_t> counts = archive.manifest().class_counts;
  if (counts.size() == classes.size() || archive.schema().label_field() < 0) return counts;
  counts.assign(classes.size(), 0);
  for (uint64_t i = 0; i < archive.size(); ++i) {
    const int32_t label = archive.Label(i);
    if (label >= 0 && static_cast<size_t>(label) < counts.size()) ++counts[label];
  }
  return counts;
}

bool LabelsOutsideClassFolders(const format::Archive& archive, int path_field) {
  const auto& classes = archive.manifest().class_names;
  if (archive.schema().label_field() < 0 || classes.empty()) return false;
  // A folder re-pack numbers its folders in sorted order: other class names (an order of
  // --class-names, a name no folder can have) would be renumbered. A class without samples gets
  // its empty folder (EmptyClassFolders), which a folder pack counts as a class, unless hidden
  // (a pack ignores hidden folders).
  const std::vector<uint64_t> counts = ClassCounts(archive);
  for (size_t c = 0; c < classes.size(); ++c) {
    if (SafeComponent(classes[c]) != classes[c] || (c > 0 && !(classes[c - 1] < classes[c])) ||
        (c < counts.size() && counts[c] == 0 && classes[c].front() == '.')) {
      return true;
    }
  }
  if (path_field < 0) return false;
  for (uint64_t i = 0; i < archive.size(); ++i) {
    auto r = archive.At(i);
    if (!r.ok()) continue;  // the record's own check reports it
    const std::string rel = SourceName(archive, i, "", path_field);
    const size_t label = static_cast<size_t>(r->entry->label);
    const std::string folder = label < classes.size() ? SafeComponent(classes[label]) : "";
    if (rel.empty() || rel.rfind(folder + "/", 0) != 0) return true;
  }
  return false;
}

// Every sample's image name, relative to DIR, decided before anything is written: first each
// source name in sample order (a name taken already, or below a file taken already, is left
// out); then the rest in the class layout, <class>/<index><ext>, with -1, -2... added where a
// source name took that name. A source file is never moved off its own name for a fallback.
Result<std::vector<std::string>> ImageNames(const format::Archive& archive, int path_field,
                                            Names* names) {
  const uint64_t n = archive.size();
  std::vector<std::string> out(n), exts(n);
  std::vector<uint64_t> rest;
  for (uint64_t i = 0; i < n; ++i) {
    auto name = [&]() -> Status {
      SF_ASSIGN_OR_RETURN(const format::RecordView r, archive.At(i));
      SF_ASSIGN_OR_RETURN(const codec::Codec* c, codec::CodecFor(*r.entry));
      exts[i] = c->file_extension();
      std::string rel = SourceName(archive, i, exts[i], path_field);
      if (!rel.empty() && names->Free(rel)) {
        names->Take(rel);
        out[i] = std::move(rel);
      } else {
        rest.push_back(i);
      }
      return Status::OK();
    };
    SF_RETURN_IF_ERROR(ForSample(archive.path(), i, name()));
  }
  const int digits = std::max<int>(8, static_cast<int>(std::to_string(n).size()));
  // Class folders only where samples have a class: a COCO archive's class names are its boxes'
  // categories (every fallback went to the first one's folder).
  const auto& classes = archive.schema().label_field() >= 0 ? archive.manifest().class_names
                                                            : std::vector<std::string>();
  for (uint64_t i : rest) {
    SF_ASSIGN_OR_RETURN(const format::RecordView r, archive.At(i));
    std::string folder =
        classes.empty() ? std::string("samples") : SafeComponent(classes[r.entry->label]);
    while (!names->FreeFolder(folder)) folder = "_" + folder;
    std::string number = std::to_string(i);
    number.insert(0, size_t(std::max<int>(0, digits - int(number.size()))), '0');
    std::string rel = folder + "/" + number + exts[i];
    for (int k = 1; !names->Free(rel); ++k) {
      rel = folder + "/" + number + "-" + std::to_string(k) + exts[i];
    }
    names->Take(rel);
    out[i] = std::move(rel);
  }
  return out;
}

// The schema as `pack --schema` takes it (a JSON object, fields in order).
std::string UserSchema(const format::Schema& schema) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& f : schema.fields()) {
    if (f.per.empty()) {
      out[f.name] = f.TypeName();
    } else {
      out[f.name] = {{"type", f.TypeName()}, {"per", f.per}};
    }
  }
  return out.dump(2) + "\n";
}

// What WriteNewFile and CheckNewFile say of a path that is there already.
Status Exists(const std::string& path) {
  return Status::InvalidArgument(path,
                                 ": exists; shardfeed writes only new files here "
                                 "(remove it or choose another name)");
}

// DIR/class_names.json, for `pack --class-names`: samples.jsonl holds class ids, and without
// the names a re-pack named its classes "0".."max" (COCO's categories were lost). None when the
// archive has no class names.
Status WriteClassNames(const format::Archive& archive, const std::string& dir) {
  const auto& classes = archive.manifest().class_names;
  if (classes.empty()) return Status::OK();
  const std::string names =
      nlohmann::json(classes).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  return WriteNewFile((fs::path(dir) / "class_names.json").string(),
                      reinterpret_cast<const uint8_t*>(names.data()), names.size());
}

}  // namespace

Status WriteNewFile(const std::string& path, const uint8_t* data, size_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EEXIST) return Exists(path);
  if (fd < 0) return Status::IOError(path, ": ", std::strerror(errno));
  if (const int err = WriteAll(fd, data, size); err != 0) {
    ::close(fd);
    return Status::IOError(path, ": ", std::strerror(err));
  }
  if (::close(fd) != 0) return Status::IOError(path, ": ", std::strerror(errno));
  return Status::OK();
}

Status CheckNewFile(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) return Exists(path);
  std::string folder = fs::path(path).parent_path().string();
  if (folder.empty()) folder = ".";
  if (::stat(folder.c_str(), &st) != 0) {
    return Status::InvalidArgument(path, ": its folder ", folder, ": ", std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) return Status::InvalidArgument(path, ": ", folder, " is not a folder");
  return Status::OK();
}

namespace {

// DIR as extract may take it (see Extract): its normal form, whether it exists (`existing`: its
// stat), or why not (kInvalidArgument), before any work.
Result<std::string> ExtractTarget(const std::string& dir, bool* exists_out,
                                  struct stat* existing_out) {
  std::error_code ec;
  std::string target = fs::path(dir).lexically_normal().string();
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  if (fs::is_symlink(target, ec)) {
    // The rename at the end would replace the link, not fill the folder it names.
    return Status::InvalidArgument(dir, ": is a symbolic link (to ",
                                   fs::read_symlink(target, ec).string(),
                                   "); give the folder's own path");
  }
  struct stat& existing = *existing_out;
  const bool exists = *exists_out = ::stat(target.c_str(), &existing) == 0;
  if (exists && !(S_ISDIR(existing.st_mode) && fs::is_empty(target, ec))) {
    return Status::InvalidArgument(dir, ": exists and is not an empty directory");
  }
  struct stat above {};
  if (exists && ::stat((fs::path(target) / "..").c_str(), &above) == 0 &&
      (above.st_dev != existing.st_dev || above.st_ino == existing.st_ino)) {
    // The files are renamed into place at the end, which a mount point refuses (EBUSY, after
    // the whole pass): said before any work.
    return Status::InvalidArgument(dir,
                                   ": is a mount point; extract moves a new folder to DIR at the "
                                   "end, which a mount point cannot take: give a folder inside it");
  }
  const fs::path parent =
      fs::path(target).has_parent_path() ? fs::path(target).parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec)) {
    return Status::InvalidArgument(dir, ": its folder ", parent.string(), " does not exist");
  }
  return target;
}

// Not into the archive's own folder, which holds only what shardfeed writes there.
Status CheckOutsideArchive(const format::Archive& archive, const std::string& target,
                           const std::string& dir) {
  if (format::PathInside(target, archive.path())) {
    return Status::InvalidArgument(dir, ": lies inside the archive ", archive.path(),
                                   "; choose a folder outside it");
  }
  return Status::OK();
}

// Where the class folders carry the labels: a class without samples gets its empty folder, so a
// folder pack of DIR numbers the classes as the archive did.
Status EmptyClassFolders(const format::Archive& archive, const std::string& root) {
  std::error_code ec;
  const auto& classes = archive.manifest().class_names;
  const std::vector<uint64_t> counts = ClassCounts(archive);
  for (size_t c = 0; c < classes.size() && c < counts.size(); ++c) {
    const fs::path folder = fs::path(root) / classes[c];
    if (counts[c] == 0 && !fs::exists(folder, ec) && ::mkdir(folder.c_str(), 0777) != 0) {
      return Status::IOError(folder.string(), ": ", std::strerror(errno));
    }
  }
  return Status::OK();
}

}  // namespace

Result<uint64_t> Extract(const format::Archive& archive, const std::string& dir,
                         const ExtractOptions& options) {
  std::error_code ec;
  bool exists = false;
  struct stat existing {};
  SF_ASSIGN_OR_RETURN(const std::string target, ExtractTarget(dir, &exists, &existing));
  SF_RETURN_IF_ERROR(CheckOutsideArchive(archive, target, dir));
  // As convert: what verify checks beyond each record first, so a crafted index verify refuses
  // (two entries for one record) is not written out as files a pack would check afresh.
  SF_RETURN_IF_ERROR(archive.VerifyDerived());
  const format::Schema& schema = archive.schema();
  const int path_field = [&] {
    const int f = schema.Find("path");
    return f >= 0 && schema.fields()[f].kind == format::FieldKind::kStr ? f : -1;
  }();
  // Fields other than image, label and path go to DIR/samples.jsonl (one line per sample, the
  // image's path relative to DIR) beside DIR/schema.json, so `pack DIR/samples.jsonl --schema
  // DIR/schema.json` packs them again. Masks are written as PNG files, DIR/masks/<field>/.
  // So do the labels of images whose paths are not in their class's folder.
  bool jsonl = LabelsOutsideClassFolders(archive, path_field);
  for (size_t f = 0; f < schema.size(); ++f) {
    const int fi = static_cast<int>(f);
    jsonl |= fi != schema.image_field() && fi != schema.label_field() && fi != path_field;
  }
  Names names(jsonl);
  SF_ASSIGN_OR_RETURN(const std::vector<std::string> image_names,
                      ImageNames(archive, path_field, &names));
  SF_ASSIGN_OR_RETURN(OwnTempDir tmp, OwnTempDir::Create(target));
  // The folder DIR becomes gets an existing DIR's mode, owner and group (a group's setgid
  // folder stays one), or a new folder's mode (0777 less the umask) where mkdtemp gave 0700.
  tmp.TakeModeOf(exists ? &existing : nullptr);
  std::string lines;
  codec::Context ctx;
  std::vector<uint8_t> file;
  for (uint64_t i = 0; i < archive.size(); ++i) {
    auto extract_one = [&]() -> Status {
      SF_ASSIGN_OR_RETURN(const format::RecordView r, archive.At(i));
      SF_RETURN_IF_ERROR(archive.VerifyRecord(i));
      const format::IndexEntry& e = *r.entry;
      // Before anything is decompressed: a crafted record cannot make extract allocate more
      // than verify --decode or the loader would.
      SF_RETURN_IF_ERROR(format::CheckPixelLimit(e, options.max_pixels));
      SF_ASSIGN_OR_RETURN(const codec::Codec* c, codec::CodecFor(e));
      const std::string& rel = image_names[i];
      SF_RETURN_IF_ERROR(c->ExtractFile(ctx, r, &file));
      const fs::path path = fs::path(tmp.path()) / rel;
      fs::create_directories(path.parent_path(), ec);
      if (ec) return Status::IOError(path.parent_path().string(), ": ", ec.message());
      SF_RETURN_IF_ERROR(WriteNewFile(path.string(), file.data(), file.size()));
      if (!jsonl) return Status::OK();
      // What pack would refuse from samples.jsonl (text that is not UTF-8, non-finite boxes) is
      // damage, refused as verify --decode reports it, not rewritten or written out.
      SF_RETURN_IF_ERROR(CheckSampleFields(archive, i, options.max_pixels));
      nlohmann::ordered_json line = nlohmann::ordered_json::object();
      auto mask_file = [&](size_t f, const uint8_t* px, uint32_t h,
                           uint32_t w) -> Result<nlohmann::json> {
        imaging::Image mask;
        mask.Resize(w, h, 1);
        std::copy(px, px + size_t{w} * h, mask.pixels.begin());
        SF_ASSIGN_OR_RETURN(std::vector<uint8_t> png, imaging::EncodePng(mask));
        const std::string mrel =
            "masks/" + schema.fields()[f].name + "/" + std::to_string(i) + ".png";
        fs::create_directories(fs::path(tmp.path()) / "masks" / schema.fields()[f].name, ec);
        SF_RETURN_IF_ERROR(
            WriteNewFile((fs::path(tmp.path()) / mrel).string(), png.data(), png.size()));
        return nlohmann::json(mrel);
      };
      for (size_t f = 0; f < schema.size(); ++f) {
        const std::string& name = schema.fields()[f].name;
        if (static_cast<int>(f) == schema.image_field()) {
          line[name] = rel;
          continue;
        }
        SF_ASSIGN_OR_RETURN(nlohmann::json v, FieldJson(archive, i, f, mask_file));
        line[name] = std::move(v);
      }
      lines += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
      return Status::OK();
    };
    SF_RETURN_IF_ERROR(ForSample(archive.path(), i, extract_one()));
  }
  if (!jsonl) SF_RETURN_IF_ERROR(EmptyClassFolders(archive, tmp.path()));
  if (jsonl) {
    const std::string text = UserSchema(schema);
    SF_RETURN_IF_ERROR(WriteNewFile((fs::path(tmp.path()) / "schema.json").string(),
                                    reinterpret_cast<const uint8_t*>(text.data()), text.size()));
    SF_RETURN_IF_ERROR(WriteNewFile((fs::path(tmp.path()) / "samples.jsonl").string(),
                                    reinterpret_cast<const uint8_t*>(lines.data()), lines.size()));
    SF_RETURN_IF_ERROR(WriteClassNames(archive, tmp.path()));
  }
  SF_RETURN_IF_ERROR(tmp.MoveTo(target));
  return archive.size();
}

}  // namespace shardfeed::validate
