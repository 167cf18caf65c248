// WebDataset shards: tar files whose members are grouped into samples by key (the member's path
// up to the first dot of its file name) and whose extensions are fields. Images are read in
// place through byte ranges of the tar (nothing is extracted); the other members' bytes are read
// here. Reads ustar, GNU long names and pax path/size records.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>

#include "shardfeed/converter/importers.h"

namespace shardfeed::converter {
namespace {

constexpr uint64_t kMaxValueBytes = uint64_t{1} << 30;  // a non-image member read into memory

struct Member {
  std::string name;
  uint64_t offset = 0, size = 0;  // the data's byte range in the tar
  uint64_t header = 0;            // where its header is: the tar's order of members
};

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

Status ReadAt(int fd, uint64_t offset, size_t size, std::string* out) {
  out->resize(size);
  size_t got = 0;
  while (got < size) {
    ssize_t n = ::pread(fd, &(*out)[got], size - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IOError("read failed: ", std::strerror(errno));
    if (n == 0) return Status::Corrupt("truncated at byte ", offset + got);
    got += static_cast<size_t>(n);
  }
  return Status::OK();
}

// A numeric header field: octal text, or GNU base-256 (high bit of the first byte set).
bool Number(const char* p, size_t n, uint64_t* v) {
  *v = 0;
  if (static_cast<unsigned char>(p[0]) & 0x80) {
    for (size_t i = 1; i < n; ++i) *v = (*v << 8) | static_cast<unsigned char>(p[i]);
    return true;
  }
  size_t i = 0;
  while (i < n && p[i] == ' ') ++i;
  bool any = false;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i)
    *v = (*v << 3) | uint64_t(p[i] - '0'), any = true;
  return any || i < n;
}

std::string Text(const char* p, size_t n) { return std::string(p, strnlen(p, n)); }

// A member path with "." and ".." resolved and a leading '/' dropped (an archive path, as
// tar -P writes): how members and hard-link targets are matched. Empty when ".." climbs past the
// tar's root; empty is never a member's key.
std::string Normalize(const std::string& path) {
  std::vector<std::string> parts;
  for (size_t at = 0; at <= path.size();) {
    size_t end = path.find('/', at);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(at, end - at);
    if (part == "..") {
      if (parts.empty()) return "";
      parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    at = end + 1;
  }
  std::string out;
  for (const std::string& part : parts) out += (out.empty() ? "" : "/") + part;
  return out;
}

// What the symbolic link `name` -> `target` names, normalised: relative to the link's own
// folder; empty for an absolute target (outside the tar) or one that climbs out of it.
std::string SymlinkTarget(const std::string& name, const std::string& target) {
  if (target.empty() || target[0] == '/') return "";
  const size_t slash = name.find_last_of('/');
  return Normalize(slash == std::string::npos ? target : name.substr(0, slash + 1) + target);
}

// Lists a tar's regular files, and its links to regular files in the same tar as the files they
// name (a hard link always names an earlier member; a symbolic link, resolved from its folder,
// may name any). Other members (devices, links out of the tar or to nothing) go to `ignored` with
// the reason; folders are left out silently. kCorrupt naming the byte offset of a bad header.
// long: one tar header a pass, with the GNU and pax extensions that carry names into the next.
Status ListTar(const std::string& file, std::vector<Member>* members,
               std::vector<SkippedFile>* ignored) {
  Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Status::NotFound(file, ": cannot open: ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(file, ": not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  std::string header, long_name, long_link, pax_path, pax_link;
  uint64_t pax_size = UINT64_MAX;
  std::map<std::string, size_t> regular;  // a file's path ("." and ".." resolved) -> *members
  struct SymLink {
    std::string name, target;  // as written
    uint64_t header;
    std::string path, resolved;  // Normalize(name), SymlinkTarget(name, target)
  };
  std::vector<SymLink> symlinks;
  for (uint64_t pos = 0; pos + 512 <= file_size;) {
    Status s = ReadAt(fd.get(), pos, 512, &header);
    if (!s.ok()) return Status::Corrupt(file, ": ", s.message());
    if (std::all_of(header.begin(), header.end(), [](char c) { return c == 0; })) break;
    const char* h = header.data();
    uint64_t sum = 0, want = 0, size = 0;
    for (size_t i = 0; i < 512; ++i) sum += (i >= 148 && i < 156) ? ' ' : uint8_t(h[i]);
    if (!Number(h + 148, 8, &want) || want != sum || !Number(h + 124, 12, &size)) {
      return Status::Corrupt(file, ": byte ", pos, ": not a tar header (bad checksum)");
    }
    if (pax_size != UINT64_MAX) size = pax_size;
    const uint64_t data = pos + 512;
    if (size > file_size - data) {
      return Status::Corrupt(file, ": byte ", pos, ": member of ", size,
                             " bytes runs past the end of the file");
    }
    const char type = h[156];
    std::string name = Text(h, 100);
    if (std::memcmp(h + 257, "ustar", 5) == 0 && h[345]) name = Text(h + 345, 155) + "/" + name;
    if (type == 'g' || type == 'V') {  // a pax global header (git archive), a volume label
      pos = data + (size + 511) / 512 * 512;
      continue;
    }
    if (type == 'L' || type == 'K' || type == 'x') {
      if (size > (1u << 20)) {
        return Status::Corrupt(file, ": byte ", pos, ": a long-name or pax header of ", size,
                               " bytes (more than 1 MiB)");
      }
      std::string body;
      SF_RETURN_IF_ERROR(ReadAt(fd.get(), data, static_cast<size_t>(size), &body));
      if (type == 'L' || type == 'K') {
        (type == 'L' ? long_name : long_link) = Text(body.data(), body.size());
      } else {
        // pax records: "LEN key=value\n"
        for (size_t at = 0; at < body.size();) {
          const size_t space = body.find(' ', at);
          const size_t len = std::strtoull(body.c_str() + at, nullptr, 10);
          if (space == std::string::npos || len == 0 || at + len > body.size()) break;
          const std::string record = body.substr(space + 1, at + len - space - 2);
          if (record.rfind("path=", 0) == 0) pax_path = record.substr(5);
          if (record.rfind("linkpath=", 0) == 0) pax_link = record.substr(9);
          if (record.rfind("size=", 0) == 0)
            pax_size = std::strtoull(record.c_str() + 5, nullptr, 10);
          at += len;
        }
      }
    } else {
      if (!pax_path.empty()) name = pax_path;
      if (!long_name.empty()) name = long_name;
      std::string link = Text(h + 157, 100);
      if (!pax_link.empty()) link = pax_link;
      if (!long_link.empty()) link = long_link;
      if (type == '0' || type == '\0' || type == '7') {
        const std::string key = Normalize(name);
        if (!key.empty()) regular[key] = members->size();
        members->push_back({name, data, size, pos});
      } else if (type == '1') {  // hard link: the same data as an earlier member
        const std::string target = Normalize(link);
        const auto it = target.empty() ? regular.end() : regular.find(target);
        if (it != regular.end()) {
          const std::string key = Normalize(name);
          if (!key.empty()) regular[key] = members->size();
          const Member& file_linked = (*members)[it->second];
          members->push_back({name, file_linked.offset, file_linked.size, pos});
        } else {
          ignored->push_back({file + ":" + name, "hard link to " + link +
                                                     ", which is not an earlier file of the tar"});
        }
      } else if (type == '2') {
        symlinks.push_back({name, link, pos, Normalize(name), SymlinkTarget(name, link)});
      } else if (type != '5') {
        ignored->push_back({file + ":" + name,
                            std::string("not a regular file (tar member type '") + type + "')"});
      }
      long_name.clear();
      long_link.clear();
      pax_path.clear();
      pax_link.clear();
      pax_size = UINT64_MAX;
    }
    pos = data + (size + 511) / 512 * 512;
  }
  // Symbolic links, once every file is known; a link to a link is followed as far as it goes
  // within the tar (a bounded number of steps: a cycle goes nowhere).
  std::map<std::string, std::string> link_of;  // a link's path -> its target's, resolved
  for (const SymLink& l : symlinks) link_of[l.path] = l.resolved;
  for (const SymLink& l : symlinks) {
    std::string at = l.resolved;
    // At most 40 links in a chain, as Linux follows: a cycle ends there, in O(links) steps.
    for (int step = 0; step < 40 && !at.empty() && link_of.count(at); ++step) at = link_of[at];
    const auto it = at.empty() ? regular.end() : regular.find(at);
    if (it == regular.end()) {
      ignored->push_back({file + ":" + l.name,
                          "symbolic link to " + l.target + ", which is not a file in the tar"});
      continue;
    }
    const Member& target = (*members)[it->second];
    members->push_back({l.name, target.offset, target.size, l.header});
  }
  // In the tar's order: samples are runs of members with one key.
  if (!symlinks.empty()) {
    std::sort(members->begin(), members->end(),
              [](const Member& a, const Member& b) { return a.header < b.header; });
  }
  return Status::OK();
}

// The field an extension becomes: cls/label -> label (int64), txt -> str, json -> json, others
// bytes; named by the extension, sanitised.
void FieldOfExtension(const std::string& ext, format::FieldSpec* spec) {
  spec->name = ext == "cls" || ext == "label" ? "label" : SanitizeFieldName(ext);
  const char* type = ext == "cls" || ext == "label" ? "int64"
                     : ext == "txt"                 ? "str"
                     : ext == "json"                ? "json"
                                                    : "bytes";
  (void)format::Schema::ParseType(type, spec);
}

struct TarSample {
  std::string tar, key;
  std::vector<std::pair<std::string, Member>> parts;  // (extension, member)
  // Why the sample is not one (a member name or key given twice), or "": it read as "missing
  // .cls", or its second member was dropped without a word.
  std::string twice;
};

// The extension of a sample's image member: the first of jpg, jpeg, png, webp it has (whatever
// their order in the tar), or "". Its other image members (a segmentation map x.png beside the
// photo x.jpg) are fields named by their extension, as any other member.
std::string ImageExtensionOf(const TarSample& s) {
  for (const char* ext : {"jpg", "jpeg", "png", "webp"}) {
    for (const auto& part : s.parts) {
      if (part.first == ext) return ext;
    }
  }
  return "";
}

Result<std::vector<std::string>> TarFiles(const std::string& src) {
  struct stat st;
  if (::stat(src.c_str(), &st) != 0) return Status::NotFound(src, ": ", std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return std::vector<std::string>{src};
  std::vector<std::string> tars;
  DIR* d = ::opendir(src.c_str());
  if (!d) return Status::IOError(src, ": cannot list: ", std::strerror(errno));
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > 4 && name[0] != '.' && name.compare(name.size() - 4, 4, ".tar") == 0) {
      tars.push_back(src + (src.back() == '/' ? "" : "/") + name);
    }
  }
  ::closedir(d);
  std::sort(tars.begin(), tars.end());
  if (tars.empty()) return Status::InvalidArgument(src, ": no .tar shards");
  return tars;
}

}  // namespace

// long: members -> samples -> schema -> items, each step a loop over the previous one's.
Result<SourceList> ImportWebDataset(const std::string& src, const ImportOptions& options) {
  SF_ASSIGN_OR_RETURN(std::vector<std::string> tars, TarFiles(src));
  SourceList list;
  list.kind = "webdataset";
  std::vector<TarSample> samples;
  for (const std::string& tar : tars) {
    std::vector<Member> members;
    SF_RETURN_IF_ERROR(ListTar(tar, &members, &list.ignored));
    std::unordered_map<std::string, std::string> first_member;  // key -> its first member
    for (Member& m : members) {
      const size_t slash = m.name.find_last_of('/');
      const size_t dot = m.name.find('.', slash == std::string::npos ? 0 : slash + 1);
      const size_t base = slash == std::string::npos ? 0 : slash + 1;
      if (m.name.size() > base && m.name[base] == '.') {
        list.ignored.push_back({tar + ":" + m.name, "hidden member"});
        continue;
      }
      if (dot == std::string::npos) {
        list.ignored.push_back({tar + ":" + m.name, "no extension"});
        continue;
      }
      std::string key = m.name.substr(0, dot), ext = m.name.substr(dot + 1);
      for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (samples.empty() || samples.back().tar != tar || samples.back().key != key) {
        samples.push_back({tar, key, {}, {}});
        auto [it, added] = first_member.emplace(key, m.name);
        if (!added) {  // a sample's members are adjacent: this key was a sample before
          samples.back().twice = "key '" + key + "' again (member " + m.name +
                                 "): it was a sample already, from member " + it->second;
        }
      }
      for (const auto& [e, earlier] : samples.back().parts) {
        if (e == ext && samples.back().twice.empty()) {
          samples.back().twice = "member " + m.name + " given twice";
        }
      }
      samples.back().parts.push_back({ext, m});
    }
  }
  // The schema: given, or image, label (cls), then the other extensions in order of first use,
  // then the sample's key. An extension that is some sample's image is no field (a sample whose
  // only image is b.png would miss it): a second image member of that extension beside another
  // sample's photo is left out and listed in `ignored`.
  format::Schema schema;
  std::set<std::string> image_exts;
  for (const TarSample& s : samples) image_exts.insert(ImageExtensionOf(s));
  if (!options.schema_json.empty()) {
    SF_ASSIGN_OR_RETURN(schema, format::Schema::FromJson(options.schema_json));
  } else {
    std::vector<std::string> exts;
    bool label = false;
    for (const TarSample& s : samples) {
      const std::string image = ImageExtensionOf(s);
      for (const auto& [ext, m] : s.parts) {
        if (ext == "cls" || ext == "label") label = true;
        if (ext != image && ext != "cls" && ext != "label" && !image_exts.count(ext) &&
            std::find(exts.begin(), exts.end(), ext) == exts.end()) {
          exts.push_back(ext);
        }
      }
    }
    SF_RETURN_IF_ERROR(schema.Add(MakeField("image", "image")));
    if (label) SF_RETURN_IF_ERROR(schema.Add(MakeField("label", "int64")));
    for (const std::string& ext : exts) {
      format::FieldSpec spec;
      FieldOfExtension(ext, &spec);
      if (schema.Find(spec.name) < 0) SF_RETURN_IF_ERROR(schema.Add(spec));
    }
    if (schema.Find("key") < 0) {
      SF_RETURN_IF_ERROR(schema.Add(MakeField("key", "str")));
    }
  }
  list.schema = schema;
  list.path_field = false;
  const int key_field = schema.Find("key");
  int64_t max_label = -1;
  std::unique_ptr<Fd> fd;  // the tar being read
  std::string fd_of;
  for (const TarSample& s : samples) {
    const std::string where = s.tar + ":" + s.key;
    auto bad = [&](const std::string& field, const std::string& why) -> Status {
      const std::string what = "field '" + field + "': " + why;
      if (!options.skip_bad) return Status::Corrupt(where, ": ", what);
      list.skipped.push_back({where, what});
      return Status::OK();
    };
    SourceItem item;
    item.name = where;
    item.path = s.tar;
    item.values.resize(schema.size());
    Status row;
    std::string field;
    bool has_label = false;
    if (!s.twice.empty()) {
      SF_RETURN_IF_ERROR(bad("key", s.twice));
      continue;
    }
    if (fd_of != s.tar) {
      fd = std::make_unique<Fd>(::open(s.tar.c_str(), O_RDONLY | O_CLOEXEC));
      if (fd->get() < 0) return Status::IOError(s.tar, ": cannot open: ", std::strerror(errno));
      fd_of = s.tar;
    }
    const std::string image = ImageExtensionOf(s);
    for (const auto& [ext, m] : s.parts) {
      if (ext == image) {
        item.offset = m.offset, item.length = m.size;
        if (m.size == 0) row = Status::InvalidArgument("empty image member"), field = "image";
        continue;
      }
      format::FieldSpec spec;
      FieldOfExtension(ext, &spec);
      const int f = schema.Find(spec.name);
      if ((f < 0 || f == schema.image_field()) && options.schema_json.empty()) {
        list.ignored.push_back(
            {s.tar + ":" + m.name, "a second image member beside " + s.key + "." + image + ": '" +
                                       ext +
                                       "' is other samples' image, so no field holds it "
                                       "(--schema can name it as a field)"});
      }
      if (f < 0 || f == schema.image_field()) continue;  // not in the given schema
      if (m.size > kMaxValueBytes) {
        return Status::Corrupt(where, ": member ", m.name, " of ", m.size,
                               " bytes is larger than a field value may be (1 GiB)");
      }
      std::string bytes;
      Status read = ReadAt(fd->get(), m.offset, static_cast<size_t>(m.size), &bytes);
      if (!read.ok()) return Status(read.code(), s.tar + ": " + read.message());
      field = spec.name;
      OwnedValue v;
      const bool text_type = schema.fields()[f].kind == format::FieldKind::kStr ||
                             schema.fields()[f].kind == format::FieldKind::kBytes;
      if (!text_type) {  // numbers and JSON: surrounding white space is not part of them
        const size_t a = bytes.find_first_not_of(" \t\r\n");
        const size_t b = bytes.find_last_not_of(" \t\r\n");
        bytes = a == std::string::npos ? "" : bytes.substr(a, b - a + 1);
      }
      if (schema.fields()[f].kind == format::FieldKind::kJson) {
        // A member is a JSON document (ValueFromText would keep text that is not JSON as a
        // JSON string, as it does for a CSV cell): one that does not parse is bad data.
        const std::string why = JsonSyntaxError(bytes);
        if (!why.empty()) {
          row = Status::InvalidArgument("member ", m.name, " is not valid JSON: ", why);
          break;
        }
        row = CheckJsonText(bytes);
        if (row.ok()) v = OwnedValue::Text(bytes);
      } else {
        row = ValueFromText(schema.fields()[f], bytes, &v);
      }
      if (!row.ok()) break;
      if (f == schema.label_field()) {
        int64_t label;
        std::memcpy(&label, v.bytes.data(), 8);
        row = CheckClassId(label);
        if (!row.ok()) break;
        item.label = static_cast<int32_t>(label);
        max_label = std::max(max_label, label);
        has_label = true;
      } else {
        item.values[f] = std::move(v);
      }
    }
    if (row.ok() && item.length == 0) {
      row = Status::InvalidArgument("no jpg/jpeg/png/webp member"), field = "image";
    }
    if (row.ok() && schema.label_field() >= 0 && !has_label) {
      row = Status::InvalidArgument("missing (no .cls member)"), field = "label";
    }
    if (row.ok() && key_field >= 0 && !item.values[key_field].present) {
      item.values[key_field] = OwnedValue::Text(s.key);
    }
    for (size_t f = 0; row.ok() && f < schema.size(); ++f) {
      if (int(f) != schema.image_field() && int(f) != schema.label_field() &&
          !item.values[f].present) {
        row = Status::InvalidArgument("missing"), field = schema.fields()[f].name;
      }
    }
    if (!row.ok()) {
      SF_RETURN_IF_ERROR(bad(field, row.message()));
      continue;
    }
    list.items.push_back(std::move(item));
  }
  if (schema.label_field() >= 0) {
    list.class_names = NumericClassNames(max_label);
  }
  if (list.items.empty() && list.skipped.empty()) {
    return Status::InvalidArgument(src, ": no samples (no member with an image extension)");
  }
  return list;
}

}  // namespace shardfeed::converter
