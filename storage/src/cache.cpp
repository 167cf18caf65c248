// The bounded shard cache: download under a per-file lock, verify, rename; hold with a shared
// flock; evict least recently used files that nobody holds. See remote.h.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "http.h"
#include "shardfeed/base/option_text.h"
#include "shardfeed/storage/remote.h"

namespace shardfeed::storage {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::mutex g_options_mutex;
CacheOptions g_options;

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// flock() with a bound: polls LOCK_NB (a lock is held for one download at most). false on time out
// or once `cancel` (may be null) is cancelled.
bool LockWithin(int fd, int op, double seconds, const CancelToken* cancel = nullptr) {
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  auto pause = std::chrono::milliseconds(1);
  while (::flock(fd, op | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) return false;
    if (Clock::now() >= until || Cancelled(cancel)) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  return true;
}

double WaitBound() {
  const char* v = std::getenv("SHARDFEED_FETCH_WAIT");  // checked at open (RetryFromEnv)
  return v && *v ? std::atof(v) : 900.0;
}

// A short stable key for a location: FNV-1a 64, in hex.
std::string KeyOf(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

bool EndsWith(const std::string& s, const char* tail) {
  const size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

// Opens `path` and holds it with a shared flock, if it still names the same file once locked
// (an evictor may have unlinked it between open and flock). Touches its time for the LRU order.
std::unique_ptr<CachedFile> Hold(const std::string& path, bool downloaded = false) {
  for (int tries = 0; tries < 3; ++tries) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return nullptr;
    struct stat held {
    }, named{};
    // Only a regular file is ever ours: a folder or device someone put at this name is not
    // held (a download then fails to rename over it, naming it, and leaves it alone).
    if (::fstat(fd, &held) != 0 || !S_ISREG(held.st_mode) || !LockWithin(fd, LOCK_SH, 10)) {
      ::close(fd);
      return nullptr;
    }
    if (::stat(path.c_str(), &named) == 0 && named.st_ino == held.st_ino &&
        named.st_dev == held.st_dev) {
      ::futimens(fd, nullptr);  // least recently used first: mtime is the last use
      return std::make_unique<CachedFile>(path, fd, downloaded);
    }
    ::close(fd);
  }
  return nullptr;
}

struct Entry {
  std::string path;
  uint64_t bytes;
  int64_t used_ns;
};

// One cache file for Survey: its bytes (0 for a ".part" file of a dead downloader, which is
// removed); a finished file also goes to `entries`.
uint64_t Count(const std::string& path, std::vector<Entry>* entries) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  const uint64_t bytes = std::max<uint64_t>(st.st_size, uint64_t(st.st_blocks) * 512);
  if (EndsWith(path, ".part")) {
    const std::string lock = path.substr(0, path.size() - 5) + ".lock";
    Fd fd(::open(lock.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.fd < 0 || ::flock(fd.fd, LOCK_EX | LOCK_NB) == 0) {
      ::unlink(path.c_str());  // its downloader died (or never took the lock): never used
      return 0;
    }
    return bytes;
  }
  entries->push_back({path, bytes, int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
  return bytes;
}

bool IsHex16(const std::string& s, size_t at) {
  if (s.size() < at + 16) return false;
  for (size_t i = at; i < at + 16; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (!std::isxdigit(c) || std::isupper(c)) return false;
  }
  return true;
}

// A name the cache gives its files: "<shard file>.<16 hex>" (the version, the content hash) or
// that with ".part". Anything else under the cache folder is someone else's: never counted,
// never removed.
bool IsCacheFileName(const std::string& name) {
  const size_t n = name.size() - (EndsWith(name, ".part") ? 5 : 0);
  return n > 17 && name[0] != '.' && name[n - 17] == '.' && IsHex16(name, n - 16);
}

// Bytes the cache holds now (finished files and downloads in progress), removing the ".part"
// files of dead downloaders (their ".lock" is free) on the way. Finished files go to `entries`.
// Only the cache's own files count: regular files named as IsCacheFileName says, directly in a
// location's folder (remote/<16 hex>/).
uint64_t Survey(const std::string& root, std::vector<Entry>* entries) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::directory_iterator loc(root, ec), none; !ec && loc != none; loc.increment(ec)) {
    // Queries of an entry get their own error code: one that vanished (evicted by another
    // process) must not end the listing, or the cache would be counted short.
    std::error_code entry_ec;
    const std::string key = loc->path().filename().string();
    if (key.size() != 16 || !IsHex16(key, 0) || loc->is_symlink(entry_ec) ||
        !loc->is_directory(entry_ec)) {
      continue;
    }
    std::error_code inner;
    for (fs::directory_iterator it(loc->path(), inner), end; !inner && it != end;
         it.increment(inner)) {
      if (it->is_symlink(entry_ec) || !it->is_regular_file(entry_ec)) continue;
      if (!IsCacheFileName(it->path().filename().string())) continue;
      total += Count(it->path().string(), entries);
    }
  }
  return total;
}

std::atomic<uint64_t> g_room_generation{0};

}  // namespace

uint64_t CacheRoomGeneration() { return g_room_generation.load(std::memory_order_acquire); }

CachedFile::~CachedFile() {
  if (fd_ >= 0) ::close(fd_);  // releases the shared flock
  g_room_generation.fetch_add(1, std::memory_order_acq_rel);
}

bool CachedFile::named() const {
  struct stat mine {
  }, at{};
  return ::fstat(fd_, &mine) == 0 && ::lstat(path_.c_str(), &at) == 0 && mine.st_ino == at.st_ino &&
         mine.st_dev == at.st_dev;
}

namespace {

// The scheme of a `scheme://...` location, lower-cased; "" for a plain path.
std::string SchemeOf(const std::string& location) {
  const size_t colon = location.find("://");
  if (colon == std::string::npos || colon == 0) return "";
  std::string scheme = location.substr(0, colon);
  for (char& c : scheme) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
    if (!ok) return "";
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return std::isalpha(static_cast<unsigned char>(scheme[0])) ? scheme : "";
}

}  // namespace

bool IsRemote(const std::string& location) {
  const std::string scheme = SchemeOf(location);
  return scheme == "s3" || scheme == "http" || scheme == "https";
}

Status CheckScheme(const std::string& location) {
  const std::string scheme = SchemeOf(location);
  if (scheme.empty() || IsRemote(location)) return Status::OK();
  return Status::InvalidArgument(location, ": ", scheme,
                                 ":// is not a location shardfeed reads (s3://, http:// and "
                                 "https:// are; a local archive is a folder path)");
}

void SetCacheOptions(const CacheOptions& options) {
  std::lock_guard<std::mutex> lock(g_options_mutex);
  g_options = options;
}

Result<uint64_t> ParseByteSize(const std::string& text) {
  uint64_t v = 0;
  if (!shardfeed::ParseByteSize(text, &v)) {
    return Status::InvalidArgument("\"", text,
                                   "\": expected a size in bytes such as 20GB, 512MiB or 1000000");
  }
  return v;
}

constexpr uint64_t kMinCacheLimit = 4096;

const OptionTable<CacheOptions>& CacheOptionTable() {
  using O = CacheOptions;
  static const OptionTable<O> table(
      "cache option",
      {{"cache_dir", OptionKind::kText, nullptr,
        "remote archives (s3://, http(s)://): the local cache folder (default "
        "$SHARDFEED_CACHE_DIR, else $XDG_CACHE_HOME/shardfeed, else ~/.cache/shardfeed)",
        [](O* o, std::string_view t) {
          o->dir = std::string(t);
          return Status::OK();
        },
        [](const O& o) { return o.dir; }},
       {"cache_limit", OptionKind::kBytes, nullptr,
        "remote archives: the most bytes of shard files the cache holds, e.g. 20GB or 512MiB "
        "(default $SHARDFEED_CACHE_LIMIT, else unlimited); too small for what a reader holds "
        "at once is refused at open, giving the minimum",
        [](O* o, std::string_view t) -> Status {
          if (t.empty()) return o->limit = 0, Status::OK();
          uint64_t v = 0;
          if (!shardfeed::ParseByteSize(t, &v)) {
            return BadOption("cache_limit", "a size in bytes such as 20GB, 512MiB or 1000000", t);
          }
          // 0 (or 0.5, rounded down) meant "unlimited" and 1.5 one byte: a limit holds a shard.
          if (v < kMinCacheLimit) {
            return BadOption("cache_limit", "a size of at least 4 KiB (leave it out for no limit)",
                             t);
          }
          o->limit = v;
          return Status::OK();
        },
        [](const O& o) { return o.limit ? std::to_string(o.limit) : std::string(); },
        "bytes, or a size such as 20GB or 512MiB"}});
  return table;
}

Result<CacheOptions> ResolveCacheOptions(const CacheOptions& given) {
  CacheOptions options;
  {
    std::lock_guard<std::mutex> lock(g_options_mutex);
    options = g_options;
  }
  if (!given.dir.empty()) options.dir = given.dir;
  if (given.limit != 0) options.limit = given.limit;
  if (options.dir.empty()) {
    const char* dir = std::getenv("SHARDFEED_CACHE_DIR");
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    if (dir && *dir) {
      options.dir = dir;
    } else if (xdg && *xdg) {
      options.dir = std::string(xdg) + "/shardfeed";
    } else if (home && *home) {
      options.dir = std::string(home) + "/.cache/shardfeed";
    } else {
      options.dir = "/tmp/shardfeed-cache-" + std::to_string(::getuid());
    }
  }
  if (options.limit == 0) {
    const char* limit = std::getenv("SHARDFEED_CACHE_LIMIT");
    if (limit && *limit) {
      auto parsed = ParseByteSize(limit);
      if (!parsed.ok())
        return Status::InvalidArgument("SHARDFEED_CACHE_LIMIT=", limit, ": ",
                                       parsed.status().message());
      if (*parsed < kMinCacheLimit) {
        return Status::InvalidArgument("SHARDFEED_CACHE_LIMIT=", limit,
                                       ": not a size of at least 4 KiB (unset it for no limit)");
      }
      options.limit = *parsed;
    }
  }
  return options;
}

namespace {
void TrimCache(const std::string& cache_dir, uint64_t limit);
}  // namespace

struct Remote::Impl {
  internal::Endpoint endpoint;
  FetchRetry retry;
  std::string dir;         // this location's folder in the cache
  std::once_flag trimmed;  // the cache brought within the limit, at the first Fetch
};

Remote::~Remote() = default;

Result<std::shared_ptr<Remote>> Remote::Open(const std::string& location,
                                             const CacheOptions& given) {
  SF_ASSIGN_OR_RETURN(internal::Endpoint endpoint, internal::ParseEndpoint(location));
  SF_ASSIGN_OR_RETURN(CacheOptions cache, ResolveCacheOptions(given));
  std::shared_ptr<Remote> remote(new Remote());
  remote->location_ = location;
  remote->cache_ = cache;
  remote->impl_ = std::make_unique<Impl>();
  remote->impl_->endpoint = std::move(endpoint);
  remote->impl_->endpoint.received = internal::ReceivedCounter(remote->impl_->endpoint.base);
  SF_ASSIGN_OR_RETURN(remote->impl_->retry, internal::RetryFromEnv());
  // Keyed by where the bytes come from (the URL, never a credential).
  remote->impl_->dir = cache.dir + "/remote/" + KeyOf(remote->impl_->endpoint.base);
  std::error_code ec;
  fs::create_directories(remote->impl_->dir, ec);
  if (ec) return Status::IOError("cache_dir ", cache.dir, ": ", ec.message());
  return remote;
}

uint64_t Remote::BytesReceived() const {
  return impl_->endpoint.received->load(std::memory_order_relaxed);
}

std::string Remote::UrlOf(const std::string& name) const {
  return location_ + (location_.back() == '/' ? "" : "/") + name;
}

Result<std::string> Remote::ReadText(const std::string& name, uint64_t max_bytes,
                                     const CancelToken* cancel) const {
  std::string text;
  SF_RETURN_IF_ERROR(
      internal::Get(impl_->endpoint, name, impl_->retry, -1, &text, max_bytes, cancel));
  return text;
}

Status Remote::CheckLimit(uint64_t need, const std::string& why) const {
  if (cache_.limit != 0 && cache_.limit < need) {
    return Status::ResourceExhausted("cache_limit of ", cache_.limit, " bytes is below the ", need,
                                     " bytes ", why, ": raise cache_limit to at least ", need,
                                     " (cache_dir ", cache_.dir, ")");
  }
  return Status::OK();
}

namespace {

// The cache-wide lock (an exclusive flock on <cache_dir>/.cache.lock, released with the Fd):
// every change to what the cache's files add up to that could raise it runs under it.
Result<int> LockCache(const std::string& cache_dir) {
  const int fd = ::open((cache_dir + "/.cache.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IOError(cache_dir, "/.cache.lock: ", std::strerror(errno));
  if (!LockWithin(fd, LOCK_EX, 60)) {
    ::close(fd);
    return Status::Timeout(cache_dir, "/.cache.lock: not free after 60 s");
  }
  return fd;
}

// Evicts unheld files, least recently used first, until the cache's files add up to at most
// `room` bytes, or none is left to evict; returns what they add up to then. Under the
// cache-wide lock (the caller's).
uint64_t EvictDownTo(const std::string& cache_dir, uint64_t room) {
  std::vector<Entry> entries;
  uint64_t total = Survey(cache_dir + "/remote", &entries);
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.used_ns < b.used_ns; });
  for (const Entry& e : entries) {
    if (total <= room) break;
    Fd fd(::open(e.path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.fd < 0 || ::flock(fd.fd, LOCK_EX | LOCK_NB) != 0) continue;  // in use: never evicted
    if (::unlink(e.path.c_str()) == 0) {
      g_room_generation.fetch_add(1, std::memory_order_acq_rel);
      total -= std::min(total, e.bytes);
      internal::CountStat(&FetchStats::evictions, 1);
    }
  }
  return total;
}

// The cache brought within `limit` (at Remote::Open). Best effort: a cache-wide lock not free
// within its bound leaves the cache as it is (the next download's Reserve evicts as usual).
void TrimCache(const std::string& cache_dir, uint64_t limit) {
  Result<int> locked = LockCache(cache_dir);
  if (!locked.ok()) return;
  Fd lock(*locked);
  EvictDownTo(cache_dir, limit);
}

// Creates `part` with `bytes` reserved (posix_fallocate), after evicting unheld files, least
// recently used first, until the cache stays within `limit` with it. Under the cache-wide lock,
// so concurrent downloaders count each other's reservations.
Result<int> Reserve(const std::string& cache_dir, uint64_t limit, const std::string& part,
                    uint64_t bytes, const std::string& shown) {
  SF_ASSIGN_OR_RETURN(int locked, LockCache(cache_dir));
  Fd lock(locked);
  if (limit != 0) {
    const uint64_t total = EvictDownTo(cache_dir, bytes <= limit ? limit - bytes : 0);
    if (total + bytes > limit) {
      return Status::ResourceExhausted(
          "cache ", cache_dir, " is full: ", total, " bytes held by shards in use, ", bytes,
          " more needed for ", shown, ", cache_limit ", limit,
          " (raise cache_limit, or read with fewer shards open at once)");
    }
  }
  int fd = ::open(part.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IOError(part, ": ", std::strerror(errno));
  if (bytes > 0) {
    const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (err != 0 && err != EOPNOTSUPP && err != EINVAL) {
      ::close(fd);
      ::unlink(part.c_str());
      return Status::IOError("cannot reserve ", bytes, " bytes in ", cache_dir, " for ", shown,
                             ": ", std::strerror(err),
                             err == ENOSPC ? " (the disk is full; the cache is unchanged)" : "");
    }
  }
  return fd;
}

// Bytes of one ranged GET of a big shard: SHARDFEED_FETCH_PART_BYTES (a size), default 32 MiB.
uint64_t PartBytes() {
  uint64_t v = 0;
  const char* env = std::getenv("SHARDFEED_FETCH_PART_BYTES");
  if (env && shardfeed::ParseByteSize(env, &v) && v > 0) return v;
  return uint64_t{32} << 20;
}

// The body of `name` into `fd` (reserved to `size` bytes): whole, or, above 2 parts, as ranged
// GETs of PartBytes() each, kRangedConnections at a time, each retried on its own (a server
// that ignores ranges: fetched whole instead). `cancel` stops every GET (kCancelled).
Status Download(const internal::Endpoint& endpoint, const FetchRetry& retry,
                const std::string& name, uint64_t size, int fd, const CancelToken* cancel) {
  const uint64_t part = PartBytes();
  // Whole GETs read no more than `size` bytes (an object larger than listed is not the one).
  if (size <= 2 * part) return internal::Get(endpoint, name, retry, fd, nullptr, size, cancel);
  const uint64_t parts = (size + part - 1) / part;
  std::atomic<uint64_t> next{0};
  std::mutex mu;
  Status first;
  auto work = [&] {
    for (uint64_t p; (p = next.fetch_add(1)) < parts;) {
      const uint64_t offset = p * part;
      Status s = internal::GetRange(endpoint, name, retry, fd, offset,
                                    std::min(part, size - offset), cancel);
      if (!s.ok()) {
        next.store(parts);  // the others stop after their current part
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = s;
      }
    }
  };
  const Status thrown = internal::RunOnThreads(std::min<uint64_t>(kRangedConnections, parts),
                                               "downloading " + endpoint.shown + "/" + name, work);
  SF_RETURN_IF_ERROR(thrown);
  if (first.code() == StatusCode::kUnsupported) {  // no ranges here: the whole object
    return internal::Get(endpoint, name, retry, fd, nullptr, size, cancel);
  }
  return first;
}

}  // namespace

Result<std::unique_ptr<CachedFile>> Remote::Fetch(const std::string& name, uint64_t size,
                                                  const std::string& version,
                                                  const VerifyFn& verify,
                                                  const CancelToken* cancel) const {
  if (name.find('/') != std::string::npos || !IsCacheFileName(name + "." + version)) {
    return Status::InvalidArgument(
        UrlOf(name), ": version '", version,
        "' or name not one the cache holds (16 hex digits; a file name)");
  }
  const std::string final_path = impl_->dir + "/" + name + "." + version;
  // A cache filled under a larger limit (or none) is brought within this one: its reads are
  // hits, so no download would ever evict for it. At the first Fetch, not at Open: a limit that
  // the archive's or the loader's open then refuses as too small must not empty the cache.
  std::call_once(impl_->trimmed, [&] {
    if (cache_.limit != 0) TrimCache(cache_.dir, cache_.limit);
  });
  if (auto held = Hold(final_path)) {
    internal::CountStat(&FetchStats::hits, 1);
    return held;
  }
  const auto start = Clock::now();
  struct Waited {
    Clock::time_point start;
    ~Waited() {
      internal::CountStat(
          &FetchStats::fetch_wait_ns,
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    }
  } waited{start};
  const std::string shown = UrlOf(name);
  Fd lock(::open((final_path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (lock.fd < 0) return Status::IOError(final_path, ".lock: ", std::strerror(errno));
  const bool free_now = ::flock(lock.fd, LOCK_EX | LOCK_NB) == 0;
  if (!free_now && !LockWithin(lock.fd, LOCK_EX, WaitBound(), cancel)) {
    if (Cancelled(cancel)) {
      return Status::Cancelled(shown, ": cancelled while another process downloads it");
    }
    return Status::Timeout(shown, ": another process has been downloading it for more than ",
                           WaitBound(), " s (SHARDFEED_FETCH_WAIT); its lock is ", final_path,
                           ".lock");
  }
  if (auto held = Hold(final_path, true)) {  // another process fetched it meanwhile
    internal::CountStat(&FetchStats::waits, 1);
    return held;
  }
  internal::CountStat(&FetchStats::misses, 1);
  const std::string part = final_path + ".part";
  for (int attempt = 0;; ++attempt) {
    SF_ASSIGN_OR_RETURN(int raw, Reserve(cache_.dir, cache_.limit, part, size, shown));
    Fd fd(raw);
    Status got = Download(impl_->endpoint, impl_->retry, name, size, fd.fd, cancel);
    struct stat st {};
    if (got.ok() && ::fstat(fd.fd, &st) == 0 && uint64_t(st.st_size) != size) {
      got = Status::ChecksumMismatch(shown, ": ", st.st_size, " bytes received, the manifest says ",
                                     size, kNotTheListedObject);
    }
    if (got.ok() && ::fdatasync(fd.fd) != 0) {
      got = Status::IOError(part, ": ", std::strerror(errno));
    }
    if (got.ok()) got = verify(part);
    if (got.ok()) {
      // Under the cache-wide lock: a Survey listing the folder between the rename and its stat
      // of the names it listed would find neither the .part (gone) nor the file (not listed),
      // count the cache a shard short and let a download take the cache over its limit.
      Result<int> locked = LockCache(cache_.dir);
      if (!locked.ok()) {
        got = locked.status();
      } else if (Fd cache_lock(*locked); ::rename(part.c_str(), final_path.c_str()) != 0) {
        got = Status::IOError(part, ": rename: ", std::strerror(errno));
      } else if (auto held = Hold(final_path, true)) {
        return held;
      } else {
        got = Status::IOError(final_path, ": removed as soon as downloaded (cache too small?)");
      }
    }
    ::unlink(part.c_str());  // a damaged or partial body is never used
    g_room_generation.fetch_add(1, std::memory_order_acq_rel);  // its reservation given back
    if (got.code() != StatusCode::kChecksumMismatch || attempt >= 1) return got;
  }
}

Status Remote::Discard(const CachedFile& held, bool* removed) const {
  if (removed) *removed = false;
  const std::string& path = held.path();
  if (!held.named()) return Status::OK();  // already gone, or replaced by a fresh download
  Fd lock(::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (lock.fd < 0) return Status::IOError(path, ".lock: ", std::strerror(errno));
  // Short: a reader waits here, for a process about to take this copy as a cache hit.
  if (!LockWithin(lock.fd, LOCK_EX, 10)) {
    return Status::Timeout(path, ".lock: still held by another process after 10 s");
  }
  if (!held.named()) return Status::OK();
  if (::unlink(path.c_str()) != 0) {
    return Status::IOError(path, ": cannot remove the damaged cached copy: ", std::strerror(errno));
  }
  if (removed) *removed = true;
  g_room_generation.fetch_add(1, std::memory_order_acq_rel);
  internal::CountStat(&FetchStats::discards, 1);
  return Status::OK();
}

}  // namespace shardfeed::storage
