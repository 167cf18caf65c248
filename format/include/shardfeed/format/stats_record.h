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

struct StatsRecord {
  std::array<double, 3> mean{}, std{};  // 0..1 units, R, G, B
  uint32_t size = 0;         // 0: over the stored images; else after the centre crop to size x size
  uint64_t samples = 0;      // samples decoded
  uint64_t fingerprint = 0;  // ArchiveFingerprint of the archive measured
};

// XXH3-64 of the sample count and every shard's content hash, in order: what changes whenever
// any record does.
uint64_t ArchiveFingerprint(const Archive& archive);

// Writes ARCHIVE/stats.json atomically (a temporary file in the archive directory, renamed over
// any previous record). Local archives only: kInvalidArgument for a remote location; kIOError
// when the directory is not writable (the archive is left as it was).
Status WriteStatsRecord(const Archive& archive, const StatsRecord& record);

// Reads and checks ARCHIVE/stats.json: kNotFound ("run shardfeed stats ARCHIVE --save") when
// there is none, kCorrupt for a malformed one, kInvalidArgument when it describes another state
// of the archive than the one open now.
Result<StatsRecord> ReadStatsRecord(const Archive& archive);

}  // namespace shardfeed::format
