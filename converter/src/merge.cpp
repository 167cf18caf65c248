// merge: the parts of a split pack (`pack --part I/N`) joined into one archive by linking their
// shard files. The rules are in pack.h (Merge).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "shardfeed/converter/pack.h"
#include "shardfeed/format/archive.h"

namespace shardfeed::converter {

namespace fs = std::filesystem;
using nlohmann::json;

std::string DefaultPartPath(const std::string& out, uint32_t part, uint32_t parts) {
  std::string base = out;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  char name[64];
  std::snprintf(name, sizeof(name), "part-%05u-of-%05u", part, parts);
  return (fs::path(base + ".parts") / name).string();
}

namespace {

// The part archives named by `args`: archives themselves, or the archive sub-directories of a
// single directory that is not one (sorted, so the order is the same everywhere).
Result<std::vector<std::string>> ListParts(const std::vector<std::string>& args) {
  if (args.size() == 1 && !format::IsArchiveDirectory(args[0])) {
    std::error_code ec;
    if (!fs::is_directory(args[0], ec)) {
      return Status::NotFound(args[0], ": no such directory of parts");
    }
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(args[0], ec)) {
      if (entry.is_directory() && format::IsArchiveDirectory(entry.path().string())) {
        found.push_back(entry.path().string());
      }
    }
    if (ec) return Status::IOError(args[0], ": ", ec.message());
    std::sort(found.begin(), found.end());
    if (found.empty()) return Status::InvalidArgument(args[0], ": holds no part archive");
    return found;
  }
  return args;
}

// " (KEY: VALUE here, VALUE in FIRST; ...)" for the keys whose values differ between two
// parts' recorded pack options, or "" when they are the same (or not both JSON objects).
std::string OptionsDifference(const std::string& mine, const std::string& theirs,
                              const std::string& first_path) {
  const json a = json::parse(mine, nullptr, false), b = json::parse(theirs, nullptr, false);
  if (!a.is_object() || !b.is_object()) return "";
  std::string out;
  auto value = [](const json& o, const std::string& key) {
    auto it = o.find(key);
    return it == o.end() ? std::string("(none)") : it->dump();
  };
  json keys = a;
  keys.update(b);
  for (const auto& [key, unused] : keys.items()) {
    const std::string here = value(a, key), there = value(b, key);
    if (here == there) continue;
    out +=
        (out.empty() ? " (" : "; ") + key + ": " + here + " here, " + there + " in " + first_path;
  }
  return out.empty() ? out : out + ")";
}

}  // namespace

Status Merge(const std::vector<std::string>& args, const std::string& out, bool overwrite,
             MergeResult* result) {
  SF_ASSIGN_OR_RETURN(std::vector<std::string> paths, ListParts(args));
  std::vector<std::shared_ptr<format::Archive>> parts;
  std::map<uint32_t, size_t> by_index;
  for (const std::string& path : paths) {
    auto archive = format::Archive::Open(path, format::IndexCheck::kFull);
    if (!archive.ok()) return archive.status().WithContext("part " + path);
    const format::Manifest& m = (*archive)->manifest();
    if (!m.is_part) {
      return Status::InvalidArgument(path, ": not a part of a split pack (no \"part\" in its ",
                                     "manifest; pack with --part I/N)");
    }
    const format::Manifest& first = parts.empty() ? m : parts[0]->manifest();
    const std::string& first_path = parts.empty() ? path : paths[0];
    auto differs = [&](const std::string& what) {
      return Status::InvalidArgument(path, ": not a part of the same pack as ", first_path, ": ",
                                     what, " differ");
    };
    if (m.part.count != first.part.count) return differs("the numbers of parts");
    if (m.part.source_fingerprint != first.part.source_fingerprint) {
      return differs("the source lists (another folder, list file or --shuffle/--seed)");
    }
    // The options as recorded, too: a part converted since (convert keeps "part") may have
    // another JPEG layout under the same fingerprint.
    const std::string options = OptionsDifference(m.options_json, first.options_json, first_path);
    if (m.part.options_fingerprint != first.part.options_fingerprint || !options.empty()) {
      return differs("the pack options" + options);
    }
    if (m.part.total_items != first.part.total_items) return differs("the numbers of items");
    if (m.backend != first.backend) return differs("the backends");
    if (m.encoding != first.encoding) return differs("the encodings");
    if (m.class_names != first.class_names) return differs("the class lists");
    if (m.schema != first.schema) return differs("the fields (schemas)");
    const uint64_t want_first = m.part.total_items * m.part.index / m.part.count;
    if (m.part.first_item != want_first) return differs("the splits of the source list");
    if (auto [it, fresh] = by_index.emplace(m.part.index, parts.size()); !fresh) {
      return Status::InvalidArgument("part ", m.part.index, " of ", m.part.count,
                                     " is given twice: ", paths[it->second], " and ", path);
    }
    parts.push_back(*archive);
  }
  const uint32_t count = parts[0]->manifest().part.count;
  for (uint32_t i = 0; i < count; ++i) {
    if (!by_index.count(i)) {
      return Status::InvalidArgument("part ", i, " of ", count, " is missing (expected ",
                                     fs::path(DefaultPartPath("OUT", i, count)).filename().string(),
                                     " beside ", paths[0], ")");
    }
  }

  const format::Manifest& m0 = parts[0]->manifest();
  format::WriterOptions wo;
  wo.backend = m0.backend;
  wo.encoding = m0.encoding;
  wo.height = m0.height;
  wo.width = m0.width;
  wo.schema = m0.schema;  // every part's (checked above): the fields tables travel in the files
  wo.overwrite = overwrite;
  wo.protect = paths;
  wo.sealed = paths;
  SF_ASSIGN_OR_RETURN(auto writer, format::ArchiveWriter::Create(out, wo));
  format::Manifest merged = format::SameRecordsAs(m0);
  merged.height = merged.width = merged.channels = 0;  // the writer records the common shape
  merged.created_by =
      "shardfeed " SHARDFEED_VERSION " (merged from " + std::to_string(count) + " parts)";
  MergeResult r;
  r.parts = count;
  if (merged.resized_records) merged.resized_records = 0;  // summed over the parts below
  bool reencoded_known = true;
  uint64_t reencoded = 0;
  for (uint32_t i = 0; i < count; ++i) {
    const format::Archive& part = *parts[by_index[i]];
    const format::Manifest& m = part.manifest();
    merged.source_bytes += m.source_bytes;
    if (merged.resized_records) *merged.resized_records += m.resized_records.value_or(0);
    reencoded_known &= m.reencoded_records.has_value();
    reencoded += m.reencoded_records.value_or(0);
    merged.created_at = std::max(merged.created_at, m.created_at);  // the same for every merge
    std::vector<uint64_t> counts = m.class_counts;
    for (size_t s = 0; s < m.shards.size(); ++s) {
      if (m.shards[s].sample_count == 0) continue;
      bool copied = false;
      SF_RETURN_IF_ERROR(writer->LinkShard((fs::path(part.path()) / m.shards[s].file).string(),
                                           m.shards[s], static_cast<uint32_t>(s), counts, &copied,
                                           m.height, m.width));
      counts.assign(counts.size(), 0);  // the part's counts go with its first shard
      ++r.shards;
      r.copied_shards += copied;
    }
  }
  merged.reencoded_records.reset();
  if (reencoded_known) merged.reencoded_records = reencoded;
  r.samples = writer->samples_written();
  SF_RETURN_IF_ERROR(writer->Finish(std::move(merged)));
  if (result) *result = r;
  return Status::OK();
}

}  // namespace shardfeed::converter
