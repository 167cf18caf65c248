#include "shardfeed/format/stats_record.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardfeed/base/file_io.h"

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

namespace {

void (*before_final_step_hook)(const std::string&) = nullptr;  // SetStatsBeforeFinalStepHookForTest

}  // namespace

// Why the file at `path` is not a record of ours ("" when it is: a regular file of at most
// 64 KiB holding a JSON object with "format": "shardfeed-stats"), read through one descriptor
// opened without following a link, so what is judged is what is at `path` now.
std::string WhyNotOurStatsRecord(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return errno == ELOOP ? "a symbolic link" : std::string("unreadable: ") + std::strerror(errno);
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return "not a regular file";
  }
  std::string text(kMaxStatsBytes + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t r = ::read(fd, text.data() + got, text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      return std::string("unreadable: ") + std::strerror(err);
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  if (got > kMaxStatsBytes) return "larger than 64 KiB";
  text.resize(got);
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("format") || j["format"] != "shardfeed-stats") {
    return "no \"format\": \"shardfeed-stats\"";
  }
  return "";
}

namespace {

Status NotOurs(const std::string& path, const std::string& why, const char* when = "exists") {
  return Status::InvalidArgument(path, ": ", when,
                                 " and was not written by shardfeed stats --save (", why,
                                 "); not replacing it: move it away to save statistics");
}

bool FlagsUnsupported(int err) { return err == EINVAL || err == ENOSYS || err == EOPNOTSUPP; }

int Rename2(const std::string& from, const std::string& to, unsigned flags) {
  return ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags);
}

bool SameFile(const std::string& path, const struct stat& a) {
  struct stat b;
  return ::lstat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Moves the finished temporary record `tmp` (`mine`: its stat) to `path`, never over a file that
// is not provably ours. See WriteStatsRecord in the header for the guarantees.
Status PlaceRecord(const std::string& tmp, const struct stat& mine, const std::string& path) {
  // A few rounds: a record of ours that vanishes or appears meanwhile (another stats --save)
  // sends the next round down the other branch.
  for (int round = 0; round < 4; ++round) {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno != ENOENT) return Status::IOError(path, ": ", std::strerror(errno));
      // None: create it, atomically never over a file that appeared since.
      if (before_final_step_hook) before_final_step_hook(path);
      if (Rename2(tmp, path, RENAME_NOREPLACE) == 0) return Status::OK();
      int err = errno;
      if (FlagsUnsupported(err)) {
        // No RENAME_NOREPLACE on this file system: link() never replaces either.
        if (::link(tmp.c_str(), path.c_str()) == 0) {
          ::unlink(tmp.c_str());
          return Status::OK();
        }
        err = errno;
        if (err == EPERM || err == EOPNOTSUPP || err == ENOSYS) {
          // Nor hard links (FAT, some FUSE): check once more, then rename (the residual window).
          if (::lstat(path.c_str(), &st) == 0) continue;
          if (::rename(tmp.c_str(), path.c_str()) == 0) return Status::OK();
          err = errno;
        }
      }
      if (err == EEXIST) {
        const std::string why = WhyNotOurStatsRecord(path);
        if (why.empty()) continue;  // another stats --save: replace that one
        return NotOurs(path, why, "appeared while saving");
      }
      return Status::IOError(path, ": cannot move ", tmp, " into place: ", std::strerror(err));
    }
    // One exists: replaced only if ours.
    if (const std::string why = WhyNotOurStatsRecord(path); !why.empty()) return NotOurs(path, why);
    if (before_final_step_hook) before_final_step_hook(path);
    // Exchange, then judge what came out: ours is removed; anything else (a file put there since
    // the check above) is exchanged back, so that no file not ours is ever removed.
    if (Rename2(tmp, path, RENAME_EXCHANGE) == 0) {
      const std::string why = WhyNotOurStatsRecord(tmp);
      if (why.empty()) {
        ::unlink(tmp.c_str());
        return Status::OK();
      }
      if (Rename2(tmp, path, RENAME_EXCHANGE) != 0 || !SameFile(tmp, mine)) {
        // Something changed `path` again in between: leave both where they are, and say where.
        return Status::IOError(path, ": was replaced while saving; the file found there (", why,
                               ") is now ", tmp, ": move it back by hand");
      }
      ::unlink(tmp.c_str());
      return NotOurs(path, why, "appeared while saving");
    }
    const int err = errno;
    if (err == ENOENT) continue;  // gone since the check: create it
    if (!FlagsUnsupported(err)) {
      return Status::IOError(path, ": cannot swap in ", tmp, ": ", std::strerror(err));
    }
    // No RENAME_EXCHANGE on this file system: check once more, then replace. A file put there
    // between this check and the rename would be replaced (the window documented in the header).
    if (const std::string why = WhyNotOurStatsRecord(path); !why.empty()) {
      return NotOurs(path, why, "appeared while saving");
    }
    if (::rename(tmp.c_str(), path.c_str()) == 0) return Status::OK();
    return Status::IOError(path, ": cannot move ", tmp, " into place: ", std::strerror(errno));
  }
  return Status::IOError(path, ": kept changing while saving; try again");
}

}  // namespace

namespace internal {
void SetStatsBeforeFinalStepHookForTest(void (*hook)(const std::string& path)) {
  before_final_step_hook = hook;
}
}  // namespace internal

Status CheckStatsRecordReplaceable(const Archive& archive) {
  if (archive.path().find("://") != std::string::npos) return Status::OK();  // Write refuses
  const std::string path = StatsPath(archive);
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) return Status::OK();
  if (const std::string why = WhyNotOurStatsRecord(path); !why.empty()) return NotOurs(path, why);
  return Status::OK();
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
  if (const int err = WriteAll(fd, text.data(), text.size()); err != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return Status::IOError(tmp, ": ", std::strerror(err));
  }
  struct stat mine;
  if (::fstat(fd, &mine) != 0 || ::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return Status::IOError(tmp, ": ", std::strerror(err));
  }
  Status placed = PlaceRecord(tmp, mine, path);
  if (!placed.ok() && SameFile(tmp, mine)) ::unlink(tmp.c_str());
  return placed;
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
