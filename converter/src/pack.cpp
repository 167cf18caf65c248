// Pack: a source list (folder, list file, importer) fed through a SampleWriter
// (sample_writer.cpp), which owns the parallel ordered pipeline.
#include "shardfeed/converter/pack.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shardfeed/base/file_io.h"
#include "shardfeed/base/random.h"
#include "shardfeed/converter/options.h"
#include "shardfeed/converter/sample_writer.h"

namespace shardfeed::converter {

codec::EncodeOptions EncodeOptionsOf(const PackOptions& o) {
  codec::EncodeOptions e;
  e.size = o.size;
  e.max_side = o.max_side;
  e.center_crop = o.center_crop;
  e.quality = o.quality;
  e.level = o.level;
  e.validation = o.validation;
  e.jpeg_indexed = o.jpeg_indexed;
  e.limits = o.limits;
  return e;
}

Status DecodeForRecord(imaging::Decoder& decoder, const uint8_t* data, size_t size,
                       const PackOptions& options, imaging::Image* out, imaging::Image* scratch) {
  return codec::DecodeForPixels(decoder, data, size, EncodeOptionsOf(options), out, scratch);
}

uint64_t SourceFingerprint(const SourceList& source, const std::vector<SourceItem>& items) {
  std::string text;
  for (const std::string& c : source.class_names) text += c + '\n';
  const std::string root =
      source.root.empty() || source.root.back() == '/' ? source.root : source.root + "/";
  for (const SourceItem& item : items) {
    const bool under_root = item.path.compare(0, root.size(), root) == 0;
    text += (under_root ? item.path.substr(root.size()) : item.path) + '\0' +
            std::to_string(item.label) + '\n';
  }
  return format::RecordChecksum(text.data(), text.size());
}

void ShuffleItems(std::vector<SourceItem>* items, uint64_t seed) {
  Rng rng(seed);
  for (size_t i = items->size(); i > 1; --i) {
    size_t j = static_cast<size_t>(rng.Next() % i);
    std::swap((*items)[i - 1], (*items)[j]);
  }
}

namespace {

// The items of part `options.part` of `options.parts` (all of them when not split), and the
// part's record. Every part computes the whole list, so parts agree on their slices without
// talking; merge checks they saw the same list (paths relative to the root) and options.
format::PartInfo SliceForPart(const SourceList& source, const PackOptions& options,
                              std::vector<SourceItem>* items) {
  format::PartInfo part;
  if (options.parts <= 1 && !options.part_record) return part;
  part.index = options.part;
  part.count = options.parts;
  part.total_items = items->size();
  part.first_item = items->size() * options.part / options.parts;
  part.source_fingerprint = SourceFingerprint(source, *items);
  part.options_fingerprint =
      format::RecordChecksum(options.options_json.data(), options.options_json.size());
  const uint64_t end = items->size() * (uint64_t{options.part} + 1) / options.parts;
  *items = std::vector<SourceItem>(items->begin() + part.first_item, items->begin() + end);
  return part;
}

}  // namespace

namespace {

// `path` relative to `root` ('/'-separated; as given when it lies elsewhere).
std::string RelativePath(const std::string& root, const std::string& path) {
  if (root.empty()) return path;
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  if (path.size() > r.size() && path.compare(0, r.size(), r) == 0 && path[r.size()] == '/') {
    size_t from = r.size();
    while (from < path.size() && path[from] == '/') ++from;
    return path.substr(from);
  }
  return path;
}

// `text` with every byte that is not part of valid UTF-8 replaced by U+FFFD, as the report does:
// a file name need not be UTF-8, a str field must be.
std::string ValidUtf8(const std::string& text) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    size_t len = p[i] < 0x80           ? 1
                 : (p[i] >> 5) == 0x6  ? 2
                 : (p[i] >> 4) == 0xE  ? 3
                 : (p[i] >> 3) == 0x1E ? 4
                                       : 0;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xC0) == 0x80;
    if (ok && len > 1) {
      // Overlong forms, surrogates and code points past U+10FFFF are not valid either.
      uint32_t cp = p[i] & (0x7F >> len);
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
      static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (ok) {
      out.append(text, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

}  // namespace

Status Pack(const SourceList& source, const std::string& out, const PackOptions& options,
            PackResult* result_out, const ProgressFn& progress) {
  PackResult& result = *result_out;
  result = PackResult();
  result.output = out;
  result.ignored = source.ignored;
  result.notes = source.notes;
  result.skipped = source.skipped;
  result.encoding = options.encoding;
  SF_RETURN_IF_ERROR(ValidatePackOptions(options));
  SF_RETURN_IF_ERROR(format::CheckClassNames(source.class_names));  // before any work
  if (options.strict && !source.skipped.empty()) {  // a folder that could not be listed
    const SkippedFile& first = source.skipped.front();
    return Status::Corrupt(first.path, ": ", first.reason, " (--strict: no archive written)");
  }
  std::vector<SourceItem> items = source.items;
  if (options.shuffle) ShuffleItems(&items, options.seed);
  const format::PartInfo part = SliceForPart(source, options, &items);
  if (items.empty() && part.count == 0) {
    if (!source.skipped.empty()) {
      return Status::Corrupt("no image could be packed (", source.skipped.size(),
                             " samples skipped); no archive written");
    }
    return Status::InvalidArgument("no image files found (", source.ignored.size(),
                                   " files ignored); no archive written");
  }

  PackOptions writer_options = options;
  writer_options.writer.schema = source.schema;
  if (!source.root.empty()) writer_options.writer.protect.push_back(source.root);
  auto created = SampleWriter::Create(out, writer_options);
  if (!created.ok()) return created.status();
  SampleWriter& writer = **created;
  const uint64_t total = items.size();
  if (progress) {
    writer.set_progress([&](const PackStats& s) {
      PackStats shown = s;
      shown.total = total;
      progress(shown);
    });
  }
  const int path_field = source.path_field ? source.schema.Find("path") : -1;
  Status status;
  for (SourceItem& item : items) {
    Sample sample;
    sample.name = item.name.empty() ? item.path : std::move(item.name);
    sample.offset = item.offset;
    sample.length = item.length;
    sample.label = item.label;
    sample.values = std::move(item.values);
    sample.declared_width = item.declared_width;
    sample.declared_height = item.declared_height;
    sample.frame_from_size = item.frame_from_size;
    if (path_field >= 0) {
      sample.values.resize(source.schema.size());
      sample.values[path_field] = OwnedValue::Text(ValidUtf8(RelativePath(source.root, item.path)));
    }
    sample.image_file = std::move(item.path);
    status = writer.Write(std::move(sample));
    if (!status.ok()) break;
  }
  if (status.ok()) {
    format::Manifest manifest;
    manifest.class_names =
        source.class_names;  // COCO keeps its category names without a class field
    manifest.options_json = options.options_json;
    manifest.is_part = part.count > 0;
    manifest.part = part;
    status = writer.Finish(std::move(manifest), part.count > 0);
  }
  const std::vector<SkippedFile> skipped_rows = std::move(result.skipped);
  result = writer.result();
  result.ignored = source.ignored;
  result.notes.insert(result.notes.begin(), source.notes.begin(), source.notes.end());
  result.skipped.insert(result.skipped.begin(), skipped_rows.begin(), skipped_rows.end());
  result.stats.total = total + skipped_rows.size();
  result.stats.done += skipped_rows.size();
  return status;
}

std::string PackReportJson(const PackResult& result, const std::string& source,
                           const std::string& error) {
  using nlohmann::json;
  auto list = [](const std::vector<SkippedFile>& files) {
    json a = json::array();
    for (const auto& f : files) a.push_back({{"path", f.path}, {"reason", f.reason}});
    return a;
  };
  json j = {{"source", source},
            {"output", result.output},
            {"total", result.stats.total},
            {"packed", result.stats.packed},
            {"resized", result.stats.resized},
            {"reencoded", result.stats.reencoded},
            {"skipped_count", result.skipped.size()},
            {"skipped", list(result.skipped)},
            {"ignored", list(result.ignored)},
            {"notes", result.notes},
            {"source_bytes", result.stats.source_bytes},
            {"payload_bytes", result.stats.payload_bytes},
            {"seconds", result.stats.seconds}};
  if (!error.empty()) j["error"] = error;
  // File names need not be UTF-8: replace invalid bytes rather than fail to write the report.
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

Status CheckClassId(int64_t label) {
  if (label >= 0 && label <= format::kMaxClassId) return Status::OK();
  return Status::InvalidArgument(label, " is not a class id in 0..", format::kMaxClassId,
                                 " (an archive has at most ", format::kMaxClassId + 1, " classes)");
}

std::vector<std::string> NumericClassNames(int64_t max_label) {
  std::vector<std::string> names;
  names.reserve(
      static_cast<size_t>(std::clamp<int64_t>(max_label + 1, 0, format::kMaxClassId + 1)));
  for (int64_t i = 0; i <= std::min(max_label, format::kMaxClassId); ++i) {
    names.push_back(std::to_string(i));
  }
  return names;
}

namespace {

bool IsPackReport(const std::string& path) {
  std::error_code ec;  // a report names its skipped files: large, but not gigabytes
  const uintmax_t bytes = std::filesystem::file_size(path, ec);
  if (ec || bytes > (uintmax_t{256} << 20)) return false;
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) return false;
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (!j.is_object()) return false;
  for (const char* key : {"source", "output", "packed", "skipped", "ignored"}) {
    if (!j.contains(key)) return false;
  }
  return true;
}

}  // namespace

Status CheckReportPath(const std::string& path, bool overwrite) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  if (!fs::exists(st)) {
    const fs::path parent = fs::path(path).parent_path();
    if (!parent.empty() && !fs::is_directory(parent, ec)) {
      return Status::InvalidArgument("--report ", path, ": no folder ", parent.string());
    }
    return Status::OK();
  }
  const bool report = fs::is_regular_file(st) && IsPackReport(path);
  if (overwrite && report) return Status::OK();
  return Status::InvalidArgument(
      "--report ", path, ": exists", report ? "" : " and is not a pack report",
      "; shardfeed writes only new files here (a previous pack report is replaced with "
      "--overwrite)");
}

Status WriteReport(const std::string& path, const std::string& text, bool overwrite) {
  // A new file is created in place (O_EXCL: nothing appeared since the check); a previous report
  // is replaced by renaming a complete temporary file over it.
  const bool replace = overwrite && std::filesystem::exists(path);
  if (replace) SF_RETURN_IF_ERROR(CheckReportPath(path, overwrite));  // still a report
  std::string file = replace ? path + ".tmp-XXXXXX" : path;
  const int fd = replace ? ::mkostemp(file.data(), O_CLOEXEC)
                         : ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IOError("--report ", file, ": ", std::strerror(errno));
  int err = WriteAll(fd, text.data(), text.size());
  if (replace && err == 0 && ::fchmod(fd, 0644) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (replace && err == 0 && ::rename(file.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(file.c_str());
    return Status::IOError("--report ", path, ": cannot write: ", std::strerror(err));
  }
  return Status::OK();
}

}  // namespace shardfeed::converter
