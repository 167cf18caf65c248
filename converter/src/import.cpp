// Which importer reads a source: recognised from the path (and, for .json, its top-level keys),
// or forced with --from.
#include <dirent.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "shardfeed/converter/importers.h"

namespace shardfeed::converter {
namespace {

bool EndsWith(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  if (s.size() < n) return false;
  for (size_t i = 0; i < n; ++i) {
    if (std::tolower(static_cast<unsigned char>(s[s.size() - n + i])) != suffix[i]) return false;
  }
  return true;
}

// The first 64 KiB of a .json file name COCO's top-level lists.
bool LooksLikeCoco(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  std::string head(64 << 10, '\0');
  in.read(&head[0], static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  return head.find("\"images\"") != std::string::npos &&
         (head.find("\"annotations\"") != std::string::npos ||
          head.find("\"categories\"") != std::string::npos || head.size() == (64u << 10));
}

}  // namespace

const char* SourceKinds() { return "folder|list|jsonl|csv|coco|webdataset|parquet"; }

Result<std::string> DetectSourceKind(const std::string& src) {
  struct stat st;
  if (::stat(src.c_str(), &st) != 0) return Status::NotFound(src, ": ", std::strerror(errno));
  if (S_ISDIR(st.st_mode)) {
    // A directory of .tar shards (and no class folders) is a WebDataset; of .parquet files,
    // parquet; anything else an image folder.
    DIR* d = ::opendir(src.c_str());
    if (!d) return Status::IOError(src, ": cannot list: ", std::strerror(errno));
    bool tar = false, parquet = false, dirs = false;
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.empty() || name[0] == '.') continue;
      struct stat sub;
      const std::string path = src + "/" + name;
      if (::stat(path.c_str(), &sub) == 0 && S_ISDIR(sub.st_mode)) dirs = true;
      tar = tar || EndsWith(name, ".tar");
      parquet = parquet || EndsWith(name, ".parquet");
    }
    ::closedir(d);
    if (!dirs && tar) return std::string("webdataset");
    if (!dirs && parquet) return std::string("parquet");
    return std::string("folder");
  }
  if (EndsWith(src, ".jsonl") || EndsWith(src, ".ndjson")) return std::string("jsonl");
  if (EndsWith(src, ".csv") || EndsWith(src, ".tsv")) return std::string("csv");
  if (EndsWith(src, ".tar")) return std::string("webdataset");
  if (EndsWith(src, ".parquet")) return std::string("parquet");
  if (EndsWith(src, ".json") && LooksLikeCoco(src)) return std::string("coco");
  return Status::InvalidArgument(src, ": cannot tell what kind of source this is (an image ",
                                 "folder, *.jsonl, *.csv, a COCO *.json, *.tar shards, *.parquet);",
                                 " say it with --from ", SourceKinds());
}

Result<SourceList> ImportSource(const std::string& src, const ImportOptions& options) {
  std::string kind = options.kind;
  if (kind.empty() && !options.list.empty()) kind = "list";
  if (kind.empty()) {
    SF_ASSIGN_OR_RETURN(kind, DetectSourceKind(src));
  }
  if (!options.schema_json.empty() && kind != "jsonl" && kind != "csv" && kind != "webdataset") {
    return Status::InvalidArgument("--schema applies to jsonl, csv and webdataset sources, not ",
                                   kind, " (whose schema is fixed: see docs/CLI.md)");
  }
  if ((!options.images.empty() || !options.captions.empty()) && kind != "coco") {
    return Status::InvalidArgument("--images and --captions apply to coco sources, not ", kind);
  }
  if (kind == "list" && options.list.empty()) {
    return Status::InvalidArgument("--from list needs --list FILE (SRC is the root of its paths)");
  }
  if (kind != "list" && !options.list.empty()) {
    return Status::InvalidArgument("--list goes with a folder root as SRC (--from list)");
  }
  Result<SourceList> list = Status::InvalidArgument("unknown source kind '", kind,
                                                    "' (--from takes ", SourceKinds(), ")");
  if (kind == "folder") list = ScanImageFolder(src, options.exclude);
  if (kind == "list") list = ReadListFile(options.list, src);
  if (kind == "jsonl") list = ImportJsonl(src, options);
  if (kind == "csv") list = ImportCsv(src, options);
  if (kind == "coco") list = ImportCoco(src, options);
  if (kind == "webdataset") list = ImportWebDataset(src, options);
  if (kind == "parquet") {
    list = Status::Unsupported(
        "parquet sources are read by the Python package (python -m "
        "shardfeed.importers.parquet, with pyarrow)");
  }
  return list;
}

}  // namespace shardfeed::converter
