// Private to storage/: locations, credentials and GETs with retries (libcurl).
#pragma once

#include <curl/curl.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "shardfeed/base/cancel.h"
#include "shardfeed/base/status.h"
#include "shardfeed/storage/remote.h"

namespace shardfeed::storage::internal {

struct Endpoint {
  bool s3 = false;
  std::string base;                 // URL the object names are appended to (ends without '/')
  std::string bucket_base, prefix;  // s3: the bucket's URL (base without the prefix), the prefix
  std::string shown;                // the location as the user wrote it, for messages
  std::string key_id, secret, token, region;  // empty key_id: unsigned requests
  // Body bytes received from this location in this process: one counter per location (every
  // Remote of the same URL shares it; ParseEndpoint sets it).
  std::shared_ptr<std::atomic<uint64_t>> received;
};

// The process's byte counter of location `base` (Endpoint::received), made on first use.
std::shared_ptr<std::atomic<uint64_t>> ReceivedCounter(const std::string& base);

// Parses s3:// or http(s):// and reads the AWS variables and credentials file.
Result<Endpoint> ParseEndpoint(const std::string& location);
// An object key (or a name under the prefix) as a URL path: every byte but A-Z a-z 0-9 - . _ ~
// and '/' as %XX (S3's UriEncode, which SigV4's canonical path is). Without it a '?', '#' or
// '%' in a key ended the path, or was decoded: a pack wrote every object to one wrong key.
std::string EncodeKey(const std::string& key);
// The fetch settings of the environment (SHARDFEED_FETCH_RETRIES, _MAX_DELAY, _STALL_TIMEOUT; also
// checks _WAIT and _PART_BYTES, read where they are used): a value that is not a number in its
// range is an error naming the variable (atoi/atol read a typo, or 0, as "no stall timeout": a
// stalled body then hung for ever).
Result<FetchRetry> RetryFromEnv();

// GETs base/name with retries (FetchRetry). The body goes to `fd` when >= 0 (written from offset
// 0 on every attempt, the file cut to the body's length on success, so space reserved for it
// stays reserved meanwhile; with `max_bytes` > 0 a body longer than it ends the transfer:
// kChecksumMismatch, the object not the one listed), else to `text` (at most `max_bytes`).
// 403/404 fail at once, naming
// the URL; a write error (a full disk) fails at once with the errno. `cancel` (may be null)
// abandons the request and ends a retry's wait (base/cancel.h): kCancelled, with `fd`'s or
// `text`'s content partial (the caller discards it).
Status Get(const Endpoint& endpoint, const std::string& name, const FetchRetry& retry, int fd,
           std::string* text, uint64_t max_bytes, const CancelToken* cancel = nullptr);

// GETs bytes [offset, offset + length) of base/name (an HTTP Range request) into `fd` at that
// offset (pwrite: several ranges of one file may be fetched at once, each by its own call), with
// Get's retries, failures and cancel. A body of another length, or a server that ignores the
// range (200 with the whole object), is kUnsupported: the caller fetches the object whole instead.
Status GetRange(const Endpoint& endpoint, const std::string& name, const FetchRetry& retry, int fd,
                uint64_t offset, uint64_t length, const CancelToken* cancel = nullptr);

// Makes `cancel` able to stop the requests of `curl` (GETs and uploads alike): libcurl's progress
// callback, which it calls at least once a second, data or not, abandons the transfer
// (CURLE_ABORTED_BY_CALLBACK) once `cancel` is cancelled. Set again after each curl_easy_reset. A
// null `cancel` sets nothing: such a transfer runs exactly as without it.
void StopOnCancel(CURL* curl, const CancelToken* cancel);

// The text between <tag> and </tag> in an S3 XML reply, or "". With `at`: the search starts
// there, and *at is moved past the field (npos when none is left).
std::string XmlField(const std::string& xml, const std::string& tag, size_t* at = nullptr);
// ": Code (Message)" of an S3 <Error> reply body, or "" when it has no <Code>.
std::string ErrorDetail(const std::string& body);

// A libcurl failure worth another attempt (connection, timeout, reset, short or rewound body):
// one list for GETs and uploads.
bool Transient(CURLcode code);

void CountStat(uint64_t FetchStats::*field, uint64_t amount);

// Runs `work` on `n` threads at most, the caller's among them, and joins them all before it
// returns. `work` takes items from a shared list until none is left, so a thread the system
// cannot start only makes it slower (no error). An exception out of `work` stops at its thread:
// the first one is the returned error (kInternal, naming `what`); the others' work goes on.
Status RunOnThreads(size_t n, const std::string& what, const std::function<void()>& work);

}  // namespace shardfeed::storage::internal
