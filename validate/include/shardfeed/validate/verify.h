// verify: is this archive what was written? Every record checksum, every shard hash, every
// derived manifest field against the shards, and (with `decode`) every payload decoded. Reads
// only; writes nothing.
//
// Thread-safety: Verify() runs its own worker threads over an Archive (which is thread-safe);
// callers may run several Verify() calls at once. Errors: damage is never a Status here but a
// report (VerifyReport::ok() false): a record or shard that does not match, a manifest whose
// derived fields disagree with the shards, an archive too damaged to open, a shard file missing.
// Only "this is not an archive at all" is a Status (VerifyPath).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardfeed/base/option_table.h"
#include "shardfeed/base/status.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/imaging/image.h"

namespace shardfeed::validate {

struct VerifyOptions {
  // Also decode every record (JPEG fully, zstd decompressed, sizes checked) and, in version 4,
  // every field: masks decompressed to the image's stored shape, arrays and boxes against the
  // schema's dims, per-box rows against their boxes, JSON parsed.
  bool decode = false;
  int workers = 0;  // 0: all cores
  // With decode: a record declaring more pixels than this is reported, not decoded. The one
  // limit every reader of records applies (pack, the loader, inspect --grid, extract, stats):
  // a crafted record cannot make any of them allocate gigabytes.
  uint64_t max_pixels = imaging::Limits().max_pixels;
  // VerifyPath: a remote archive's cache (unset fields: storage::SetCacheOptions, then the
  // environment).
  storage::CacheOptions cache;
  // Stops the verify (base/cancel.h; null: it cannot be; the caller owns it and keeps it alive
  // until the call returns): VerifyPath's open as format::OpenOptions::cancel says, then Verify's
  // workers at their next block of samples. VerifyPath then returns kCancelled (never a report).
  const CancelToken* cancel = nullptr;
};

// The options `shardfeed verify` and shardfeed.verify() take (workers, max_pixels), read by both
// through this one table (base/option_table.h).
const OptionTable<VerifyOptions>& VerifyOptionTable();

struct BadSample {
  uint64_t index = 0;
  std::string reason;  // names the sample once ("sample 7: payload checksum mismatch")
};

struct VerifyReport {
  std::string archive;
  uint64_t samples = 0, checked = 0;
  // Set when the archive could not be opened whole although it is one (a damaged manifest or
  // shard header, a shard file missing): the first damage the open met. The fields below then
  // come from opening it shard by shard: every bad shard (that one too, when it was a shard),
  // and the samples of the shards that open (none when the manifest itself is damaged).
  std::string error;
  std::vector<BadSample> bad_samples;
  // One message per shard that does not open or whose hash does not match.
  std::vector<std::string> bad_shards;
  // Manifest fields derived from the shards (payload bytes, counts, shapes) that disagree.
  std::vector<std::string> bad_manifest;
  // Remote archives: damaged cached copies of shards (changed on the local disk since their
  // download was checked) that were discarded and downloaded again. Not damage of the archive:
  // VerifyPath verified it again after the repair, and the figures above are that second pass.
  std::vector<std::string> repaired;
  bool ok() const {
    return error.empty() && bad_samples.empty() && bad_shards.empty() && bad_manifest.empty();
  }
  // {"archive", "ok", "samples", "checked", "bad_samples": [{"index", "reason"}], "bad_shards",
  //  "bad_manifest", "repaired", "error" (only when set)}; ends with a newline.
  std::string ToJson() const;
  // What `shardfeed verify` prints after "BAD archive" (when `error` is set): REPAIRED, BAD
  // manifest, shard and sample lines (a bad shard once: not again when `error` names it), then
  // "PATH: N samples checked[ and decoded], B bad samples, S bad shards[, manifest disagrees]:
  // OK|FAILED".
  std::string ToText(const std::string& path, bool decoded) const;
};

// Checks every record checksum and every shard hash (and, with `decode`, every payload) of an
// open archive. `progress` (may be null) is called from the calling thread with the samples
// done so far, at most every 100 ms, and once at the end. Once options.cancel is cancelled the
// rest is skipped: the report is then incomplete (`checked` counts the samples checked).
VerifyReport Verify(const format::Archive& archive, const VerifyOptions& options,
                    const std::function<void(uint64_t done, uint64_t total)>& progress = nullptr);

// Opens `path` with every check (format::IndexCheck::kFull) and verifies it. A path that does
// not exist or is not an archive at all (a file, a folder without manifest.json) is a Status
// (kNotFound / kInvalidArgument), and so is a remote archive that could not be read at all
// (kIOError, kTimeout, kResourceExhausted: the network, the store down, the cache full or
// unusable), which says nothing about the archive; an archive too damaged to open (a local
// shard file missing or unreadable, a remote shard object missing) is a report with `error`
// set.
// A remote archive whose cached copies were found damaged (and discarded) is opened and
// verified once more, downloading those shards again: `repaired` says what was replaced, and
// the rest of the report is the second pass (damage that is in the stored objects stays).
// kCancelled once options.cancel is cancelled.
Result<VerifyReport> VerifyPath(
    const std::string& path, const VerifyOptions& options,
    const std::function<void(uint64_t done, uint64_t total)>& progress = nullptr);

}  // namespace shardfeed::validate
