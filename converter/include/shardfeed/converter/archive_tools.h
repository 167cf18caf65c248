// verify, inspect and extract: what a data pipeline runs on an archive already on disk.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardfeed/base/status.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/imaging/image.h"

namespace shardfeed::converter {

struct VerifyOptions {
  bool decode = false;  // also decode every record (JPEG fully, zstd decompressed, sizes checked)
  int workers = 0;      // 0: all cores
  // With decode: a record declaring more pixels than this is reported, not decoded (the same
  // limit pack applies: a crafted record cannot make verify allocate gigabytes).
  uint64_t max_pixels = imaging::Limits().max_pixels;
};

struct BadSample {
  uint64_t index = 0;
  std::string reason;
};

struct VerifyReport {
  std::string archive;
  uint64_t samples = 0, checked = 0;
  std::vector<BadSample> bad_samples;
  std::vector<std::string> bad_shards;  // one message per shard whose hash does not match
  bool ok() const { return bad_samples.empty() && bad_shards.empty(); }
  std::string ToJson() const;
};

// Checks every record checksum and every shard hash (and, with `decode`, every payload).
VerifyReport Verify(const format::Archive& archive, const VerifyOptions& options,
                    const std::function<void(uint64_t done, uint64_t total)>& progress = nullptr);

// Human-readable and JSON summaries: samples, classes with counts, encoding, shapes, sizes.
std::string InspectText(const format::Archive& archive);
std::string InspectJson(const format::Archive& archive);

// Writes every sample to DIR/<class>/<index>.jpg (JPEG records, their exact bytes) or .png
// (pixel records). DIR must not exist or be empty. Returns the number of files written.
Result<uint64_t> Extract(const format::Archive& archive, const std::string& dir);

// Creates `path` and writes `data` to it; never replaces anything: an existing path is
// kInvalidArgument naming it (O_EXCL, so no race either).
Status WriteNewFile(const std::string& path, const uint8_t* data, size_t size);

// Decodes sample `index` to an upright RGB image as a reader sees it (JPEG orientation applied),
// after checking its checksum. Errors name the archive and the sample.
Status DecodeSample(const format::Archive& archive, uint64_t index, imaging::Image* out,
                    uint64_t max_pixels = imaging::Limits().max_pixels);

// A contact sheet: one row per class (its label and name at the left), the first `per_class`
// samples of that class in archive order as `tile` x `tile` thumbnails (aspect kept, centred on
// grey), each with its sample index beneath, so a person can check labels and orientation at a
// glance. Samples that fail to decode are drawn as a red tile (their error is not fatal).
struct ContactSheetOptions {
  uint32_t per_class = 8;
  uint32_t tile = 96;
  uint32_t max_classes = 200;  // a sheet for the first this many classes
};
Result<imaging::Image> ContactSheet(const format::Archive& archive,
                                    const ContactSheetOptions& options);

// Rewrites an archive into another backend without decoding anything: the same records, labels,
// shards (sample ranges) and checksums. Returns the number of records written. With
// `jpeg_indexed`, the JPEG records not yet indexed are re-laid as `pack --jpeg-layout indexed`
// does (losslessly; their checksums are new), without the source files.
Result<uint64_t> Convert(const format::Archive& archive, const std::string& out,
                         format::Backend backend, bool overwrite = false,
                         bool jpeg_indexed = false);

}  // namespace shardfeed::converter
