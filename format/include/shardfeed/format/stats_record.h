// ARCHIVE/stats.json: the per-channel mean and std that `shardfeed stats --save` measured over
// an archive, kept beside its manifest so that a loader given mean="archive" normalises with
// them (docs/FORMAT.md, "stats.json"). Optional; readers of the archive itself ignore it.
//
// The record names the data it describes by a fingerprint of the archive (sample count and every
// shard's content hash): a record whose archive changed since (re-packed, converted, shards
// replaced) is refused, never used. Plain values; functions are thread-safe. Errors name the file.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "shardfeed/base/status.h"
#include "shardfeed/format/archive.h"

namespace shardfeed::format {

inline constexpr std::string_view kStatsFileName = "stats.json";

// The smallest std (0..1 units) a loader normalises with: below it outputs grow towards
// infinity. `stats --save` writes no record under it (the loader would refuse the record).
inline constexpr float kMinStd = 1e-3f;

struct StatsRecord {
  std::array<double, 3> mean{}, std{};  // 0..1 units, R, G, B
  uint32_t size = 0;         // 0: over the stored images; else after the centre crop to size x size
  uint64_t samples = 0;      // samples decoded
  uint64_t fingerprint = 0;  // ArchiveFingerprint of the archive measured
};

// XXH3-64 of the sample count and every shard's content hash, in order: what changes whenever
// any record does.
uint64_t ArchiveFingerprint(const Archive& archive);

// OK when ARCHIVE/stats.json may be replaced by WriteStatsRecord: there is none, or it is
// provably a record of ours (a regular file of at most 64 KiB holding a JSON object with
// "format": "shardfeed-stats"), whatever state of the archive it describes. Otherwise
// kInvalidArgument naming the file and why ("not written by shardfeed stats --save"). A check
// only: `stats --save` calls it before its pass so that a refusal costs none; WriteStatsRecord
// decides again at the moment it writes.
Status CheckStatsRecordReplaceable(const Archive& archive);
// "" when the file at `path` is provably a record of ours (as above), else why it is not ("not
// written by shardfeed stats --save", "a symbolic link", ...). --overwrite keeps to it: an
// archive folder whose stats.json is a user's own is not replaced.
std::string WhyNotOurStatsRecord(const std::string& path);

// Writes ARCHIVE/stats.json atomically: a temporary file in the archive directory
// (stats.json.tmp-PID), synced, then moved into place so that a reader sees the old record or
// the new one, never a part. It never replaces a file that is not provably ours (as
// CheckStatsRecordReplaceable), and decides that at the final step, not only before:
//  - none there: renameat2(RENAME_NOREPLACE) (link() where the file system lacks the flag), so
//    a file that appears meanwhile is kept and the call fails (kInvalidArgument naming it,
//    "appeared while saving"), unless that file is itself a record of ours (a concurrent
//    stats --save), which is then replaced as below;
//  - one of ours there: renameat2(RENAME_EXCHANGE), then what came out is judged: a record of
//    ours is removed; anything else (put there since the check) is exchanged back and the call
//    fails as above. For a moment the new record is visible at the path even then; no file is
//    removed that was not checked to be ours after it left the path.
//  - Residual window: on a file system without RENAME_EXCHANGE (ENOSYS/EINVAL: some network and
//    FUSE file systems), the path is checked once more (ours, or none where hard links are not
//    supported either) and the record then renamed over it: a file put there between that
//    check and the rename (microseconds) is replaced.
// If the path changes again during the exchange back, both files are left where they are and
// kIOError says where the one found at the path now is. Local archives only: kInvalidArgument
// for a remote location; kIOError when the directory is not writable (the archive is left as it
// was; the temporary file removed).
Status WriteStatsRecord(const Archive& archive, const StatsRecord& record);

// Reads and checks ARCHIVE/stats.json: kNotFound ("run shardfeed stats ARCHIVE --save") when
// there is none, kCorrupt for a malformed one, kInvalidArgument when it describes another state
// of the archive than the one open now.
Result<StatsRecord> ReadStatsRecord(const Archive& archive);

namespace internal {
// Tests only: `hook` runs with the path of stats.json right before WriteStatsRecord's final step
// (the rename or the exchange), where a test puts a file there; nullptr removes it. Not
// thread-safe against a running WriteStatsRecord.
void SetStatsBeforeFinalStepHookForTest(void (*hook)(const std::string& path));
}  // namespace internal

}  // namespace shardfeed::format
