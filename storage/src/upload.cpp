// Uploading an archive folder to s3:// (upload.h): PUT or multipart upload per file, the
// manifest last; requests signed by libcurl (CURLOPT_AWS_SIGV4), retried as GETs are (http.cpp).
// long file: one S3 client (signed requests, retries, multipart, ETag checks) and the upload that
// drives it; the Client class is private to this file.
#include "shardfeed/storage/upload.h"

#include <curl/curl.h>
#include <dirent.h>
#include <fcntl.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "http.h"
#include "md5.h"
#include "shardfeed/storage/remote.h"

namespace shardfeed::storage {
namespace {

constexpr uint64_t kMinPart = 5ull << 20;       // S3's smallest part (all but the last)
constexpr uint64_t kDefaultPart = 64ull << 20;  // 16 parts for a 1 GB shard
constexpr size_t kMaxReply = 1 << 20;           // S3 replies are small XML documents

CancelToken g_cancel;  // CancelUploads(): sticky for the process

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// What a request sends: nothing, `length` bytes of `fd` from `offset`, or `text`.
struct Body {
  int fd = -1;
  uint64_t offset = 0, length = 0;
  std::string text;
  uint64_t sent = 0;
  int read_errno = 0;
};

size_t OnRead(char* out, size_t size, size_t count, void* user) {
  Body* b = static_cast<Body*>(user);
  const uint64_t want = std::min<uint64_t>(size * count, b->length - b->sent);
  if (want == 0) return 0;
  if (b->fd < 0) {
    std::memcpy(out, b->text.data() + b->sent, want);
    b->sent += want;
    return want;
  }
  ssize_t n;
  do {
    n = ::pread(b->fd, out, want, static_cast<off_t>(b->offset + b->sent));
  } while (n < 0 && errno == EINTR);
  if (n <= 0) {
    b->read_errno = n < 0 ? errno : EIO;  // a file that shrank under us
    return CURL_READFUNC_ABORT;
  }
  b->sent += static_cast<uint64_t>(n);
  return static_cast<size_t>(n);
}

// libcurl rewinds the body to resend it (a reused connection found dead, a redirect).
int OnSeek(void* user, curl_off_t offset, int origin) {
  Body* b = static_cast<Body*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<uint64_t>(offset) > b->length) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  b->sent = static_cast<uint64_t>(offset);
  return CURL_SEEKFUNC_OK;
}

struct Reply {
  long http = 0;
  std::string body, etag;
  int64_t length = -1;  // Content-Length, when the reply had one
  bool cut = false;     // the transfer was ended after the body's first kMaxReply bytes
};

// Keeps the reply's first kMaxReply bytes and then ends the transfer: a store (or a proxy in
// front of it) answering with an endless body is not read to its end.
size_t OnReplyBody(char* data, size_t size, size_t count, void* user) {
  Reply* r = static_cast<Reply*>(user);
  const size_t n = size * count;
  r->body.append(data, std::min(n, kMaxReply - r->body.size()));
  if (r->body.size() < kMaxReply) return n;
  r->cut = true;
  return 0;
}

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  const size_t n = size * count;
  std::string line(data, n);
  if (line.size() > 5 && strncasecmp(line.c_str(), "etag:", 5) == 0) {
    std::string v = line.substr(5);
    v.erase(0, v.find_first_not_of(" \t"));
    v.erase(v.find_last_not_of(" \t\r\n") + 1);
    static_cast<Reply*>(user)->etag = v;
  } else if (line.size() > 15 && strncasecmp(line.c_str(), "content-length:", 15) == 0) {
    static_cast<Reply*>(user)->length = std::strtoll(line.c_str() + 15, nullptr, 10);
  }
  return n;
}

// Every header a request lists is signed (CURLOPT_AWS_SIGV4), so each must be sent: an empty
// `Expect:` (curl's way to drop its 100-continue) is signed yet never sent, and a store that
// checks signatures refused every write. A PUT with a body waits for 100-continue instead.
constexpr const char* kUnsignedPayload = "x-amz-content-sha256: UNSIGNED-PAYLOAD";
// curl waits 1 s by default for `100 Continue` before it sends a body over 1 MiB anyway: a
// part's whole cost on a store or proxy that never answers 100.
constexpr long kExpectWaitMs = 200;

// One connection to the store (its own curl handle): signed requests with retries.
class Client {
 public:
  Client(const internal::Endpoint& e, const FetchRetry& r)
      : e_(e), retry_(r), curl_(curl_easy_init(), curl_easy_cleanup) {}

  std::string Shown(const std::string& name) const {
    return e_.shown + (e_.shown.back() == '/' ? "" : "/") + name;
  }

  // `method` of <name>[?query] (query already in SigV4's canonical form: sorted, escaped) with
  // `body`; retried while transient. OK with reply->http set for any final answer. Once
  // CancelUploads() was called, a `cancellable` request stops (kCancelled); the abort of a
  // multipart upload is not cancellable, so it still clears the parts sent.
  Status Send(const char* method, const std::string& name, const std::string& query, Body* body,
              Reply* reply, bool cancellable = true) {
    if (!curl_) return Status::Internal("curl_easy_init failed");
    const std::string url =
        e_.base + "/" + internal::EncodeKey(name) + (query.empty() ? "" : "?" + query);
    const std::string sigv4 = "aws:amz:" + e_.region + ":s3";
    const std::string userpwd = e_.key_id + ":" + e_.secret;
    struct curl_slist* headers = curl_slist_append(nullptr, kUnsignedPayload);
    if (!e_.token.empty()) {
      headers = curl_slist_append(headers, ("x-amz-security-token: " + e_.token).c_str());
    }
    if (std::strcmp(method, "POST") == 0) {
      headers = curl_slist_append(headers, "Content-Type: application/octet-stream");
    }
    std::unique_ptr<curl_slist, void (*)(curl_slist*)> free_headers(headers, curl_slist_free_all);
    std::mt19937_64 jitter(std::random_device{}());
    double delay = retry_.first_delay_s;
    auto interrupted = [&] {
      return Status::Cancelled(Shown(name), ": ", method, " interrupted (the upload was stopped)");
    };
    const CancelToken* cancel = cancellable ? &g_cancel : nullptr;
    for (int attempt = 0;; ++attempt) {
      if (Cancelled(cancel)) return interrupted();
      *reply = Reply();
      body->sent = 0;
      CURL* c = curl_.get();
      curl_easy_reset(c);
      curl_easy_setopt(c, CURLOPT_URL, url.c_str());
      curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
      curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, retry_.connect_timeout_s);
      curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
      curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, retry_.stall_timeout_s);
      curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
      curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnReplyBody);
      curl_easy_setopt(c, CURLOPT_WRITEDATA, reply);
      curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
      curl_easy_setopt(c, CURLOPT_HEADERDATA, reply);
      curl_easy_setopt(c, CURLOPT_READFUNCTION, OnRead);
      curl_easy_setopt(c, CURLOPT_READDATA, body);
      curl_easy_setopt(c, CURLOPT_SEEKFUNCTION, OnSeek);
      curl_easy_setopt(c, CURLOPT_SEEKDATA, body);
      internal::StopOnCancel(c, cancel);
      const curl_off_t length = static_cast<curl_off_t>(body->length);
      if (std::strcmp(method, "PUT") == 0) {
        curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, length);
        curl_easy_setopt(c, CURLOPT_EXPECT_100_TIMEOUT_MS, kExpectWaitMs);
      } else if (std::strcmp(method, "POST") == 0) {
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, length);
      } else if (std::strcmp(method, "HEAD") == 0) {
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
      } else {
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
      }
      if (!e_.key_id.empty()) {
        curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());
        curl_easy_setopt(c, CURLOPT_USERPWD, userpwd.c_str());
      }
      CURLcode code = curl_easy_perform(c);
      if (code == CURLE_WRITE_ERROR && reply->cut) code = CURLE_OK;  // the answer is in hand
      curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &reply->http);
      if (body->read_errno) {
        return Status::IOError("reading the file for ", Shown(name), ": ",
                               std::strerror(body->read_errno));
      }
      if (code == CURLE_ABORTED_BY_CALLBACK) return interrupted();
      std::string last;
      if (code == CURLE_OK) {
        // CompleteMultipartUpload may answer 200 with an <Error> body: as a 500.
        const bool error_body =
            reply->http == 200 && reply->body.find("<Error>") != std::string::npos;
        if (!error_body && reply->http != 429 && reply->http != 408 && reply->http < 500) {
          return Status::OK();
        }
        last = "HTTP " + std::to_string(reply->http) + Detail(*reply);
      } else if (internal::Transient(code)) {
        last = curl_easy_strerror(code);
      } else {
        return Status::IOError(Shown(name), ": ", method, " failed: ", curl_easy_strerror(code));
      }
      if (attempt >= retry_.retries) {
        return Status::IOError(Shown(name), ": ", method, " failed: ", last,
                               ", still failing after ", attempt + 1,
                               " attempts (SHARDFEED_FETCH_RETRIES=", retry_.retries, ")");
      }
      std::uniform_real_distribution<double> pick(0, delay);
      if (!SleepUnlessCancelled(pick(jitter), cancel)) return interrupted();
      delay = std::min(delay * 2, retry_.max_delay_s);
    }
  }

  // A final answer that is not 2xx as a Status naming the object.
  Status Refused(const char* what, const std::string& name, const Reply& r) const {
    const std::string url = e_.base + "/" + name;
    if (r.http == 401 || r.http == 403) {
      return Status::IOError(Shown(name), ": ", what, " denied (HTTP ", r.http, Detail(r), ", ",
                             url, "): check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE)");
    }
    if (r.http == 404) {
      return Status::NotFound(Shown(name), ": ", what, ": not found (HTTP 404", Detail(r), ", ",
                              url, ")");
    }
    return Status::IOError(Shown(name), ": ", what, " failed (HTTP ", r.http, Detail(r), ", ", url,
                           ")");
  }

  Result<bool> Has(const std::string& name, bool denied_means_maybe) {
    Body none;
    Reply r;
    SF_RETURN_IF_ERROR(Send("HEAD", name, "", &none, &r));
    if (r.http == 404) return false;
    if (r.http / 100 == 2) return true;
    if (r.http != 403) return Refused("HEAD", name, r);
    // A HEAD's 403 has no body: a GET says whether it is only the missing s3:ListBucket
    // (AccessDenied) or credentials that are wrong anyway (InvalidAccessKeyId,
    // SignatureDoesNotMatch, ExpiredToken...), which must fail now, not after a build.
    Reply g;
    SF_RETURN_IF_ERROR(Send("GET", name, "", &none, &g));
    if (g.http == 404) return false;
    if (g.http / 100 == 2) return true;
    if (g.http != 403 || internal::XmlField(g.body, "Code") != "AccessDenied") {
      return Refused("GET", name, g);
    }
    if (denied_means_maybe) return true;  // cannot tell: treated as there
    return Status::IOError(Shown(name), ": cannot tell whether it exists: HEAD denied (HTTP 403, ",
                           e_.base, "/", name,
                           "). S3 answers 403 for a missing object when the credentials lack "
                           "s3:ListBucket on the bucket: grant it, or pass --overwrite (which "
                           "replaces the object without this check)");
  }

  // The first key under `prefix` in the bucket (this client's base is the bucket's URL), or "".
  Result<std::string> FirstKey(const std::string& prefix, const std::string& shown) {
    Body none;
    Reply r;
    // SigV4's canonical query: parameters sorted, values escaped.
    SF_RETURN_IF_ERROR(
        Send("GET", "", "list-type=2&max-keys=2&prefix=" + Escape(prefix), &none, &r));
    if (r.http / 100 == 2) {
      // The first key but a "folder" marker (the prefix itself, as consoles make them).
      for (size_t at = 0; at != std::string::npos;) {
        std::string key = internal::XmlField(r.body, "Key", &at);
        if (at != std::string::npos && key != prefix) return key;
      }
      return std::string();
    }
    if (r.http == 403) {
      return Status::IOError(shown,
                             ": cannot tell whether objects are there: listing denied (HTTP "
                             "403",
                             Detail(r),
                             "); grant s3:ListBucket on the bucket, or pass "
                             "--overwrite (same-named objects there are then replaced)");
    }
    return Status::IOError(shown, ": listing the objects under it failed (HTTP ", r.http, Detail(r),
                           ")");
  }

  Status Delete(const std::string& name, const std::string& query = "", bool cancellable = true) {
    Body none;
    Reply r;
    SF_RETURN_IF_ERROR(Send("DELETE", name, query, &none, &r, cancellable));
    if (r.http / 100 == 2 || r.http == 404) return Status::OK();
    return Refused("DELETE", name, r);
  }

  // The file at `path` (`size` bytes) as the object `name`; returns the object's ETag as the
  // store gave it ("" when it gave none).
  // `replace`: an object may be at `name` already (--overwrite); a multipart upload deletes it
  // first, so that the object a lost completion reply leaves (Completed) can only be this one.
  Result<std::string> PutFile(const std::string& path, uint64_t size, const std::string& name,
                              uint64_t part_size, bool replace = false) {
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.fd < 0) return Status::IOError(path, ": ", std::strerror(errno));
    if (size <= part_size) {
      Body b;
      b.fd = fd.fd;
      b.length = size;
      Reply r;
      SF_RETURN_IF_ERROR(Send("PUT", name, "", &b, &r));
      if (r.http / 100 != 2) return Refused("PUT", name, r);
      return r.etag;
    }
    if (replace) SF_RETURN_IF_ERROR(Delete(name));
    return Multipart(fd.fd, size, name, part_size);
  }

  // Whether the object `name` is there now (HEAD 2xx); false for 404, and for 403 (cannot tell).
  Result<bool> Present(const std::string& name) {
    Body none;
    Reply r;
    SF_RETURN_IF_ERROR(Send("HEAD", name, "", &none, &r));
    if (r.http == 404 || r.http == 403) return false;
    if (r.http / 100 != 2) return Refused("HEAD", name, r);
    return true;
  }

  // The ETag of the object `name` now: "" when there is none (404) or the credentials may not
  // read it (403).
  Result<std::string> Etag(const std::string& name) {
    Body none;
    Reply r;
    SF_RETURN_IF_ERROR(Send("HEAD", name, "", &none, &r));
    if (r.http == 404 || r.http == 403) return std::string();
    if (r.http / 100 != 2) return Refused("HEAD", name, r);
    return r.etag;
  }

  // OK when the object `name` still has the ETag `ours` (what our upload of it was given); an
  // error naming it when another writer replaced or deleted it since. Not checked: `ours` "", or
  // credentials that may write but not read (HEAD 403).
  Status Unchanged(const std::string& name, const std::string& ours) {
    if (ours.empty()) return Status::OK();
    Body none;
    Reply r;
    SF_RETURN_IF_ERROR(Send("HEAD", name, "", &none, &r));
    if (r.http / 100 == 2 && strcasecmp(r.etag.c_str(), ours.c_str()) == 0) return Status::OK();
    if (r.http == 403) return Status::OK();  // write-only credentials: cannot tell
    if (r.http != 404 && r.http / 100 != 2) return Refused("HEAD", name, r);
    return Status::Changed(
        Shown(name), ": ",
        r.http == 404 ? "deleted" : "replaced (ETag " + r.etag + ", ours " + ours + ")",
        " by another writer while this command uploaded: two jobs are writing "
        "to this prefix at once; give each its own prefix");
  }

 private:
  static std::string Detail(const Reply& r) { return internal::ErrorDetail(r.body); }

  std::string Escape(const std::string& s) {
    char* e = curl_easy_escape(curl_.get(), s.c_str(), static_cast<int>(s.size()));
    std::string out = e ? e : "";
    curl_free(e);
    return out;
  }

  Result<std::string> Multipart(int fd, uint64_t size, const std::string& name,
                                uint64_t part_size) {
    Body none;
    Reply r;
    SF_RETURN_IF_ERROR(Send("POST", name, "uploads=", &none, &r));
    if (r.http / 100 != 2) return Refused("starting a multipart upload", name, r);
    const std::string id = internal::XmlField(r.body, "UploadId");
    if (id.empty()) {
      return Status::IOError(Shown(name),
                             ": the store's answer to CreateMultipartUpload has no "
                             "UploadId");
    }
    const std::string id_query = "uploadId=" + Escape(id);
    Status st;
    std::string etag;
    try {
      st = Parts(fd, size, name, part_size, id_query, &etag);
    } catch (const std::exception& e) {  // bad_alloc: the parts sent are aborted all the same
      st = Status::Internal(Shown(name), ": multipart upload: ", e.what());
    }
    if (st.ok()) return etag;
    // Abort, so the store keeps no orphaned parts (after a cancel too); the upload's own error
    // is the one to report.
    Status aborted = Delete(name, id_query, /*cancellable=*/false);
    if (!aborted.ok()) {
      st = Status(st.code(), st.message() + " (aborting the multipart upload also failed: " +
                                 aborted.message() + ")");
    }
    return st;
  }

  // The parts, then CompleteMultipartUpload; `etag`: the object's ETag ("" when unknown).
  Status Parts(int fd, uint64_t size, const std::string& name, uint64_t part_size,
               const std::string& id_query, std::string* etag) {
    std::string complete = "<CompleteMultipartUpload>";
    std::string part_md5s;  // each part's MD5 as its ETag gives it, binary
    bool md5s = true;       // every part's ETag was an MD5
    const uint64_t parts = (size + part_size - 1) / part_size;
    for (uint64_t p = 0; p < parts; ++p) {
      Body b;
      b.fd = fd;
      b.offset = p * part_size;
      b.length = std::min(part_size, size - b.offset);
      Reply r;
      const std::string number = std::to_string(p + 1);
      SF_RETURN_IF_ERROR(Send("PUT", name, "partNumber=" + number + "&" + id_query, &b, &r)
                             .WithContext("part " + number + " of " + std::to_string(parts)));
      if (r.http / 100 != 2) return Refused(("part " + number).c_str(), name, r);
      if (r.etag.empty()) {
        return Status::IOError(Shown(name), ": part ", number, ": the store sent no ETag");
      }
      complete += "<Part><PartNumber>" + number + "</PartNumber><ETag>" + r.etag + "</ETag></Part>";
      md5s = md5s && AppendMd5(r.etag, &part_md5s);
    }
    complete += "</CompleteMultipartUpload>";
    Body b;
    b.text = complete;
    b.length = complete.size();
    Reply r;
    SF_RETURN_IF_ERROR(Send("POST", name, id_query, &b, &r));
    const std::string computed = md5s ? MultipartEtag(part_md5s, parts) : "";
    if (r.http / 100 == 2) {
      *etag = Unquoted(internal::XmlField(r.body, "ETag"));
      if (etag->empty()) *etag = computed;
      return Status::OK();
    }
    if (r.http == 404 && internal::XmlField(r.body, "Code") == "NoSuchUpload" && md5s &&
        Completed(name, size, computed)) {
      *etag = computed;
      return Status::OK();  // an earlier attempt completed it and its reply was lost
    }
    if (r.http == 404 && !md5s) {
      return Refused(
          "completing the multipart upload (the store's part ETags are not MD5s: an upload "
          "completed by an earlier attempt cannot be told from another object)",
          name, r);
    }
    return Refused("completing the multipart upload", name, r);
  }

  // A part's ETag as S3 gives it (the part's MD5 in hex, in quotes) appended to `md5s` as 16
  // bytes; false for another form (a store that encrypts with KMS or customer keys, say).
  static bool AppendMd5(const std::string& etag, std::string* md5s) {
    if (etag.size() != 34 || etag.front() != '"' || etag.back() != '"') return false;
    auto nibble = [](char c) {
      return c >= '0' && c <= '9'   ? c - '0'
             : c >= 'a' && c <= 'f' ? c - 'a' + 10
             : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                    : -1;
    };
    for (size_t i = 1; i < 33; i += 2) {
      const int hi = nibble(etag[i]), lo = nibble(etag[i + 1]);
      if (hi < 0 || lo < 0) return false;
      md5s->push_back(static_cast<char>(hi << 4 | lo));
    }
    return true;
  }

  // An ETag as an XML reply gives it (`&quot;` for its quotes) as a header gives it.
  static std::string Unquoted(std::string etag) {
    for (size_t at; (at = etag.find("&quot;")) != std::string::npos;) etag.replace(at, 6, "\"");
    for (size_t at; (at = etag.find("&#34;")) != std::string::npos;) etag.replace(at, 5, "\"");
    return etag;
  }

  // The ETag S3 (and MinIO, and moto) gives the object of a multipart upload of these parts: the
  // MD5 of their MD5s, "-" and the number of parts.
  static std::string MultipartEtag(const std::string& md5s, uint64_t parts) {
    static const char kHex[] = "0123456789abcdef";
    std::string hex;
    for (unsigned char c : internal::Md5(md5s)) hex += kHex[c >> 4], hex += kHex[c & 15];
    return "\"" + hex + "-" + std::to_string(parts) + "\"";
  }

  // A retried CompleteMultipartUpload answers NoSuchUpload when an attempt whose reply was lost
  // completed the upload (MinIO at once, S3 after a while). It is also the answer when someone
  // else aborted our upload (a lifecycle rule, a clean-up job), and another object may then be
  // at the key. Ours only if it is `size` bytes with the ETag our parts make (`etag`): an object
  // of the same size and part count but other bytes was taken for ours before, the manifest
  // published over it and the local build deleted. Where part ETags are not MD5s this cannot be
  // proved, and the upload fails (the build is kept).
  bool Completed(const std::string& name, uint64_t size, const std::string& etag) {
    Body none;
    Reply r;
    if (!Send("HEAD", name, "", &none, &r).ok() || r.http / 100 != 2) return false;
    return r.length == static_cast<int64_t>(size) && strcasecmp(r.etag.c_str(), etag.c_str()) == 0;
  }

  const internal::Endpoint& e_;
  FetchRetry retry_;
  std::unique_ptr<CURL, void (*)(CURL*)> curl_;
};

std::once_flag curl_once;

// fn(client, i) for every i < count, on up to `connections` threads with a connection each; the
// first error stops the others starting more and is returned.
Status OnClients(const internal::Endpoint& e, const FetchRetry& retry, int connections,
                 size_t count, const std::string& what,
                 const std::function<Status(Client&, size_t)>& fn) {
  if (count == 0) return Status::OK();
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  Status first_error;
  auto work = [&] {
    Client client(e, retry);
    for (size_t i; !failed.load() && (i = next.fetch_add(1)) < count;) {
      Status st;
      try {
        st = fn(client, i);
      } catch (const std::exception& x) {  // stops the other threads too, as an error does
        st = Status::Internal(what, ": ", x.what());
      }
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!failed.exchange(true)) first_error = st;
      }
    }
  };
  const size_t n = std::min<size_t>(std::max(1, connections), count);
  const Status thrown = internal::RunOnThreads(n, what, work);
  if (failed.load()) return first_error;
  return thrown;
}

// What every request to `location` needs: curl set up once, the endpoint, the retry settings.
struct Session {
  internal::Endpoint endpoint;
  FetchRetry retry;
};
Result<Session> OpenSession(const std::string& location) {
  std::call_once(curl_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  Session s;
  SF_ASSIGN_OR_RETURN(s.endpoint, internal::ParseEndpoint(location));
  SF_ASSIGN_OR_RETURN(s.retry, internal::RetryFromEnv());
  return s;
}

Result<uint64_t> PartSize(const UploadOptions& o) {
  uint64_t size = o.part_size;
  if (size == 0) {
    const char* v = std::getenv("SHARDFEED_UPLOAD_PART_SIZE");
    if (v && *v) {
      Result<uint64_t> parsed = ParseByteSize(v);
      if (!parsed.ok()) return parsed.status().WithContext("SHARDFEED_UPLOAD_PART_SIZE");
      size = *parsed;
    } else {
      size = kDefaultPart;
    }
  }
  return std::max(size, kMinPart);
}

}  // namespace

Status CheckWritable(const std::string& location) {
  if (location.size() > 5 && strncasecmp(location.c_str(), "s3://", 5) == 0) return Status::OK();
  if (IsRemote(location)) {
    return Status::InvalidArgument(location,
                                   ": cannot write an archive over http(s):// (read "
                                   "only); write to s3://bucket/prefix or a local folder");
  }
  return Status::InvalidArgument(location, ": not an s3:// location");
}

Result<bool> RemoteHas(const std::string& location, const std::string& name,
                       bool denied_means_maybe) {
  SF_ASSIGN_OR_RETURN(const Session session, OpenSession(location));
  const internal::Endpoint& e = session.endpoint;
  const FetchRetry& retry = session.retry;
  Client client(e, retry);
  return client.Has(name, denied_means_maybe);
}

Result<std::string> RemoteFirstObject(const std::string& location) {
  SF_ASSIGN_OR_RETURN(const Session session, OpenSession(location));
  const internal::Endpoint& e = session.endpoint;
  internal::Endpoint bucket = e;
  bucket.base = e.bucket_base;
  Client client(bucket, session.retry);
  return client.FirstKey(e.prefix.empty() ? "" : e.prefix + "/", location);
}

Status RemoteDelete(const std::string& location, const std::string& name) {
  SF_RETURN_IF_ERROR(CheckWritable(location));
  SF_ASSIGN_OR_RETURN(const Session session, OpenSession(location));
  const internal::Endpoint& e = session.endpoint;
  const FetchRetry& retry = session.retry;
  Client client(e, retry);
  return client.Delete(name);
}

void CancelUploads() { g_cancel.Cancel(); }

Result<std::vector<std::string>> RemoteEtags(const std::string& location,
                                             const std::vector<std::string>& names) {
  SF_RETURN_IF_ERROR(CheckWritable(location));
  SF_ASSIGN_OR_RETURN(const Session session, OpenSession(location));
  const internal::Endpoint& e = session.endpoint;
  const FetchRetry& retry = session.retry;
  std::vector<std::string> etags(names.size());
  SF_RETURN_IF_ERROR(OnClients(e, retry, UploadOptions().connections, names.size(),
                               "reading ETags under " + e.shown, [&](Client& client, size_t i) {
                                 SF_ASSIGN_OR_RETURN(etags[i], client.Etag(names[i]));
                                 return Status::OK();
                               }));
  return etags;
}

Result<bool> RemoteDeleteIfUnchanged(const std::string& location, const std::string& name,
                                     const std::string& etag) {
  if (etag.empty()) return false;
  SF_RETURN_IF_ERROR(CheckWritable(location));
  SF_ASSIGN_OR_RETURN(const Session session, OpenSession(location));
  const internal::Endpoint& e = session.endpoint;
  const FetchRetry& retry = session.retry;
  Client client(e, retry);
  SF_ASSIGN_OR_RETURN(const std::string now, client.Etag(name));
  if (now.empty() || strcasecmp(now.c_str(), etag.c_str()) != 0) return false;
  SF_RETURN_IF_ERROR(client.Delete(name));
  return true;
}

Status RemoteUnchanged(const std::string& location, const std::string& name,
                       const std::string& etag) {
  SF_ASSIGN_OR_RETURN(const Session session, OpenSession(location));
  const internal::Endpoint& e = session.endpoint;
  const FetchRetry& retry = session.retry;
  Client client(e, retry);
  return client.Unchanged(name, etag);
}

Status UploadArchive(const std::string& dir, const std::string& location, const std::string& last,
                     const UploadOptions& options, UploadResult* result) {
  UploadResult ignored;
  if (!result) result = &ignored;
  *result = UploadResult();
  SF_RETURN_IF_ERROR(CheckWritable(location));
  SF_ASSIGN_OR_RETURN(const Session session, OpenSession(location));
  const internal::Endpoint& e = session.endpoint;
  const FetchRetry& retry = session.retry;
  SF_ASSIGN_OR_RETURN(uint64_t part_size, PartSize(options));

  struct File {
    std::string name;
    uint64_t size;
  };
  std::vector<File> files;
  bool has_last = false;
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return Status::IOError(dir, ": ", std::strerror(errno));
  while (struct dirent* entry = ::readdir(d.get())) {
    struct stat st;
    const std::string path = dir + "/" + entry->d_name;
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (entry->d_name == last) {
      has_last = true;
    } else {
      files.push_back({entry->d_name, static_cast<uint64_t>(st.st_size)});
    }
  }
  if (!has_last) return Status::InvalidArgument(dir, ": no ", last, " to upload");
  std::sort(files.begin(), files.end(),
            [](const File& a, const File& b) { return a.name < b.name; });

  Client main(e, retry);
  // With --overwrite, a manifest that may be there (403: cannot tell) is deleted first too.
  SF_ASSIGN_OR_RETURN(bool exists, main.Has(last, options.overwrite));
  if (exists && !options.overwrite) {
    return Status::InvalidArgument(main.Shown(last),
                                   ": already exists (pass --overwrite to replace it)");
  }
  if (exists) SF_RETURN_IF_ERROR(main.Delete(last));  // no reader pairs it with new shards

  // Each file's ETag as the store gave it to our upload; checked before and after the manifest.
  std::vector<std::string> etags(files.size());
  SF_RETURN_IF_ERROR(OnClients(
      e, retry, options.connections, files.size(), "uploading " + e.shown,
      [&](Client& client, size_t i) {
        SF_ASSIGN_OR_RETURN(etags[i], client.PutFile(dir + "/" + files[i].name, files[i].size,
                                                     files[i].name, part_size, options.overwrite));
        return Status::OK();
      }));
  // S3 has no lock: another job writing to this prefix replaces shards under us. Checked before
  // the manifest (so none is published over another's shards), then after it with the manifest
  // itself: if a command reports success, at one moment after its manifest landed every object
  // it names was its own. Two writers may still both fail; never both succeed over a mix.
  auto unchanged = [&](Client& client, size_t i) {
    return client.Unchanged(files[i].name, etags[i]);
  };
  SF_RETURN_IF_ERROR(
      OnClients(e, retry, options.connections, files.size(), "checking " + e.shown, unchanged));
  struct stat st;
  const std::string last_path = dir + "/" + last;
  if (::stat(last_path.c_str(), &st) != 0)
    return Status::IOError(last_path, ": ", std::strerror(errno));
  // Another job's archive finished here during our upload (its manifest is up): not replaced
  // (it was absent, or --overwrite deleted it, before the upload began). Not checked where the
  // credentials may not read it (403).
  SF_ASSIGN_OR_RETURN(const bool appeared, main.Present(last));
  if (appeared) {
    return Status::Changed(main.Shown(last),
                           ": appeared while this command uploaded: another job wrote an archive "
                           "to this prefix at the same time (its shards may now be this "
                           "command's); give each job its own prefix");
  }
  result->published = true;  // from here on the manifest may land, even if its reply is lost
  SF_ASSIGN_OR_RETURN(result->last_etag,
                      main.PutFile(last_path, static_cast<uint64_t>(st.st_size), last, part_size));
  result->landed = true;
  SF_RETURN_IF_ERROR(main.Unchanged(last, result->last_etag));
  return OnClients(e, retry, options.connections, files.size(), "checking " + e.shown, unchanged);
}

}  // namespace shardfeed::storage
