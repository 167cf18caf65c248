#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "shardfeed/converter/importers.h"
#include "shardfeed/converter/pack.h"
#include "shardfeed/format/archive.h"

namespace shardfeed::converter {
namespace {

std::string Join(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}

struct DirEntries {
  std::vector<std::string> dirs, files, others;
};

// Lists a directory, following symlinks to classify entries. Dangling links count as files (the
// packer then reports them as unreadable).
Status ListDir(const std::string& dir, DirEntries* out) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return Status::IOError(dir, ": cannot list: ", std::strerror(errno));
  errno = 0;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::string path = Join(dir, name);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      out->files.push_back(name);  // dangling link or unreadable: reported when packing
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      out->dirs.push_back(name);
    } else if (S_ISREG(st.st_mode)) {
      out->files.push_back(name);
    } else {
      out->others.push_back(name);
    }
  }
  ::closedir(d);
  std::sort(out->dirs.begin(), out->dirs.end());
  std::sort(out->files.begin(), out->files.end());
  std::sort(out->others.begin(), out->others.end());
  return Status::OK();
}

using FileId = std::pair<dev_t, ino_t>;

bool IdOf(const std::string& path, FileId* id) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  *id = {st.st_dev, st.st_ino};
  return true;
}

// `path` (a symbolic link to a directory) leads back into the tree being scanned.
bool LinksIntoTree(const std::string& path, const std::string& root_real) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return false;
  char* target = ::realpath(path.c_str(), nullptr);
  if (!target) return false;
  std::string t = target;
  std::free(target);
  return t == root_real || t.compare(0, root_real.size() + 1, root_real + "/") == 0 ||
         root_real.compare(0, t.size() + 1, t + "/") == 0;
}

struct Walker {
  std::set<FileId> active;                     // directories on the current path (cycle guard)
  std::string root_real;                       // the source root, resolved
  const std::set<FileId>* excluded = nullptr;  // the archive being written, if inside the tree
  std::vector<std::pair<std::string, std::string>> found;  // (dir, name) of candidate files
  std::vector<SkippedFile>* ignored;
  // Folders that could not be read: their images are lost to the pack, so they are skipped
  // (reported, and --strict fails), never quietly ignored.
  std::vector<SkippedFile>* skipped;

  bool Excluded(const std::string& path) const {
    FileId id;
    return excluded && !excluded->empty() && IdOf(path, &id) && excluded->count(id);
  }

  Status Walk(const std::string& dir) {
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) {
      skipped->push_back({dir, std::string("cannot read directory: ") + std::strerror(errno)});
      return Status::OK();
    }
    if (Excluded(dir)) {
      ignored->push_back({dir, "the output archive"});
      return Status::OK();
    }
    auto key = std::make_pair(st.st_dev, st.st_ino);
    if (active.count(key)) {
      ignored->push_back({dir, "directory symlink cycle"});
      return Status::OK();
    }
    active.insert(key);
    DirEntries entries;
    Status s = ListDir(dir, &entries);
    if (!s.ok()) {
      const std::string& why = s.message();  // "<dir>: cannot list: ...": the path once
      const bool named = why.compare(0, dir.size() + 2, dir + ": ") == 0;
      skipped->push_back({dir, named ? why.substr(dir.size() + 2) : why});
      active.erase(key);
      return Status::OK();
    }
    for (const std::string& f : entries.files) {
      if (f[0] == '.') {
        ignored->push_back({Join(dir, f), "hidden file"});
      } else if (Excluded(Join(dir, f))) {
        ignored->push_back({Join(dir, f), "the output archive"});
      } else {
        found.emplace_back(dir, f);
      }
    }
    for (const std::string& o : entries.others) {
      found.emplace_back(dir, o);  // FIFOs, sockets, devices: reported as not regular files
    }
    for (const std::string& sub : entries.dirs) {
      const std::string path = Join(dir, sub);
      FileId id;
      if (sub[0] == '.') {
        ignored->push_back({path, "hidden directory"});
      } else if (IdOf(path, &id) && active.count(id)) {
        ignored->push_back({path, "directory symlink cycle"});
      } else if (LinksIntoTree(path, root_real)) {
        // Its images are in the tree already (under their own class): following it would pack
        // them twice, and under the wrong label.
        ignored->push_back({path, "symbolic link into the folder being packed"});
      } else if (format::IsArchiveDirectory(path)) {
        ignored->push_back({path, "a shardfeed archive"});
      } else {
        SF_RETURN_IF_ERROR(Walk(path));
      }
    }
    active.erase(key);
    return Status::OK();
  }
};

}  // namespace

Result<SourceList> ScanImageFolder(const std::string& root,
                                   const std::vector<std::string>& exclude) {
  std::set<FileId> excluded;
  for (const std::string& path : exclude) {
    FileId id;
    if (IdOf(path, &id)) excluded.insert(id);
  }
  struct stat st;
  if (::stat(root.c_str(), &st) != 0) {
    return Status::NotFound(root, ": ", std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument(root,
                                   ": not a directory (an image folder with one "
                                   "sub-folder per class, or use --list)");
  }
  SourceList list;
  list.root = root;
  char* resolved = ::realpath(root.c_str(), nullptr);
  const std::string root_real = resolved ? resolved : root;
  std::free(resolved);
  DirEntries top;
  SF_RETURN_IF_ERROR(ListDir(root, &top));
  for (const std::string& f : top.files) {
    list.ignored.push_back({Join(root, f), "not inside a class folder"});
  }
  for (const std::string& d : top.dirs) {
    FileId id;
    if (d[0] == '.') {
      list.ignored.push_back({Join(root, d), "hidden directory"});
    } else if (IdOf(Join(root, d), &id) && excluded.count(id)) {
      list.ignored.push_back({Join(root, d), "the output archive"});
    } else if (IdOf(Join(root, d), &id) && id == FileId{st.st_dev, st.st_ino}) {
      list.ignored.push_back({Join(root, d), "directory symlink cycle"});
    } else if (format::IsArchiveDirectory(Join(root, d))) {
      list.ignored.push_back({Join(root, d), "a shardfeed archive"});
    } else {
      list.class_names.push_back(d);
    }
  }
  if (list.class_names.empty()) {
    return Status::InvalidArgument(root, ": no class folders (expected ROOT/<class>/<image>)");
  }
  for (size_t label = 0; label < list.class_names.size(); ++label) {
    Walker walker;
    walker.ignored = &list.ignored;
    walker.skipped = &list.skipped;
    walker.excluded = &excluded;
    walker.root_real = root_real;
    walker.active.insert({st.st_dev, st.st_ino});  // the root is every class's ancestor
    SF_RETURN_IF_ERROR(walker.Walk(Join(root, list.class_names[label])));
    // torchvision: sorted(os.walk(...)) then sorted file names: by directory, then by name.
    std::sort(walker.found.begin(), walker.found.end());
    for (auto& [dir, name] : walker.found) {
      SourceItem item;
      item.path = Join(dir, name);
      item.label = static_cast<int32_t>(label);
      list.items.push_back(std::move(item));
    }
  }
  return list;
}

std::vector<std::string> OutputPaths(const std::string& out) {
  std::string base = out;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return {base, base + ".partial", base + ".lock", base + ".old", base + ".parts"};
}

namespace {

// A list file's label text: a whole number in 0..2e9 (MXNet writes "3.000000").
bool ParseLabel(const std::string& text, int64_t* label) {
  char* parse_end = nullptr;
  errno = 0;
  double value = std::strtod(text.c_str(), &parse_end);
  if (text.empty() || *parse_end != 0 || errno != 0 || value < 0 || value > 2e9 ||
      value != static_cast<double>(static_cast<int64_t>(value))) {
    return false;
  }
  *label = static_cast<int64_t>(value);
  return true;
}

// Splits `text` at tabs.
std::vector<std::string> SplitTabs(const std::string& text) {
  std::vector<std::string> parts;
  size_t from = 0;
  for (;;) {
    size_t tab = text.find('\t', from);
    parts.push_back(text.substr(from, tab == std::string::npos ? tab : tab - from));
    if (tab == std::string::npos) return parts;
    from = tab + 1;
  }
}

}  // namespace

Result<SourceList> ReadListFile(const std::string& list_file, const std::string& root) {
  std::ifstream in(list_file);
  if (!in) return Status::NotFound(list_file, ": cannot open list file: ", std::strerror(errno));
  SourceList list;
  list.root = root;
  list.kind = "list";
  std::string line;
  int64_t max_label = -1;
  size_t line_no = 0;
  bool multi = false;  // some MXNet line has more than one label
  std::vector<std::vector<int64_t>> labels;
  auto bad = [&](const std::string& why) {
    return Status::Corrupt(list_file, ":", line_no, ": ", why);
  };
  Status too_big;  // a label beyond format::kMaxClassId, with its line
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    std::string path;
    std::vector<std::string> label_texts;
    const std::vector<std::string> tabs = SplitTabs(line);
    if (tabs.size() >= 3) {
      // MXNet .lst: index \t label [\t more labels] \t path.
      path = tabs.back();
      label_texts.assign(tabs.begin() + 1, tabs.end() - 1);
    } else {
      size_t end = line.find_last_not_of(" \t");
      size_t sep = line.find_last_of(" \t", end);
      if (sep == std::string::npos) return bad("expected \"path label\"");
      label_texts.push_back(line.substr(sep + 1, end - sep));
      size_t path_end = line.find_last_not_of(" \t", sep);
      if (path_end == std::string::npos) return bad("expected \"path label\"");
      path = line.substr(first, path_end - first + 1);
    }
    std::vector<int64_t> row;
    for (const std::string& text : label_texts) {
      int64_t label = 0;
      if (!ParseLabel(text, &label)) {
        return bad("label \"" + text + "\" is not a non-negative integer");
      }
      // A class id only when every line has one label (known at the end): the first too large.
      if (too_big.ok()) {
        if (Status id = CheckClassId(label); !id.ok()) too_big = bad("label " + id.message());
      }
      row.push_back(label);
      max_label = std::max(max_label, label);
    }
    multi = multi || row.size() != 1;
    if (path.empty()) return bad("empty path");
    if (path[0] != '/') path = Join(root, path);
    SourceItem item;
    item.path = std::move(path);
    item.label = static_cast<int32_t>(row.empty() ? 0 : row[0]);
    item.name = list_file + ":" + std::to_string(line_no);
    list.items.push_back(std::move(item));
    labels.push_back(std::move(row));
  }
  if (in.bad()) return Status::IOError(list_file, ": read failed");
  if (list.items.empty()) return Status::InvalidArgument(list_file, ": no entries");
  if (!multi) {
    if (!too_big.ok()) return too_big;
    // One label per line: image, label, path (Schema::ImageFolder()).
    list.class_names = NumericClassNames(max_label);
    return list;
  }
  // Several labels on some line: image, labels (int64[*]), path; no class field, nothing
  // truncated.
  format::Schema schema;
  SF_RETURN_IF_ERROR(schema.Add(MakeField("image", "image")));
  SF_RETURN_IF_ERROR(schema.Add(MakeField("labels", "int64[*]")));
  SF_RETURN_IF_ERROR(schema.Add(MakeField("path", "str")));
  list.schema = schema;
  for (size_t i = 0; i < list.items.size(); ++i) {
    list.items[i].label = 0;
    list.items[i].values.resize(3);
    list.items[i].values[1] = OwnedValue::Array(labels[i].data(), labels[i].size() * 8,
                                                {static_cast<uint32_t>(labels[i].size())});
  }
  return list;
}

}  // namespace shardfeed::converter
