// Archives in object storage (s3://bucket/prefix) or on a web server (http(s)://host/path),
// read through a bounded local cache of whole shard files. Below format/: it knows files and
// bytes, never the archive format (format hands it a verify callback per shard).
//
// Locations. `s3://bucket/prefix`: credentials, region and endpoint come from the standard AWS
// variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION or
// AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL) or, without a key in the
// environment, from AWS_PROFILE's section (default "default") of AWS_SHARED_CREDENTIALS_FILE
// (default ~/.aws/credentials). Requests are signed with SigV4 by libcurl (CURLOPT_AWS_SIGV4);
// no credentials at all: unsigned requests (public buckets). Addressing: SHARDFEED_S3_ADDRESSING
// = "path" or "virtual"; by default path-style for a custom endpoint (MinIO, moto, R2, GCS) and
// virtual-host style for AWS itself. `http://` and `https://`: plain GETs of <location>/<file>.
//
// The cache (docs/REMOTE.md). A shard is downloaded whole into <cache_dir>/<archive key>/ under a
// temporary name (".part"), checked with the caller's verify callback (the shard's content hash
// from the manifest), then renamed into place: a partial or damaged download is never opened.
// One process downloads a shard at a time (flock on "<file>.lock"; a dead owner's lock is released
// by the kernel, so the next process takes over and discards its ".part"); others wait, bounded.
// A file handed out (CachedFile) is held with a shared flock for as long as it lives; eviction
// (least recently used first) removes only files it can lock exclusively, so a shard in use is
// never removed. The cache never holds more than `limit` bytes of shard files: room is reserved
// (posix_fallocate) before a download starts, so a full disk fails then, cleanly; and the first
// Fetch of a Remote opened with a limit evicts unheld files down to it (a cache filled under a
// larger limit).
//
// Faults. Connection failures, timeouts, resets, short bodies, HTTP 5xx and 429 are retried with
// exponential backoff and full jitter: `retries` attempts after the first (default 6), delays
// 0.25 s doubling to at most 8 s (about 30 s in all); a transfer that moves under 1 byte/s for
// 30 s counts as a timeout. HTTP 403 and 404 fail at once with the URL (never a secret). A body
// that fails verification is discarded and fetched once more, then kChecksumMismatch.
//
// Cancel. ReadText and Fetch take a CancelToken (base/cancel.h; the caller owns it, null: not
// cancellable). Once it is cancelled, a request in flight is abandoned at libcurl's next progress
// callback (within about a second, even while the server sends nothing), a retry's back-off and a
// wait for another process's download end, and the call returns kCancelled: a download's ".part"
// file is removed and its reserved room given back, nothing is renamed into the cache, and copies
// already in the cache stay as they are. Without a token a transfer runs as it always did (no
// progress callback is set).
//
// Big shards. A shard above 2 parts of SHARDFEED_FETCH_PART_BYTES (default 32 MiB, so above
// 64 MiB) is fetched as ranged GETs of one part each, kRangedConnections at a time, written into
// the ".part" file at their offsets; each part is retried on its own, and the whole file is
// verified as above before it is renamed. A server that ignores ranges: fetched whole.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "shardfeed/base/cancel.h"
#include "shardfeed/base/option_table.h"
#include "shardfeed/base/status.h"

namespace shardfeed::storage {

// True for s3://, http:// and https:// locations (anything Remote::Open takes).
bool IsRemote(const std::string& location);

// A location that has a URL's form (`scheme://`) but not a scheme shardfeed reads (gs://,
// file://, ...): an error saying so, rather than "no such archive" for a local path of that
// name. OK for remote locations and plain paths.
Status CheckScheme(const std::string& location);

// Said after a downloaded object that differs from what the manifest lists (size or hash):
// the store holds another pack of the archive, or damaged bytes.
inline constexpr const char* kNotTheListedObject =
    ": the object is not the one the manifest lists; if the archive was packed again since it "
    "was opened, reopen it, else it is damaged in the store (verify it)";

struct CacheOptions {
  std::string dir;     // empty: SHARDFEED_CACHE_DIR, else $XDG_CACHE_HOME/shardfeed, else
                       // ~/.cache/shardfeed
  uint64_t limit = 0;  // bytes of shard files; 0: SHARDFEED_CACHE_LIMIT, else unlimited
};
// The cache options, declared once (base/option_table.h): `cache_dir` and `cache_limit` (bytes,
// or a size such as 20GB or 512MiB; ParseByteSize). The CLI's --cache-dir/--cache-limit (inspect,
// verify, bench, tune, extract, stats), Python's cache_dir=/cache_limit= (shardfeed.Archive,
// shardfeed.Loader, shardfeed.torch.Loader, verify, stats, inspect) and C++ callers
// (format::OpenOptions::cache) all set a CacheOptions through it. An empty text leaves the field at
// its default.
const OptionTable<CacheOptions>& CacheOptionTable();
// Process-wide defaults for archives opened later without options of their own (the CLI sets
// its --cache-dir/--cache-limit here). Thread-safe; archives already open keep theirs.
void SetCacheOptions(const CacheOptions& options);
// The options an Open() now would use: `given`'s fields that are set, then SetCacheOptions's,
// then the environment, then defaults. kInvalidArgument for an unreadable SHARDFEED_CACHE_LIMIT.
Result<CacheOptions> ResolveCacheOptions(const CacheOptions& given = {});
// "20GB", "512MiB", "1000000": bytes (k/M/G/T are powers of 1000, Ki/Mi/Gi/Ti of 1024).
Result<uint64_t> ParseByteSize(const std::string& text);

inline constexpr int kRangedConnections = 4;  // ranged GETs at once for one big shard

struct FetchRetry {
  int retries = 6;  // attempts after the first; SHARDFEED_FETCH_RETRIES overrides
  double first_delay_s = 0.25;
  double max_delay_s = 8;  // SHARDFEED_FETCH_MAX_DELAY overrides
  long connect_timeout_s = 10;
  long stall_timeout_s = 30;  // under 1 byte/s for this long: a timeout
};

// Counters of this process, all remote archives together (stats, the bench report).
struct FetchStats {
  uint64_t bytes_fetched = 0;  // body bytes received, retries and discarded bodies included
  uint64_t requests = 0;       // HTTP requests sent
  uint64_t hits = 0;           // shards found in the cache
  uint64_t misses = 0;         // shards this process downloaded
  uint64_t waits = 0;          // shards another process was downloading: waited for it
  uint64_t retries = 0;        // requests repeated after a transient failure
  uint64_t fetch_wait_ns = 0;  // time spent getting shards that were not cached
  uint64_t evictions = 0;      // files this process removed to make room
  uint64_t discards = 0;       // cached copies found damaged and removed (Remote::Discard)
};
FetchStats GetFetchStats();

// Goes up whenever this process gives cache room back (a CachedFile released, a file evicted).
// A reader whose shard the cache refused for room tries again once it changed (or after a
// while, for room given back by other processes) instead of at every access. Thread-safe.
uint64_t CacheRoomGeneration();

// A shard file in the cache, held (shared flock) while this object lives: eviction skips it.
// Destroy it only after the file is unmapped. Not copyable; thread-compatible.
class CachedFile {
 public:
  CachedFile(std::string path, int fd, bool downloaded = false)
      : path_(std::move(path)), fd_(fd), downloaded_(downloaded) {}
  ~CachedFile();
  CachedFile(const CachedFile&) = delete;
  CachedFile& operator=(const CachedFile&) = delete;
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }  // open read-only on the held file (never closed by callers)
  // Whether Fetch downloaded it just now (this process, or another one it waited for): checked
  // against the version then. False for a copy found in the cache.
  bool downloaded() const { return downloaded_; }
  // Whether path() still names the held file: false once another process discarded it
  // (Remote::Discard) or a fresh download replaced it. An open of path() that fails while this
  // is false failed for that reason, not for the copy's content.
  bool named() const;

 private:
  std::string path_;
  int fd_;
  bool downloaded_;
};

// Checks a downloaded file before it is renamed into the cache: OK, or why it is unusable
// (kChecksumMismatch leads to one more download).
using VerifyFn = std::function<Status(const std::string& local_path)>;

// One remote archive location. Thread-safe: several threads may Fetch() at once (different or
// the same files; one downloads, the others wait).
class Remote {
 public:
  // Parses `location` and reads credentials and cache options (ResolveCacheOptions(cache)); no
  // request is made. kInvalidArgument for a location that is not s3:// or http(s):// or lacks a
  // bucket or host.
  static Result<std::shared_ptr<Remote>> Open(const std::string& location,
                                              const CacheOptions& cache = {});
  ~Remote();

  const std::string& location() const { return location_; }
  // <location>/<name> as a URL for messages (no secret in it).
  std::string UrlOf(const std::string& name) const;
  uint64_t cache_limit() const { return cache_.limit; }
  // Body bytes received from this location so far, in this process, through any Remote of it
  // (all requests, retries included): what a reader watches to tell a slow download from a
  // stalled one. Thread-safe.
  uint64_t BytesReceived() const;
  const std::string& cache_dir() const { return cache_.dir; }

  // GETs a small object (the manifest) into memory, never cached. kNotFound for a 404;
  // kCancelled once `cancel` is (see Cancel above).
  Result<std::string> ReadText(const std::string& name, uint64_t max_bytes,
                               const CancelToken* cancel = nullptr) const;
  // kResourceExhausted, giving both figures, when the cache limit is below `need` bytes
  // (what a reader must hold at once).
  Status CheckLimit(uint64_t need, const std::string& why) const;
  // The cached copy of `name` (`size` bytes, `version` 16 lowercase hex digits that change when
  // its content does: the content hash), downloading and verifying it first when absent. The
  // cache counts, evicts and removes only files it names so (<name>.<version>[.part] in
  // <cache_dir>/remote/<16 hex>/): anything else there is left alone. kInvalidArgument for
  // another version or a name with a '/'. kCancelled once `cancel` is, while it downloads or
  // waits for another process's download (a copy already in the cache is still handed out).
  Result<std::unique_ptr<CachedFile>> Fetch(const std::string& name, uint64_t size,
                                            const std::string& version, const VerifyFn& verify,
                                            const CancelToken* cancel = nullptr) const;
  // Removes a cached copy found damaged after its download was verified (the disk, or someone,
  // changed it since): under its per-file lock, and only if its name still names the file
  // `held` holds (a copy another process downloaded meanwhile is left alone). Holders keep
  // their open file and mapping; the next Fetch downloads the shard again. `*removed` says
  // whether this call removed it (false: it was gone or replaced already). Thread-safe. Waits at
  // most 10 s for another process holding the file's lock (kTimeout); kIOError if the file
  // cannot be removed.
  Status Discard(const CachedFile& held, bool* removed = nullptr) const;

  struct Impl;

 private:
  Remote() = default;
  std::string location_;
  CacheOptions cache_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardfeed::storage
