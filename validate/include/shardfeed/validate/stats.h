// stats: is what was written fit to train on? One decoding pass over an archive, all workers:
// per-channel mean/std, label balance, size/aspect/file-size histograms, colour counts, exact and
// near duplicates (also across labels), quality flags, and leaks into other archives
// (train vs val/test). Reads only. docs/CLI.md ("stats") documents the JSON and the thresholds.
//
// Thread-safety: Stats() runs its own workers over thread-safe Archives; several calls may run
// at once. Errors: a sample that does not decode is listed in the report (`errors`), never a
// failure of the whole pass; a Status only for what stops the pass (an option out of range).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardfeed/base/cancel.h"
#include "shardfeed/base/option_table.h"
#include "shardfeed/base/status.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/imaging/image.h"

namespace shardfeed::validate {

struct StatsOptions {
  int workers = 0;  // 0: all cores
  // mean/std over the stored images (0) or after the loader's evaluation transform: the centre
  // square of 224/256 of the short side, resized to size x size (crop="center").
  uint32_t size = 0;
  uint64_t max_pixels = imaging::Limits().max_pixels;  // as verify --decode and the loader
  // Near duplicates: perceptual hashes (64-bit DCT hash of a 32x32 luma image) at most this
  // many bits apart. 0..16.
  int near_threshold = 10;
  // Quality flags, measured on the luma image downscaled to at most 256 pixels a side
  // (0..255 units): mean below `dark` / above `bright`, standard deviation below `uniform`,
  // variance of the 4-neighbour Laplacian below `blurry`; long side / short side above
  // `extreme_aspect`; short side below `tiny` pixels. A dark or uniform image is flagged as
  // such, not also as blurry (it has no edges to measure).
  double dark = 25, bright = 230, uniform = 4, blurry = 50, extreme_aspect = 4;
  uint32_t tiny = 32;
  // Keep mean, std and `size` in ARCHIVE/stats.json (format/stats_record.h), where a loader given
  // mean="archive" reads them. The archive must be a local, writable directory.
  bool save = false;
  // Not an option: ends the pass within a few samples (Stats returns kCancelled; nothing saved).
  // The caller owns it; read while Stats runs.
  const CancelToken* cancel = nullptr;
};

// Checks the options on their own; kInvalidArgument naming the option and its range.
Status ValidateStatsOptions(const StatsOptions& options);

// Every StatsOption declared once (name, range, help): `shardfeed stats --near-threshold 8` and
// `shardfeed.stats(path, near_threshold=8)` both set them through it.
using StatsOption = Option<StatsOptions>;
const OptionTable<StatsOptions>& StatsOptionTable();

// A histogram with fixed bin edges: counts[i] holds values in [edges[i], edges[i+1]); the last
// bin is open-ended.
struct Histogram {
  std::vector<double> edges;
  std::vector<uint64_t> counts;
  double min = 0, max = 0, mean = 0;
};

struct Leak {
  uint64_t index = 0;  // in this archive
  std::string other;   // the other archive's path as given
  uint64_t other_index = 0;
  bool exact = true;  // kind "exact" (same decoded pixels) or "near" (perceptual hash)
};

struct StatsReport {
  std::string archive;
  // With StatsOptions::save: why no record was saved although the pass ran (no sample decoded,
  // a channel's std under format::kMinStd), else "". The report is whole either way: the CLI
  // writes it and then exits 2, shardfeed.stats raises.
  std::string save_error;
  uint64_t samples = 0, decoded = 0;
  uint32_t size = 0;
  uint64_t pixels = 0;                             // pixels the mean/std are over
  double mean[3] = {0, 0, 0}, std[3] = {0, 0, 0};  // 0..1 units; *255 for 0..255
  std::vector<std::string> class_names;
  std::vector<uint64_t> label_counts;
  // Largest class / smallest; +inf when a class is empty, NaN when there are no classes.
  double imbalance_ratio = 0;
  Histogram width, height, aspect, file_bytes;
  uint64_t grayscale = 0, cmyk = 0, exif_rotated = 0;
  // Sample indices per flag, ascending.
  std::vector<uint64_t> uniform, dark, bright, blurry, extreme_aspect, tiny;
  std::vector<std::pair<uint64_t, std::string>> errors;  // samples that did not decode
  // Groups of sample indices, each ascending, groups by their first index.
  std::vector<std::vector<uint64_t>> duplicates, near_duplicates, cross_label_duplicates;
  std::vector<Leak> leaks;
  // Version 4: per field other than the image and the class field, what its values span
  // ({name: {"type", "samples", "rows", "values", "bytes"}}: see docs/CLI.md, "stats"), as
  // JSON text; "{}" when the schema has no such field.
  std::string fields_json = "{}";
  // Per sample of a folder pack, its source path (the `path` field), for naming duplicates;
  // empty when the archive has none.
  std::vector<std::string> paths;
  StatsOptions options;
  // The JSON object of docs/CLI.md ("stats"), ending with a newline.
  std::string ToJson() const;
};

// What `--fail-on` checks. Parsed from "duplicates,leaks,cross-label,flags,imbalance=RATIO".
struct FailOn {
  bool duplicates = false, leaks = false, cross_label = false, flags = false;
  double imbalance = 0;  // > 0: fail when the imbalance ratio exceeds it
};
Result<FailOn> ParseFailOn(const std::string& text);
// One line naming what failed ("2 duplicate groups, 1 leak"), or "" when nothing did.
std::string FailureSummary(const StatsReport& report, const FailOn& fail_on);

// The pass. `against` are other archives (with the names the report gives them) checked for
// samples of this one: exact and near duplicates become leaks. `progress` (may be null) is
// called from the calling thread with samples done and total (all archives), at most every
// 100 ms.
using StatsProgress = std::function<void(uint64_t done, uint64_t total)>;
struct OtherArchive {
  std::string name;
  std::shared_ptr<format::Archive> archive;
};
Result<StatsReport> Stats(const format::Archive& archive, const StatsOptions& options,
                          const std::vector<OtherArchive>& against = {},
                          const StatsProgress& progress = nullptr);

// One self-contained HTML page (no external references): histograms, duplicate and
// near-duplicate groups and flagged samples as thumbnails (data: URIs), leaked pairs side by
// side. At most `max_items` thumbnails per section.
Result<std::string> StatsHtml(const StatsReport& report, const format::Archive& archive,
                              const std::vector<OtherArchive>& against, uint32_t max_items = 60);

// --- the perceptual hash and the near-duplicate search (exposed for tests) ---

// 64-bit DCT hash of an RGB image: luma (77 R + 150 G + 29 B, exact integers) averaged over
// 32 x 32 cells, the 8 x 8 lowest frequencies of its DCT-II, one bit per coefficient above their
// median (DC excluded from the median). stats hashes the same way the luma image it has already
// reduced to at most 256 pixels a side.
uint64_t PerceptualHash(const uint8_t* rgb, uint32_t width, uint32_t height, size_t stride);

// Pairs (i < j) of `hashes` at most `threshold` bits apart, found by multi-index hashing (four
// 16-bit chunks; a pair within `threshold` agrees within threshold/4 bits on one chunk), never
// by comparing all pairs. Entries with skip[i] set take no part (skip may be empty).
std::vector<std::pair<uint32_t, uint32_t>> NearPairs(const std::vector<uint64_t>& hashes,
                                                     int threshold,
                                                     const std::vector<bool>& skip = {});
// For each query hash, the entries of `hashes` within `threshold` bits: (query, entry) pairs.
std::vector<std::pair<uint32_t, uint32_t>> NearMatches(const std::vector<uint64_t>& hashes,
                                                       const std::vector<uint64_t>& queries,
                                                       int threshold,
                                                       const std::vector<bool>& skip = {},
                                                       const std::vector<bool>& skip_query = {});

}  // namespace shardfeed::validate
