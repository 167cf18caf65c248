#include "http.h"

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "shardfeed/base/file_io.h"
#include "shardfeed/base/option_text.h"

namespace shardfeed::storage::internal {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string Trim(std::string s) {
  const char* space = " \t\r\n";
  s.erase(0, s.find_first_not_of(space));
  s.erase(s.find_last_not_of(space) + 1);
  return s;
}

// The [profile] section of an INI credentials file: aws_access_key_id and friends.
void ReadCredentialsFile(const std::string& file, const std::string& profile, Endpoint* e) {
  std::ifstream in(file);
  std::string line, section;
  while (std::getline(in, line)) {
    line = Trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = Trim(line.substr(1, line.size() - 2));
      continue;
    }
    if (section != profile) continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = Trim(line.substr(0, eq)), value = Trim(line.substr(eq + 1));
    if (key == "aws_access_key_id") e->key_id = value;
    if (key == "aws_secret_access_key") e->secret = value;
    if (key == "aws_session_token") e->token = value;
    if (key == "region" && e->region.empty()) e->region = value;
  }
}

std::once_flag curl_once;

struct Sink {
  int fd = -1;
  int64_t at = -1;  // a range: pwrite at this file offset (+ received); else write()
  std::string* text = nullptr;
  uint64_t max_bytes = 0;
  uint64_t received = 0;
  std::atomic<uint64_t>* location_received = nullptr;  // the Endpoint's count
  int write_errno = 0;                                 // set when writing to fd failed (ENOSPC...)
  bool too_big = false;
  CURL* curl = nullptr;
  // The body of an answer that is not 2xx (its first 4 KiB): S3's <Error> reply says why. It
  // never reaches `fd` or `text`, so an error page is neither a cached copy nor a manifest, nor
  // "more than the range asked for".
  std::string error_body;
  bool error_cut = false;  // the transfer was ended after error_body's 4 KiB
};

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  Sink* sink = static_cast<Sink*>(user);
  const size_t n = size * count;
  long http = 0;
  curl_easy_getinfo(sink->curl, CURLINFO_RESPONSE_CODE, &http);
  if (http < 200 || http >= 300) {
    sink->error_body.append(
        data, std::min<size_t>(n, 4096 - std::min<size_t>(4096, sink->error_body.size())));
    if (sink->error_body.size() < 4096) return n;
    sink->error_cut = true;  // the reason is in hand: the rest of the reply is not read
    return 0;
  }
  if (sink->at >= 0 && http != 206) {
    // A server that ignores Range sends the whole object: not a byte of it is read here (each
    // of the parts in flight read up to its part before, about 1.9x the shard in all).
    sink->too_big = true;
    return 0;
  }
  sink->received += n;
  if (sink->location_received) sink->location_received->fetch_add(n, std::memory_order_relaxed);
  CountStat(&FetchStats::bytes_fetched, n);
  if (sink->fd < 0) {
    if (sink->text->size() + n > sink->max_bytes) {
      sink->too_big = true;
      return 0;
    }
    sink->text->append(data, n);
    return n;
  }
  const uint64_t before = sink->received - n;
  // A range longer than asked for; a whole object longer than the size it is listed with (not
  // written past the room the cache reserved for it).
  if ((sink->at >= 0 || sink->max_bytes > 0) && before + n > sink->max_bytes) {
    sink->too_big = true;
    return 0;
  }
  const off_t at = sink->at >= 0 ? static_cast<off_t>(sink->at + before) : -1;
  if (const int err = WriteAll(sink->fd, data, n, at); err != 0) {
    sink->write_errno = err;
    return 0;
  }
  return n;
}

// One counter per FetchStats field (all uint64_t, in order).
static_assert(sizeof(FetchStats) % sizeof(uint64_t) == 0);
std::atomic<uint64_t> g_stats[sizeof(FetchStats) / sizeof(uint64_t)];
size_t StatSlot(uint64_t FetchStats::*field) {
  static const FetchStats probe;
  return static_cast<size_t>(reinterpret_cast<const char*>(&(probe.*field)) -
                             reinterpret_cast<const char*>(&probe)) /
         sizeof(uint64_t);
}

}  // namespace

std::shared_ptr<std::atomic<uint64_t>> ReceivedCounter(const std::string& base) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<std::atomic<uint64_t>>> counters;
  std::lock_guard<std::mutex> lock(mu);
  auto& counter = counters[base];
  if (!counter) counter = std::make_shared<std::atomic<uint64_t>>(0);
  return counter;
}

bool Transient(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_BAD_CONTENT_ENCODING:
    case CURLE_SEND_FAIL_REWIND:
      return true;
    default:
      return false;
  }
}

void CountStat(uint64_t FetchStats::*field, uint64_t amount) {
  g_stats[StatSlot(field)].fetch_add(amount, std::memory_order_relaxed);
}

namespace {

int OnProgress(void* cancel, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return Cancelled(static_cast<const CancelToken*>(cancel)) ? 1 : 0;
}

}  // namespace

void StopOnCancel(CURL* curl, const CancelToken* cancel) {
  if (!cancel) return;
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, OnProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, const_cast<CancelToken*>(cancel));
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
}

std::string EncodeKey(const std::string& key) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  out.reserve(key.size());
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

namespace {

// The key pair and token: the environment's, else AWS_PROFILE's section of the credentials file.
// Half a pair signs every request with an empty secret: refused, as the AWS CLI refuses partial
// credentials, rather than a 403 "check the credentials" from the store.
Status ReadCredentials(const std::string& location, Endpoint* e) {
  e->key_id = Env("AWS_ACCESS_KEY_ID");
  e->secret = Env("AWS_SECRET_ACCESS_KEY");
  e->token = Env("AWS_SESSION_TOKEN");
  std::string from;  // the credentials file's profile, when the pair came from there
  if (e->key_id.empty()) {
    std::string file = Env("AWS_SHARED_CREDENTIALS_FILE");
    if (file.empty() && !Env("HOME").empty()) file = Env("HOME") + "/.aws/credentials";
    std::string profile = Env("AWS_PROFILE");
    if (profile.empty()) profile = "default";
    if (!file.empty()) ReadCredentialsFile(file, profile, e);
    if (!e->key_id.empty() || !e->secret.empty()) from = " in [" + profile + "] of " + file;
  }
  if (e->key_id.empty() == e->secret.empty()) return Status::OK();
  if (!from.empty()) {
    return Status::InvalidArgument(location, ": partial credentials", from,
                                   ": aws_access_key_id and aws_secret_access_key go together");
  }
  return Status::InvalidArgument(
      location, ": partial credentials: ",
      e->key_id.empty() ? "a secret key without AWS_ACCESS_KEY_ID"
                        : "AWS_ACCESS_KEY_ID without AWS_SECRET_ACCESS_KEY",
      " (set both, or neither for unsigned requests to a public bucket)");
}

}  // namespace

Result<Endpoint> ParseEndpoint(const std::string& location) {
  Endpoint e;
  e.shown = location;
  std::string loc = location;
  const size_t scheme_end = loc.find("://");
  if (scheme_end != std::string::npos) {  // S3://, HTTP:// name the same schemes
    for (size_t i = 0; i < scheme_end; ++i) {
      loc[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(loc[i])));
    }
  }
  while (loc.size() > 1 && loc.back() == '/' && loc.size() > scheme_end + 3) loc.pop_back();
  if (loc.rfind("http://", 0) == 0 || loc.rfind("https://", 0) == 0) {
    const size_t host = loc.find("//") + 2;
    const std::string authority = loc.substr(host, loc.find_first_of("/?#", host) - host);
    const size_t at = authority.rfind('@');
    if (at != std::string::npos && authority.find(':') < at) {
      // Shown with the password hidden: messages, logs and the cache's keys never hold a secret.
      const std::string hidden = loc.substr(0, host) + authority.substr(0, authority.find(':')) +
                                 ":***" + loc.substr(host + at);
      return Status::InvalidArgument(hidden,
                                     ": a password in the URL is not taken (it would be shown in "
                                     "messages and process lists); serve the archive without "
                                     "one, or use s3:// with AWS credentials");
    }
    if (authority.empty() || at + 1 == authority.size()) {
      return Status::InvalidArgument(location, ": no host in the URL");
    }
    if (loc.find_first_of("?#", host) != std::string::npos) {
      return Status::InvalidArgument(location,
                                     ": a query or fragment cannot be part of an archive's URL "
                                     "(the archive's file names are appended to its path); give "
                                     "the folder's URL, with any '?' or '#' in it as %3F or %23");
    }
    e.base = loc;
    return e;
  }
  if (loc.rfind("s3://", 0) != 0) {
    return Status::InvalidArgument(location, ": not an s3://, http:// or https:// location");
  }
  const std::string rest = loc.substr(5);
  const size_t slash = rest.find('/');
  const std::string bucket = rest.substr(0, slash);
  const std::string prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
  if (bucket.empty()) return Status::InvalidArgument(location, ": no bucket in the location");
  // "." and ".." components: the HTTP client removes them from the request path, so the objects
  // read, listed and written would lie under another prefix than the one given (and a check of
  // the given prefix, such as pack's refusal of a prefix holding objects, would look elsewhere).
  for (size_t at = 0; at <= prefix.size();) {
    const size_t end = std::min(prefix.find('/', at), prefix.size());
    const std::string part = prefix.substr(at, end - at);
    if (part == "." || part == "..") {
      return Status::InvalidArgument(location, ": a \"", part,
                                     "\" component in the prefix; give the prefix as it is, "
                                     "without . or .. (they would be resolved to another one)");
    }
    at = end + 1;
  }
  e.s3 = true;
  e.region = Env("AWS_REGION");
  if (e.region.empty()) e.region = Env("AWS_DEFAULT_REGION");
  SF_RETURN_IF_ERROR(ReadCredentials(location, &e));
  if (e.region.empty()) e.region = "us-east-1";
  std::string endpoint = Env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL");
  const bool custom = !endpoint.empty();
  if (!custom) endpoint = "https://s3." + e.region + ".amazonaws.com";
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  const std::string style = Env("SHARDFEED_S3_ADDRESSING");
  if (!style.empty() && style != "path" && style != "virtual") {
    return Status::InvalidArgument("SHARDFEED_S3_ADDRESSING=", style,
                                   ": expected \"path\" or \"virtual\"");
  }
  const bool virtual_host = style.empty() ? !custom : style == "virtual";
  if (virtual_host) {
    const size_t scheme_end = endpoint.find("://");
    const size_t host = scheme_end == std::string::npos ? 0 : scheme_end + 3;
    e.base = endpoint.substr(0, host) + bucket + "." + endpoint.substr(host);
  } else {
    e.base = endpoint + "/" + bucket;
  }
  e.bucket_base = e.base;
  e.prefix = prefix;
  if (!prefix.empty()) e.base += "/" + EncodeKey(prefix);
  return e;
}

namespace {

// The number in environment variable `name`, strictly (the whole text, finite, in [low, high]);
// `fallback` when it is unset or empty.
Result<double> EnvNumber(const char* name, double fallback, double low, double high, bool whole) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v, &end);
  if (end == v || *end != 0 || errno != 0 || !std::isfinite(x) || x < low || x > high ||
      (whole && x != std::floor(x))) {
    return Status::InvalidArgument(name, "=\"", v, "\": not ",
                                   whole ? "a whole number" : "a number", " in ", low, "..", high);
  }
  return x;
}

}  // namespace

Result<FetchRetry> RetryFromEnv() {
  FetchRetry r;
  SF_ASSIGN_OR_RETURN(double retries,
                      EnvNumber("SHARDFEED_FETCH_RETRIES", r.retries, 0, 100, true));
  SF_ASSIGN_OR_RETURN(r.max_delay_s,
                      EnvNumber("SHARDFEED_FETCH_MAX_DELAY", r.max_delay_s, 0, 3600, false));
  SF_ASSIGN_OR_RETURN(double stall, EnvNumber("SHARDFEED_FETCH_STALL_TIMEOUT",
                                              double(r.stall_timeout_s), 1, 3600, true));
  SF_RETURN_IF_ERROR(EnvNumber("SHARDFEED_FETCH_WAIT", 900, 0.001, 1e6, false).status());
  if (const char* v = std::getenv("SHARDFEED_FETCH_PART_BYTES"); v && *v) {
    uint64_t part = 0;
    if (!shardfeed::ParseByteSize(v, &part) || part < 4096) {
      return Status::InvalidArgument("SHARDFEED_FETCH_PART_BYTES=\"", v,
                                     "\": not a size of at least 4 KiB (e.g. 32MiB)");
    }
  }
  r.retries = static_cast<int>(retries);
  r.stall_timeout_s = static_cast<long>(stall);
  if (r.max_delay_s < r.first_delay_s) r.first_delay_s = r.max_delay_s;
  return r;
}

namespace {

// Get and GetRange: `range_at` >= 0 asks for bytes [range_at, range_at + max_bytes) into fd.
// long: one request-and-retry loop, each outcome (body, range, HTTP code, curl error) beside it.
Status Transfer(const Endpoint& endpoint, const std::string& name, const FetchRetry& retry, int fd,
                std::string* text, uint64_t max_bytes, int64_t range_at,
                const CancelToken* cancel) {
  std::call_once(curl_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  const std::string url = endpoint.base + "/" + EncodeKey(name);  // plain names: safe for http
  const std::string shown = endpoint.shown + (endpoint.shown.back() == '/' ? "" : "/") + name;
  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), curl_easy_cleanup);
  if (!curl) return Status::Internal("curl_easy_init failed");
  std::string sigv4 = "aws:amz:" + endpoint.region + ":s3";
  std::string userpwd = endpoint.key_id + ":" + endpoint.secret;
  struct curl_slist* headers = nullptr;
  if (endpoint.s3) headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  if (endpoint.s3 && !endpoint.token.empty()) {
    headers = curl_slist_append(headers, ("x-amz-security-token: " + endpoint.token).c_str());
  }
  if (range_at >= 0) {
    const std::string range = "Range: bytes=" + std::to_string(range_at) + "-" +
                              std::to_string(uint64_t(range_at) + max_bytes - 1);
    headers = curl_slist_append(headers, range.c_str());
  }
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> free_headers(headers, curl_slist_free_all);
  std::mt19937_64 jitter(std::random_device{}());
  double delay = retry.first_delay_s;
  std::string last;
  auto cancelled = [&] { return Status::Cancelled(shown, ": download cancelled"); };
  for (int attempt = 0;; ++attempt) {
    if (Cancelled(cancel)) return cancelled();
    Sink sink;
    sink.location_received = endpoint.received.get();
    sink.fd = fd;
    sink.text = text;
    sink.max_bytes = max_bytes;
    sink.at = range_at;
    sink.curl = curl.get();
    if (range_at >= 0) {
      // pwrite at the range's offset: nothing to rewind
    } else if (fd >= 0) {  // overwritten from the start; the reserved size stays until success
      if (::lseek(fd, 0, SEEK_SET) != 0) {
        return Status::IOError("cache file for ", shown, ": ", std::strerror(errno));
      }
    } else {
      text->clear();
    }
    CURL* c = curl.get();
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, retry.connect_timeout_s);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, retry.stall_timeout_s);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
    StopOnCancel(c, cancel);
    if (headers) curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    if (endpoint.s3 && !endpoint.key_id.empty()) {
      curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());
      curl_easy_setopt(c, CURLOPT_USERPWD, userpwd.c_str());
    }
    CountStat(&FetchStats::requests, 1);
    CURLcode code = curl_easy_perform(c);
    if (code == CURLE_WRITE_ERROR && sink.error_cut) code = CURLE_OK;  // a whole error reply
    long http = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
    if (code == CURLE_ABORTED_BY_CALLBACK) return cancelled();
    if (sink.write_errno) {
      return Status::IOError("writing ", shown,
                             " into the cache: ", std::strerror(sink.write_errno));
    }
    if (sink.too_big && range_at >= 0) {
      return Status::Unsupported(shown, ": the server sent more than the range asked for");
    }
    if (sink.too_big && fd >= 0) {
      return Status::ChecksumMismatch(shown, ": more than the ", max_bytes,
                                      " bytes the manifest lists", kNotTheListedObject);
    }
    if (sink.too_big) {
      return Status::Corrupt(shown, ": more than the ", max_bytes, " bytes it may hold");
    }
    bool transient;
    if (range_at >= 0 && code == CURLE_OK && http >= 200 && http < 300) {
      if (http != 206 || sink.received != max_bytes) {
        return Status::Unsupported(shown, ": HTTP ", http, " with ", sink.received,
                                   " bytes for a range of ", max_bytes);
      }
      return Status::OK();
    }
    if (code == CURLE_OK && http >= 200 && http < 300) {
      if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(sink.received)) != 0) {
        return Status::IOError("cache file for ", shown, ": ", std::strerror(errno));
      }
      return Status::OK();
    }
    if (code == CURLE_OK) {
      const std::string detail = ErrorDetail(sink.error_body);
      if (http == 404 && XmlField(sink.error_body, "Code") == "NoSuchBucket") {
        return Status::NotFound(shown, ": the bucket does not exist (HTTP 404 NoSuchBucket, ", url,
                                ")");
      }
      if (http == 404)
        return Status::NotFound(shown, ": not found (HTTP 404", detail, ", ", url, ")");
      if (http == 403 || http == 401) {
        if (!endpoint.s3) {  // http(s):// requests carry no credentials
          return Status::IOError(shown, ": access denied (HTTP ", http, detail, ", ", url,
                                 "): the server refuses unsigned reads of it");
        }
        return Status::IOError(
            shown, ": access denied (HTTP ", http, detail, ", ", url,
            "): check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE); S3 also answers 403 for "
            "a missing object when they lack s3:ListBucket");
      }
      transient = http >= 500 || http == 429 || http == 408;
      last = "HTTP " + std::to_string(http) + detail;
      if (!transient) return Status::IOError(shown, ": HTTP ", http, detail, " (", url, ")");
    } else {
      transient = Transient(code);
      last = curl_easy_strerror(code);
      last += " (" + url + ")";  // which endpoint: AWS_ENDPOINT_URL may point elsewhere
      if (!transient) return Status::IOError(shown, ": ", last);
    }
    if (attempt >= retry.retries) {
      return Status::IOError(shown, ": ", last, ", still failing after ", attempt + 1,
                             " attempts (SHARDFEED_FETCH_RETRIES=", retry.retries, ")");
    }
    CountStat(&FetchStats::retries, 1);
    // Full jitter: a uniform delay in [0, delay], so processes that failed together spread.
    std::uniform_real_distribution<double> pick(0, delay);
    if (!SleepUnlessCancelled(pick(jitter), cancel)) return cancelled();
    delay = std::min(delay * 2, retry.max_delay_s);
  }
}

}  // namespace

std::string XmlField(const std::string& xml, const std::string& tag, size_t* at) {
  const size_t a = xml.find("<" + tag + ">", at ? *at : 0);
  const size_t from = a + tag.size() + 2;
  const size_t b = a == std::string::npos ? a : xml.find("</" + tag + ">", from);
  if (at) *at = b;
  return b == std::string::npos ? "" : xml.substr(from, b - from);
}

std::string ErrorDetail(const std::string& body) {
  const std::string code = XmlField(body, "Code"), message = XmlField(body, "Message");
  if (code.empty()) return "";
  return ": " + code + (message.empty() ? "" : " (" + message + ")");
}

Status Get(const Endpoint& endpoint, const std::string& name, const FetchRetry& retry, int fd,
           std::string* text, uint64_t max_bytes, const CancelToken* cancel) {
  return Transfer(endpoint, name, retry, fd, text, max_bytes, -1, cancel);
}

Status GetRange(const Endpoint& endpoint, const std::string& name, const FetchRetry& retry, int fd,
                uint64_t offset, uint64_t length, const CancelToken* cancel) {
  if (length == 0) return Status::OK();
  return Transfer(endpoint, name, retry, fd, nullptr, length, static_cast<int64_t>(offset), cancel);
}

Status RunOnThreads(size_t n, const std::string& what, const std::function<void()>& work) {
  std::mutex mu;
  Status thrown;
  auto guarded = [&] {
    try {
      work();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (thrown.ok()) thrown = Status::Internal(what, ": ", e.what());
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (thrown.ok()) thrown = Status::Internal(what, ": unknown exception");
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < n; ++t) {
    try {
      threads.emplace_back(guarded);
    } catch (const std::exception&) {
      break;  // no thread to spare (std::system_error) or no memory: fewer threads
    }
  }
  if (n > 0) guarded();
  for (std::thread& t : threads) t.join();
  return thrown;
}

}  // namespace shardfeed::storage::internal

namespace shardfeed::storage {

FetchStats GetFetchStats() {
  FetchStats s;
  uint64_t* out = &s.bytes_fetched;
  for (size_t i = 0; i < sizeof(FetchStats) / sizeof(uint64_t); ++i) {
    out[i] = internal::g_stats[i].load(std::memory_order_relaxed);
  }
  return s;
}

}  // namespace shardfeed::storage
