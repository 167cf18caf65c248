#include "shardfeed/format/manifest.h"

#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

namespace shardfeed::format {

using nlohmann::json;

std::string_view EncodingName(Encoding encoding) {
  switch (encoding) {
    case Encoding::kJpeg:
      return "jpeg";
    case Encoding::kRaw:
      return "raw";
    case Encoding::kZstd:
      return "zstd";
    case Encoding::kAuto:
      return "auto";
  }
  return "unknown";
}

bool ParseEncoding(std::string_view name, Encoding* out) {
  for (Encoding e : {Encoding::kJpeg, Encoding::kRaw, Encoding::kZstd, Encoding::kAuto}) {
    if (name == EncodingName(e)) {
      *out = e;
      return true;
    }
  }
  return false;
}

std::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kLmdb:
      return "lmdb";
    case Backend::kHdf5:
      return "hdf5";
  }
  return "unknown";
}

bool ParseBackend(std::string_view name, Backend* out) {
  for (Backend b : {Backend::kLmdb, Backend::kHdf5}) {
    if (name == BackendName(b)) {
      *out = b;
      return true;
    }
  }
  return false;
}

std::string HashToHex(uint64_t hash) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, hash);
  return buf;
}

bool HexToHash(const std::string& hex, uint64_t* out) {
  if (hex.size() != 16) return false;
  uint64_t v = 0;
  for (char c : hex) {
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

namespace {

constexpr const char* kChecksumField = "manifest_xxh3";

// The checksum covers the compact JSON of every field but itself. Both writer and reader hash
// what nlohmann dumps (object keys sorted, numbers in shortest round-trip form), so parse and
// re-dump give the same bytes.
uint64_t ManifestChecksum(json j) {
  j.erase(kChecksumField);
  const std::string canonical = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return XXH3_64bits(canonical.data(), canonical.size());
}

// Typed access: a missing or mistyped field is an error naming it, never an exception.
template <typename T>
Status Get(const json& j, const char* key, T* out, const std::string& origin,
           bool required = true) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (!required) return Status::OK();
    return Status::Corrupt(origin, ": missing field \"", key, "\"");
  }
  bool ok;
  if constexpr (std::is_same_v<T, std::string>) {
    ok = it->is_string();
  } else if constexpr (std::is_same_v<T, bool>) {
    ok = it->is_boolean();
  } else {
    static_assert(std::is_unsigned_v<T>);
    ok = it->is_number_unsigned() && it->template get<uint64_t>() <= std::numeric_limits<T>::max();
  }
  if (!ok) return Status::Corrupt(origin, ": field \"", key, "\" has the wrong type or range");
  *out = it->template get<T>();
  return Status::OK();
}

// A SAX pass over a manifest that builds no document (O(nesting) memory): counts the entries of
// the top-level "shards" list and notes the top-level "format" string.
class ShapeScan : public nlohmann::json_sax<json> {
 public:
  uint64_t shards = 0;
  std::string format;
  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t& v) override {
    if (depth_ == 1 && key_ == "format") format = v;
    return Value();
  }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override { return Open(); }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override {
    if (depth_ == 1 && key_ == "shards") shards_depth_ = depth_ + 1;
    return Open();
  }
  bool end_array() override { return Close(); }
  bool key(string_t& k) override {
    if (depth_ == 1) key_ = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  bool Value() { return true; }
  bool Open() {
    if (depth_ == shards_depth_) ++shards;
    return ++depth_ <= kMaxManifestDepth;
  }
  bool Close() {
    if (--depth_ < shards_depth_) shards_depth_ = -1;
    return true;
  }
  int depth_ = 0, shards_depth_ = -1;
  std::string key_;
};

}  // namespace

Manifest SameRecordsAs(const Manifest& m) {
  Manifest out;
  out.encoding = m.encoding;
  out.schema = m.schema;
  out.class_names = m.class_names;
  out.height = m.height;
  out.width = m.width;
  out.channels = m.channels;
  out.options_json = m.options_json;
  out.resized_records = m.resized_records;
  out.reencoded_records = m.reencoded_records;
  return out;
}

bool IsShardfeedManifest(const std::string& text) {
  if (text.size() > kMaxManifestBytes) return false;
  ShapeScan scan;
  return !text.empty() && text.find_first_not_of(" \t\r\n") != std::string::npos &&
         text[text.find_first_not_of(" \t\r\n")] == '{' && json::sax_parse(text, &scan) &&
         scan.format == kFormatName;
}

Result<uint64_t> CountManifestShards(const std::string& text, const std::string& origin) {
  if (text.size() > kMaxManifestBytes) {
    return Status::Corrupt(origin, ": ", text.size(), " bytes, more than a manifest may hold (",
                           kMaxManifestBytes, ")");
  }
  ShapeScan scan;
  if (!json::sax_parse(text, &scan)) {
    return Status::Corrupt(origin, ": not JSON, or nested deeper than ", kMaxManifestDepth,
                           " levels");
  }
  return scan.shards;
}

Status CheckClassNames(const std::vector<std::string>& names) {
  for (size_t c = 0; c < names.size(); ++c) {
    const std::string& n = names[c];
    if (ValidUtf8(reinterpret_cast<const uint8_t*>(n.data()), n.size())) continue;
    return Status::InvalidArgument(
        "class ", c, " name ", json(n).dump(-1, ' ', false, json::error_handler_t::replace),
        " is not valid UTF-8 (a class folder's or label's name); class names are stored as "
        "UTF-8 text: rename it");
  }
  return Status::OK();
}

std::string Manifest::ToJson() const {
  json shards_json = json::array();
  for (const ShardInfo& s : shards) {
    json entry = {{"file", s.file},
                  {"first_sample", s.first_sample},
                  {"sample_count", s.sample_count},
                  {"chunk_count", s.chunk_count},
                  {"payload_bytes", s.payload_bytes},
                  {"file_bytes", s.file_bytes},
                  {"xxh3", HashToHex(s.content_hash)}};
    if (s.header_override) {
      entry["header"] = {{"shard_number", s.header_number},
                         {"first_sample", s.header_first_sample}};
    }
    shards_json.push_back(std::move(entry));
  }
  json options = json::object();
  if (!options_json.empty()) options = json::parse(options_json, nullptr, false);
  if (options.is_discarded()) options = json::object();
  json j = {{"format", std::string(kFormatName)},
            {"format_version", format_version},
            {"backend", std::string(BackendName(backend))},
            {"encoding", std::string(EncodingName(encoding))},
            {"sample_count", sample_count},
            {"class_names", class_names},
            {"class_counts", class_counts},
            {"shape", height ? json::array({height, width, channels}) : json(nullptr)},
            {"source_bytes", source_bytes},
            {"created_by", created_by},
            {"created_at", created_at},
            {"options", options},
            {"shards", shards_json}};
  if (class_counts.empty()) j.erase("class_counts");  // unknown (accepted as absent on read)
  if (format_version >= 4) j["fields"] = json::parse(schema.ToJson());
  if (resized_records) j["resized_records"] = *resized_records;
  if (reencoded_records) j["reencoded_records"] = *reencoded_records;
  if (is_part) {
    j["part"] = {{"index", part.index},
                 {"count", part.count},
                 {"first_item", part.first_item},
                 {"total_items", part.total_items},
                 {"source_fingerprint", HashToHex(part.source_fingerprint)},
                 {"options_fingerprint", HashToHex(part.options_fingerprint)}};
  }
  if (format_version >= 2) j[kChecksumField] = HashToHex(ManifestChecksum(j));
  return j.dump(2) + "\n";
}

namespace {

// The parts of Manifest::FromJson, in the order the fields are checked. Each may throw
// json::exception (caught there).
// format, version, checksum (version >= 2), backend, encoding, sample count.
Status ParseIdentity(const json& j, const std::string& origin, Manifest& m) {
  std::string format;
  if (!Get(j, "format", &format, origin).ok() || format != kFormatName) {
    return Status::Corrupt(origin, ": not a shardfeed manifest (\"format\" is not \"shardfeed\")");
  }
  SF_RETURN_IF_ERROR(Get(j, "format_version", &m.format_version, origin));
  if (!IsReadableVersion(m.format_version)) {
    return Status::Unsupported(origin, ": format version ", m.format_version,
                               ", this build reads versions ", kMinFormatVersion, " to ",
                               kFormatVersion);
  }
  if (m.format_version >= 2) {
    std::string stored;
    uint64_t want = 0;
    SF_RETURN_IF_ERROR(Get(j, kChecksumField, &stored, origin));
    if (!HexToHash(stored, &want)) {
      return Status::Corrupt(origin, ": malformed ", kChecksumField);
    }
    const uint64_t got = ManifestChecksum(j);
    if (got != want) {
      return Status::ChecksumMismatch(origin, ": manifest checksum mismatch (stored ", stored,
                                      ", computed ", HashToHex(got),
                                      "): the manifest was changed after packing");
    }
  }
  std::string backend, encoding;
  SF_RETURN_IF_ERROR(Get(j, "backend", &backend, origin));
  if (!ParseBackend(backend, &m.backend)) {
    return Status::Corrupt(origin, ": unknown backend \"", backend, "\"");
  }
  SF_RETURN_IF_ERROR(Get(j, "encoding", &encoding, origin));
  if (!ParseEncoding(encoding, &m.encoding) ||
      (m.encoding == Encoding::kAuto && m.format_version < 3)) {
    return Status::Corrupt(origin, ": unknown encoding \"", encoding, "\" for version ",
                           m.format_version);
  }
  SF_RETURN_IF_ERROR(Get(j, "sample_count", &m.sample_count, origin));
  return Status::OK();
}

// fields (version 4, required): the schema in its manifest form (a list); before: Legacy().
Status ParseFields(const json& j, const std::string& origin, Manifest& m) {
  if (m.format_version < 4) return Status::OK();
  auto it = j.find("fields");
  if (it == j.end()) return Status::Corrupt(origin, ": missing field \"fields\" (version 4)");
  if (!it->is_array()) return Status::Corrupt(origin, ": fields is not a list");
  auto schema = Schema::FromJson(it->dump(-1, ' ', false, json::error_handler_t::replace));
  if (!schema.ok()) return Status::Corrupt(origin, ": fields: ", schema.status().message());
  m.schema = std::move(*schema);
  return Status::OK();
}

// class_names, and class_counts when present (one per class, adding up). Without a class field
// (version 4) every label is 0 and there are no counts; class names are optional (e.g. the names
// of a per-box label field).
Status ParseClasses(const json& j, const std::string& origin, Manifest& m) {
  const json& names = j.at("class_names");
  if (!names.is_array()) return Status::Corrupt(origin, ": class_names is not a list");
  // No writer names more (layout.h): a list past it is crafted, and costs memory to hold.
  if (names.size() > static_cast<size_t>(kMaxClassId) + 1) {
    return Status::Corrupt(origin, ": ", names.size(), " class names, more than the ",
                           kMaxClassId + 1, " an archive may have");
  }
  for (const json& n : names) {
    if (!n.is_string()) return Status::Corrupt(origin, ": a class name is not a string");
    m.class_names.push_back(n.get<std::string>());
  }
  const bool labelled = m.schema.label_field() >= 0;
  if (labelled && m.class_names.empty() && m.sample_count > 0) {
    return Status::Corrupt(origin, ": samples but no class names");
  }
  if (auto it = j.find("class_counts"); it != j.end()) {
    if (!labelled) {
      return Status::Corrupt(origin, ": class_counts, but the fields have no class field (label)");
    }
    if (!it->is_array() || it->size() != m.class_names.size()) {
      return Status::Corrupt(origin, ": class_counts is not a list of ", m.class_names.size(),
                             " counts");
    }
    uint64_t total = 0;
    for (const json& c : *it) {
      if (!c.is_number_unsigned()) return Status::Corrupt(origin, ": a class count is not a count");
      m.class_counts.push_back(c.get<uint64_t>());
      if (__builtin_add_overflow(total, m.class_counts.back(), &total)) total = ~uint64_t{0};
    }
    if (total != m.sample_count) {
      return Status::Corrupt(origin, ": class_counts add up to ", total, ", sample_count is ",
                             m.sample_count);
    }
  }
  return Status::OK();
}

// shape: [height, width, 3] or null (JPEG only from version 3).
Status ParseShape(const json& j, const std::string& origin, Manifest& m) {
  if (auto it = j.find("shape"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != 3 || !(*it)[0].is_number_unsigned() ||
        !(*it)[1].is_number_unsigned() || !(*it)[2].is_number_unsigned()) {
      return Status::Corrupt(origin, ": shape is not [height, width, channels]");
    }
    const uint64_t h = (*it)[0].get<uint64_t>(), w = (*it)[1].get<uint64_t>(),
                   c = (*it)[2].get<uint64_t>();
    if (h == 0 || w == 0 || h > 65535 || w > 65535 || c != 3) {
      return Status::Corrupt(origin, ": shape ", h, "x", w, "x", c,
                             " is not a stored image shape (1..65535 x 1..65535 x 3)");
    }
    if (m.encoding == Encoding::kJpeg && m.format_version < 3) {
      return Status::Corrupt(origin, ": a version ", m.format_version,
                             " manifest records a shape only for raw or zstd records");
    }
    m.height = static_cast<uint32_t>(h);
    m.width = static_cast<uint32_t>(w);
    m.channels = static_cast<uint32_t>(c);
  }
  return Status::OK();
}

// source_bytes, created_by/at, resized/reencoded_records, options.
Status ParseOptionalFields(const json& j, const std::string& origin, Manifest& m) {
  SF_RETURN_IF_ERROR(Get(j, "source_bytes", &m.source_bytes, origin, false));
  SF_RETURN_IF_ERROR(Get(j, "created_by", &m.created_by, origin, false));
  SF_RETURN_IF_ERROR(Get(j, "created_at", &m.created_at, origin, false));
  if (auto it = j.find("resized_records"); it != j.end()) {
    if (!it->is_number_unsigned() || it->get<uint64_t>() > m.sample_count) {
      return Status::Corrupt(origin, ": resized_records is not a count of at most sample_count");
    }
    m.resized_records = it->get<uint64_t>();
  }
  if (auto it = j.find("reencoded_records"); it != j.end()) {
    if (!it->is_number_unsigned() || it->get<uint64_t>() > m.sample_count) {
      return Status::Corrupt(origin, ": reencoded_records is not a count of at most sample_count");
    }
    m.reencoded_records = it->get<uint64_t>();
  }
  if (auto it = j.find("options"); it != j.end()) {
    if (!it->is_object()) return Status::Corrupt(origin, ": options is not an object");
    m.options_json = it->dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return Status::OK();
}

// shards: plain file names tiling [0, sample_count).
Status ParseShards(const json& j, const std::string& origin, Manifest& m) {
  const json& shards = j.at("shards");
  if (!shards.is_array() || shards.empty()) {
    return Status::Corrupt(origin, ": shards is not a non-empty list");
  }
  uint64_t next = 0;
  for (const json& s : shards) {
    if (!s.is_object()) return Status::Corrupt(origin, ": a shard entry is not an object");
    ShardInfo info;
    SF_RETURN_IF_ERROR(Get(s, "file", &info.file, origin));
    // No NUL either: the C string a file is opened by would end there (another file's name).
    if (info.file.empty() || info.file.find_first_of(std::string("/\0", 2)) != std::string::npos ||
        info.file[0] == '.') {
      return Status::Corrupt(origin, ": shard file name ",
                             json(info.file).dump(-1, ' ', false, json::error_handler_t::replace),
                             " is not a plain name");
    }
    const std::string where = origin + ": shard " + info.file;
    SF_RETURN_IF_ERROR(Get(s, "first_sample", &info.first_sample, where));
    SF_RETURN_IF_ERROR(Get(s, "sample_count", &info.sample_count, where));
    SF_RETURN_IF_ERROR(Get(s, "chunk_count", &info.chunk_count, where));
    SF_RETURN_IF_ERROR(Get(s, "payload_bytes", &info.payload_bytes, where, false));
    SF_RETURN_IF_ERROR(Get(s, "file_bytes", &info.file_bytes, where, false));
    info.sizes_recorded = s.contains("payload_bytes") && s.contains("file_bytes");
    std::string hash;
    SF_RETURN_IF_ERROR(Get(s, "xxh3", &hash, where));
    if (!HexToHash(hash, &info.content_hash)) {
      return Status::Corrupt(where, " has a malformed xxh3");
    }
    if (auto h = s.find("header"); h != s.end()) {
      if (!h->is_object()) return Status::Corrupt(where, ": header is not an object");
      info.header_override = true;
      SF_RETURN_IF_ERROR(Get(*h, "shard_number", &info.header_number, where + ": header"));
      SF_RETURN_IF_ERROR(Get(*h, "first_sample", &info.header_first_sample, where + ": header"));
    }
    if (info.first_sample != next) {
      return Status::Corrupt(where, " starts at sample ", info.first_sample, ", expected ", next);
    }
    if (__builtin_add_overflow(next, info.sample_count, &next)) {
      return Status::Corrupt(where, ": sample counts overflow");
    }
    m.shards.push_back(std::move(info));
  }
  if (next != m.sample_count) {
    return Status::Corrupt(origin, ": shards hold ", next, " samples, manifest says ",
                           m.sample_count);
  }
  return Status::OK();
}

// part (pack --part I/N), when present.
Status ParsePart(const json& j, const std::string& origin, Manifest& m) {
  if (auto it = j.find("part"); it != j.end()) {
    if (!it->is_object()) return Status::Corrupt(origin, ": part is not an object");
    const std::string where = origin + ": part";
    m.is_part = true;
    std::string source, options;
    SF_RETURN_IF_ERROR(Get(*it, "index", &m.part.index, where));
    SF_RETURN_IF_ERROR(Get(*it, "count", &m.part.count, where));
    SF_RETURN_IF_ERROR(Get(*it, "first_item", &m.part.first_item, where));
    SF_RETURN_IF_ERROR(Get(*it, "total_items", &m.part.total_items, where));
    SF_RETURN_IF_ERROR(Get(*it, "source_fingerprint", &source, where));
    SF_RETURN_IF_ERROR(Get(*it, "options_fingerprint", &options, where));
    if (!HexToHash(source, &m.part.source_fingerprint) ||
        !HexToHash(options, &m.part.options_fingerprint) || m.part.count == 0 ||
        m.part.index >= m.part.count || m.part.first_item > m.part.total_items) {
      return Status::Corrupt(where, " is malformed");
    }
  }
  return Status::OK();
}

}  // namespace

Result<Manifest> Manifest::FromJson(const std::string& text, const std::string& origin) {
  if (text.size() > kMaxManifestBytes) {
    return Status::Corrupt(origin, ": ", text.size(), " bytes, more than a manifest may hold (",
                           kMaxManifestBytes, ")");
  }
  if (JsonDepth(text.data(), text.size()) > kMaxManifestDepth) {  // before any recursion
    return Status::Corrupt(origin, ": JSON nested deeper than ", kMaxManifestDepth, " levels");
  }
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::Corrupt(origin, ": not a JSON object");
  }
  Manifest m;
  try {
    SF_RETURN_IF_ERROR(ParseIdentity(j, origin, m));
    SF_RETURN_IF_ERROR(ParseFields(j, origin, m));
    SF_RETURN_IF_ERROR(ParseClasses(j, origin, m));
    SF_RETURN_IF_ERROR(ParseShape(j, origin, m));
    SF_RETURN_IF_ERROR(ParseOptionalFields(j, origin, m));
    SF_RETURN_IF_ERROR(ParseShards(j, origin, m));
    SF_RETURN_IF_ERROR(ParsePart(j, origin, m));
  } catch (const json::exception& e) {
    return Status::Corrupt(origin, ": malformed manifest: ", e.what());
  }
  return m;
}

}  // namespace shardfeed::format
