// Writing an archive to object storage (s3://bucket/prefix): `pack`, `merge` and `convert` build
// it in a local staging folder, then UploadArchive() sends its files (docs/REMOTE.md, "Writing").
//
// Order. Every file but the manifest goes first; the manifest goes last, once all the others are
// complete objects, so a reader never finds a manifest whose shards are missing or partial. With
// `overwrite`, an existing manifest at the destination is deleted before any other object is
// replaced, so a reader never pairs the old manifest with new shards either (between the delete
// and the new manifest, opening the location fails with kNotFound: no archive there).
//
// Requests. Credentials, region, endpoint and addressing as remote.h's Remote::Open reads them;
// requests signed with SigV4 by libcurl (CURLOPT_AWS_SIGV4). A file above the part size goes by
// S3 multipart upload (CreateMultipartUpload, UploadPart, CompleteMultipartUpload), smaller ones
// by one PUT. Connection failures, timeouts, resets, HTTP 5xx and 429 are retried as reads are
// (FetchRetry, SHARDFEED_FETCH_RETRIES, SHARDFEED_FETCH_MAX_DELAY); 401/403/404 fail at once with
// the URL (never a secret). A multipart upload that fails is aborted (AbortMultipartUpload) so the
// store keeps no orphaned parts. A failed UploadArchive leaves no new manifest at the destination
// (but see UploadResult::published below).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardfeed/base/status.h"

namespace shardfeed::storage {

struct UploadOptions {
  bool overwrite = false;  // replace an archive already at the destination
  // Bytes per multipart part; 0: SHARDFEED_UPLOAD_PART_SIZE, else 64 MiB. At least 5 MiB (S3's
  // smallest part but the last): a smaller value is raised to it.
  uint64_t part_size = 0;
  int connections = 4;  // files uploaded at once
};

// OK for an s3:// location; kInvalidArgument naming it otherwise (http(s):// is read-only).
Status CheckWritable(const std::string& location);

// Whether `location` holds the object `name` now (a HEAD request, retried as reads are). S3
// answers 403 rather than 404 for a missing object when the credentials lack s3:ListBucket:
// then it cannot tell, and returns true ("may be there") when `denied_means_maybe`, else an
// error saying so (grant s3:ListBucket, or --overwrite, which passes true).
Result<bool> RemoteHas(const std::string& location, const std::string& name,
                       bool denied_means_maybe = false);

// The key of an object under `location`'s prefix (`prefix/...`; the whole bucket without one),
// or "" when there is none (ListObjectsV2; a "folder" marker, the key `prefix/` itself, is not
// counted). 403 (no s3:ListBucket) is an error saying that it cannot tell.
Result<std::string> RemoteFirstObject(const std::string& location);

// Deletes the object `name` of `location` (absent already: OK).
Status RemoteDelete(const std::string& location, const std::string& name);

// Stops every UploadArchive of this process (a process-wide base/cancel.h CancelToken that every
// upload request is given): a request in flight is abandoned at libcurl's next progress callback
// (within about a second, even while it waits for the store), a retry's wait ends, no further
// file is begun, each multipart upload begun is aborted (AbortMultipartUpload, so no orphaned
// parts stay), and UploadArchive returns kCancelled naming the file it was sending; the manifest
// is then not written, unless its own PUT was already on its way (UploadResult::published: the
// store may carry it out). Sticky for the rest of the process (a command
// ends after it). Async-signal-safe (one atomic store): for a SIGINT/SIGTERM handler.
void CancelUploads();

// Uploads every regular file of the folder `dir` (not its subfolders) to <location>/<file name>,
// the file named `last` (e.g. "manifest.json") after all the others are complete. Refuses, before
// sending anything, when `last` is already at the destination and !options.overwrite
// (kInvalidArgument: "already exists (pass --overwrite to replace it)"). Errors name the file and
// the s3:// object. Blocking; thread-compatible (uses its own connections).
//
// Concurrent writers. S3 has no lock, so each object's ETag, as the store answered our upload, is
// compared (HEAD) with the store's before `last` is sent, and again, with `last`'s too, after it:
// an object another writer replaced or deleted meanwhile fails the upload with kChanged naming
// it. Right before `last` is sent, a `last` that appeared since the start (another job's archive
// finished here) is kChanged too, --overwrite or not. So a successful return means that at one
// moment after `last` landed, every object sent was still ours. Not checked: objects whose
// upload reply carried no ETag, and objects the credentials may not read (HEAD 403).
struct UploadResult {
  // Whether `last` was sent or being sent: false for every error before it; true for an error
  // of the check after it, or an interruption while it was in flight (it may have landed).
  bool published = false;
  bool landed = false;    // the store answered `last`'s upload with success
  std::string last_etag;  // `last`'s ETag as the store answered its upload ("" if none)
};
Status UploadArchive(const std::string& dir, const std::string& location, const std::string& last,
                     const UploadOptions& options, UploadResult* result = nullptr);

// Replacing an archive (--overwrite) removes the old shards the new archive did not overwrite,
// and only while they are still the old archive's (another job may have written those names
// since): their ETags are read before the upload (RemoteEtags: "" for a name that is not there
// or that the credentials may not read; HEADs on several connections), and each is deleted only
// if its ETag is still that one (RemoteDeleteIfUnchanged: true when deleted; false when it
// changed, is gone, or `etag` is "": kept). A HEAD then a DELETE: another writer's object can
// still land in between, which RemoteUnchanged on the new manifest afterwards reports (kChanged,
// as UploadArchive's checks): either that writer's own check after its manifest sees its object
// gone, or this one sees its manifest replaced.
Result<std::vector<std::string>> RemoteEtags(const std::string& location,
                                             const std::vector<std::string>& names);
Result<bool> RemoteDeleteIfUnchanged(const std::string& location, const std::string& name,
                                     const std::string& etag);
Status RemoteUnchanged(const std::string& location, const std::string& name,
                       const std::string& etag);

}  // namespace shardfeed::storage
