#include "shardfeed/format/manifest.h"

#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>

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
  }
  return "unknown";
}

bool ParseEncoding(std::string_view name, Encoding* out) {
  for (Encoding e : {Encoding::kJpeg, Encoding::kRaw, Encoding::kZstd}) {
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

std::string Manifest::ToJson() const {
  json shards_json = json::array();
  for (const ShardInfo& s : shards) {
    shards_json.push_back({{"file", s.file},
                           {"first_sample", s.first_sample},
                           {"sample_count", s.sample_count},
                           {"chunk_count", s.chunk_count},
                           {"payload_bytes", s.payload_bytes},
                           {"file_bytes", s.file_bytes},
                           {"xxh3", HashToHex(s.content_hash)}});
  }
  json options = json::object();
  if (!options_json.empty()) options = json::parse(options_json, nullptr, false);
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
  return j.dump(2) + "\n";
}

Result<Manifest> Manifest::FromJson(const std::string& text, const std::string& origin) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::Corrupt(origin, ": not a JSON object");
  }
  Manifest m;
  try {
    if (j.value("format", std::string()) != kFormatName) {
      return Status::Corrupt(origin,
                             ": not a shardfeed manifest (\"format\" is not \"shardfeed\")");
    }
    m.format_version = j.at("format_version").get<uint32_t>();
    if (m.format_version != kFormatVersion) {
      return Status::Unsupported(origin, ": format version ", m.format_version,
                                 ", this build reads version ", kFormatVersion);
    }
    if (!ParseBackend(j.at("backend").get<std::string>(), &m.backend)) {
      return Status::Corrupt(origin, ": unknown backend ", j.at("backend").dump());
    }
    if (!ParseEncoding(j.at("encoding").get<std::string>(), &m.encoding)) {
      return Status::Corrupt(origin, ": unknown encoding ", j.at("encoding").dump());
    }
    m.sample_count = j.at("sample_count").get<uint64_t>();
    m.class_names = j.at("class_names").get<std::vector<std::string>>();
    m.class_counts = j.value("class_counts", std::vector<uint64_t>());
    if (j.contains("shape") && j["shape"].is_array() && j["shape"].size() == 3) {
      m.height = j["shape"][0].get<uint32_t>();
      m.width = j["shape"][1].get<uint32_t>();
      m.channels = j["shape"][2].get<uint32_t>();
    }
    m.source_bytes = j.value("source_bytes", uint64_t{0});
    m.created_by = j.value("created_by", std::string());
    m.created_at = j.value("created_at", std::string());
    if (j.contains("options")) m.options_json = j["options"].dump();
    uint64_t next = 0;
    for (const json& s : j.at("shards")) {
      ShardInfo info;
      info.file = s.at("file").get<std::string>();
      if (info.file.empty() || info.file.find('/') != std::string::npos || info.file[0] == '.') {
        return Status::Corrupt(origin, ": shard file name \"", info.file, "\" is not a plain name");
      }
      info.first_sample = s.at("first_sample").get<uint64_t>();
      info.sample_count = s.at("sample_count").get<uint64_t>();
      info.chunk_count = s.at("chunk_count").get<uint64_t>();
      info.payload_bytes = s.value("payload_bytes", uint64_t{0});
      info.file_bytes = s.value("file_bytes", uint64_t{0});
      if (!HexToHash(s.at("xxh3").get<std::string>(), &info.content_hash)) {
        return Status::Corrupt(origin, ": shard ", info.file, " has a malformed xxh3");
      }
      if (info.first_sample != next) {
        return Status::Corrupt(origin, ": shard ", info.file, " starts at sample ",
                               info.first_sample, ", expected ", next);
      }
      next += info.sample_count;
      m.shards.push_back(std::move(info));
    }
    if (next != m.sample_count) {
      return Status::Corrupt(origin, ": shards hold ", next, " samples, manifest says ",
                             m.sample_count);
    }
  } catch (const json::exception& e) {
    return Status::Corrupt(origin, ": malformed manifest: ", e.what());
  }
  return m;
}

}  // namespace shardfeed::format
