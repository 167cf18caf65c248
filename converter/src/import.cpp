// Which importer reads a source: recognised from the path (and, for .json, its top-level keys),
// or forced with --from.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

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

// The --class-names file: a JSON list of strings, or else one name per line (a UTF-8 BOM, a
// trailing '\r' and the empty lines at the end dropped: "[background]" on its first line is a
// name). Names must be distinct and valid UTF-8.
Result<std::vector<std::string>> ReadClassNames(const std::string& file) {
  struct stat st;
  if (::stat(file.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("--class-names ", file, ": is a directory, not a file");
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::InvalidArgument("--class-names ", file, ": ", std::strerror(errno));
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);  // a BOM (Windows editors)
  std::vector<std::string> names;
  const auto j = nlohmann::json::parse(text, nullptr, false);
  const bool json_list =
      j.is_array() && std::all_of(j.begin(), j.end(), [](const auto& v) { return v.is_string(); });
  if (json_list) {
    for (const auto& v : j) names.push_back(v.template get<std::string>());
  } else {
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      names.push_back(line);
    }
    while (!names.empty() && names.back().empty()) names.pop_back();
  }
  if (names.empty()) return Status::InvalidArgument("--class-names ", file, ": no names");
  if (names.size() > uint64_t(format::kMaxClassId) + 1) {
    return Status::InvalidArgument("--class-names ", file, ": ", names.size(),
                                   " names; an archive has at most ", format::kMaxClassId + 1,
                                   " classes");
  }
  std::unordered_map<std::string, size_t> seen;
  for (size_t i = 0; i < names.size(); ++i) {
    // An empty name is one an archive may have (a COCO category ""): a JSON list gives it; a
    // blank line is taken for a mistake.
    if (names[i].empty() && !json_list) {
      return Status::InvalidArgument("--class-names ", file, ": line ", i + 1,
                                     " is empty (an empty name goes in a JSON list: [\"\", ...])");
    }
    if (!seen.emplace(names[i], i).second) {
      return Status::InvalidArgument("--class-names ", file, ": '", names[i], "' is given twice (",
                                     seen[names[i]], " and ", i, ")");
    }
  }
  if (Status s = format::CheckClassNames(names); !s.ok())
    return s.WithContext("--class-names " + file);
  return names;
}

// Puts the --class-names list in place of the importer's class names (ImportOptions).
Status ApplyClassNames(const std::string& file, const std::vector<std::string>& names,
                       bool skip_bad, SourceList* list) {
  const format::Schema& schema = list->schema;
  const bool class_field = schema.label_field() >= 0;
  // Without a class field the names are those of per-box labels (COCO's "labels"): checked
  // against them as a class field's ids are.
  const int per_box = class_field ? -1 : schema.Find("labels");
  const bool per_box_ids = per_box >= 0 &&
                           schema.fields()[per_box].elem == format::ElemType::kInt64 &&
                           schema.fields()[per_box].dims.size() == 1;
  std::unordered_map<std::string, int32_t> id_of;
  for (size_t i = 0; i < names.size(); ++i) id_of[names[i]] = static_cast<int32_t>(i);
  std::vector<SourceItem> kept;
  kept.reserve(list->items.size());
  for (SourceItem& item : list->items) {
    std::string why, field = "label";
    if (class_field && !list->class_names_from_text && size_t(item.label) >= names.size()) {
      why = "class id " + std::to_string(item.label) + " is not below the " +
            std::to_string(names.size()) + " names of --class-names " + file;
    } else if (class_field && list->class_names_from_text) {
      const std::string& name = list->class_names[size_t(item.label)];
      auto it = id_of.find(name);
      if (it == id_of.end()) {
        why = "class '" + name + "' is not in --class-names " + file;
      } else {
        item.label = it->second;
      }
    } else if (per_box_ids && per_box < int(item.values.size()) && item.values[per_box].present) {
      const std::vector<uint8_t>& bytes = item.values[per_box].bytes;
      for (size_t at = 0; at + 8 <= bytes.size() && why.empty(); at += 8) {
        int64_t id;
        std::memcpy(&id, bytes.data() + at, 8);
        if (id < 0 || uint64_t(id) >= names.size()) {
          why = "label " + std::to_string(id) + " is not below the " +
                std::to_string(names.size()) + " names of --class-names " + file;
          field = "labels";
        }
      }
    }
    if (why.empty()) {
      kept.push_back(std::move(item));
      continue;
    }
    const std::string where = item.name.empty() ? item.path : item.name;
    if (!skip_bad) return Status::Corrupt(where, ": field '", field, "': ", why);
    list->skipped.push_back({where, "field '" + field + "': " + why});
  }
  list->items = std::move(kept);
  list->class_names = names;
  if (list->class_names_from_text) {  // the importer's note on how it numbered digit strings
    list->notes.erase(std::remove_if(list->notes.begin(), list->notes.end(),
                                     [](const std::string& n) {
                                       return n.find("holds strings of digits") !=
                                              std::string::npos;
                                     }),
                      list->notes.end());
  }
  list->class_names_from_text = false;
  return Status::OK();
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
  if (!options.class_names.empty() && (kind == "folder" || kind == "coco")) {
    return Status::InvalidArgument("--class-names applies to list, jsonl, csv and webdataset ",
                                   "sources, not ", kind, " (whose class names are its ",
                                   kind == "folder" ? "folders'" : "categories'", ")");
  }
  std::vector<std::string> names;
  if (!options.class_names.empty()) {
    SF_ASSIGN_OR_RETURN(names, ReadClassNames(options.class_names));
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
  if (list.ok() && !names.empty()) {
    SF_RETURN_IF_ERROR(ApplyClassNames(options.class_names, names, options.skip_bad, &*list));
  }
  return list;
}

}  // namespace shardfeed::converter
