#include "shardfeed/format/stats_record.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace shardfeed::format {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kMaxStatsBytes = 1 << 16;

std::string StatsPath(const Archive& archive) {
  return (fs::path(archive.path()) / kStatsFileName).string();
}

}  // namespace

uint64_t ArchiveFingerprint(const Archive& archive) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  const uint64_t n = archive.size();
  XXH3_64bits_update(st, &n, sizeof n);
  for (const ShardInfo& s : archive.manifest().shards) {
    XXH3_64bits_update(st, &s.content_hash, sizeof s.content_hash);
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

Status WriteStatsRecord(const Archive& archive, const StatsRecord& r) {
  if (archive.path().find("://") != std::string::npos) {
    return Status::InvalidArgument(archive.path(),
                                   ": stats --save writes beside a local archive only");
  }
  const json j = {{"format", "shardfeed-stats"},
                  {"version", 1},
                  {"mean", r.mean},
                  {"std", r.std},
                  {"size", r.size},
                  {"samples", r.samples},
                  {"archive_fingerprint", HashToHex(r.fingerprint)}};
  const std::string text = j.dump(2) + "\n";
  const std::string path = StatsPath(archive);
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IOError(tmp, ": ", std::strerror(errno));
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t w = ::write(fd, text.data() + off, text.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return Status::IOError(tmp, ": ", std::strerror(err));
    }
    off += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return Status::IOError(path, ": ", std::strerror(err));
  }
  return Status::OK();
}

Result<StatsRecord> ReadStatsRecord(const Archive& archive) {
  const std::string path = StatsPath(archive);
  if (archive.path().find("://") != std::string::npos) {
    return Status::InvalidArgument(archive.path(), ": mean=\"archive\" reads ", kStatsFileName,
                                   " of a local archive only; give mean and std as numbers");
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return Status::NotFound(path, ": no saved statistics; run `shardfeed stats ", archive.path(),
                            " --save` first");
  }
  std::string text(kMaxStatsBytes + 1, '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(f.gcount()));
  if (text.size() > kMaxStatsBytes) return Status::Corrupt(path, ": larger than 64 KiB");
  const json j = json::parse(text, nullptr, false);
  auto bad = [&](const char* what) { return Status::Corrupt(path, ": ", what); };
  if (!j.is_object() || j.value("format", "") != "shardfeed-stats") {
    return bad("not a shardfeed statistics record");
  }
  if (j.value("version", 0) != 1) return bad("unknown version (this build reads 1)");
  StatsRecord r;
  for (const char* key : {"mean", "std"}) {
    const json& v = j.contains(key) ? j[key] : json();
    if (!v.is_array() || v.size() != 3) return bad("mean and std are three numbers");
    for (int c = 0; c < 3; ++c) {
      if (!v[c].is_number() || !std::isfinite(v[c].get<double>())) {
        return bad("mean and std are three finite numbers");
      }
      (key[0] == 'm' ? r.mean : r.std)[c] = v[c].get<double>();
    }
  }
  if (!j.contains("size") || !j["size"].is_number_unsigned() || !j.contains("samples") ||
      !j["samples"].is_number_unsigned() || !j.contains("archive_fingerprint") ||
      !j["archive_fingerprint"].is_string() ||
      !HexToHash(j["archive_fingerprint"].get<std::string>(), &r.fingerprint)) {
    return bad("size, samples and archive_fingerprint are required");
  }
  r.size = j["size"].get<uint32_t>();
  r.samples = j["samples"].get<uint64_t>();
  if (r.fingerprint != ArchiveFingerprint(archive)) {
    return Status::InvalidArgument(path,
                                   ": describes another state of the archive (its records "
                                   "changed since stats --save); run `shardfeed stats ",
                                   archive.path(), " --save` again");
  }
  return r;
}

}  // namespace shardfeed::format
