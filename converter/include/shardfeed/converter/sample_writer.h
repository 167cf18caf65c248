// A streaming pack: samples in (an image plus typed field values, format/fields.h), an archive
// out. `pack` (Pack, pack.h) and every importer feed one of these, and the Python bindings expose
// it as shardfeed.Writer: one pipeline for every way of writing an archive.
//
// Each sample's image is encoded per PackOptions::encoding exactly as `pack` does it (auto: JPEG
// bytes kept, every other image stored lossless as zstd pixels; jpeg/raw/zstd with their size,
// quality and validation options), on `workers` threads; samples are appended strictly in the
// order Write() was called, so the archive does not depend on the worker count.
//
// Atomic like `pack`: nothing is at `out` until Finish() succeeds (ArchiveWriter's rules:
// --overwrite replaces only a shardfeed archive; destroying the writer without Finish() removes
// its partial output and leaves `out` as it was).
//
// Bad samples, the same policy as `pack`'s bad files:
//   - an image that cannot be read or decoded is skipped and listed in result().skipped (with
//     PackOptions::strict it fails the writer);
//   - a field value that does not match the schema (missing, wrong shape, a per-box field whose
//     rows disagree with its boxes, bad UTF-8 or JSON...) fails the writer with kInvalidArgument
//     naming the sample and the field, unless PackOptions::skip_bad (then it is skipped and
//     listed like a bad image).
// A failure is reported by the Write() call that finds it (samples are checked on the workers,
// so that may be a later Write() than the bad sample's, or Finish()); its message names the
// sample. After a failure every call returns it and no archive is written.
//
// Thread-safety: one thread calls Write()/Finish() (the workers are internal). Memory is bounded:
// at most 16 x workers samples (and about 1 GiB of encoded records) are in flight; Write() blocks
// while the window is full.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardfeed/base/status.h"
#include "shardfeed/converter/pack.h"
#include "shardfeed/format/fields.h"
#include "shardfeed/imaging/image.h"

namespace shardfeed::converter {

// OwnedValue (one field value owning its bytes) is in pack.h, with SourceItem.

// One sample to write. The image is exactly one of:
//   - `image_file` non-empty: read by a worker from that file (the whole file, or `length` bytes
//     from `offset` when length > 0: a member of a tar shard, read in place);
//   - `height` > 0: `image` holds height x width x 3 uint8 RGB pixels, row-major;
//   - else `image` holds an encoded image file's bytes (JPEG, PNG, WebP, ...).
struct Sample {
  // How errors and the skip list name the sample ("cat/1.jpg", "a.jsonl:12"); empty: the image
  // file, else "sample N" (N counting Write() calls from 0).
  std::string name;
  imaging::Bytes image;
  uint32_t height = 0, width = 0;
  std::string image_file;
  uint64_t offset = 0, length = 0;
  int64_t label =
      0;  // the class field's value, when the schema has one (0 <= label <= format::kMaxClassId)
  // One value per schema field, in schema order; the image's and the class field's entries are
  // not read (they may be left absent). Empty: allowed only when the schema has no other field.
  std::vector<OwnedValue> values;
  // The image's size as the annotations declare it (COCO's width/height; 0: not declared). It
  // must be the image's as stored, or, for an EXIF orientation that turns it (5..8), as shown
  // upright: then its boxes were drawn on the upright image and are turned back into the
  // stored frame. Any other size is a bad sample (the boxes' frame is unknown).
  uint32_t declared_width = 0, declared_height = 0;
  // The source says boxes' frame only through the declared size (COCO). Where that cannot tell
  // the frames apart (no size given, EXIF orientation 2..4, a square image turned by 5..8), the
  // boxes are taken as drawn on the stored pixels, and Finish() adds a note to
  // PackResult::notes counting those samples and naming the first.
  bool frame_from_size = false;
};

class SampleWriter {
 public:
  // Starts a writer of an archive at `out` with the schema `options.writer.schema` (exactly one
  // image field; Schema::Legacy() by default). Uses encoding, size/crop/quality/level/validation/
  // jpeg_layout, limits, workers, strict, skip_bad and the writer options of `options`; shuffle
  // and part are Pack's (ignored here). kInvalidArgument for bad options; the ArchiveWriter's
  // errors (an existing non-archive at `out`, a lock held) as they are.
  static Result<std::unique_ptr<SampleWriter>> Create(const std::string& out,
                                                      const PackOptions& options);
  // Without a successful Finish(): stops the workers, drops the samples in flight and removes the
  // partial output (`out` stays as it was). Never blocks on anything but the workers' current
  // sample.
  ~SampleWriter();
  SampleWriter(const SampleWriter&) = delete;
  SampleWriter& operator=(const SampleWriter&) = delete;

  // Queues one sample (taken by value: move it in). Returns the writer's failure, if any (see
  // above); OK means queued, not yet written.
  Status Write(Sample sample);

  // Writes every queued sample, then the manifest and renames the archive into place.
  // `manifest` gives what only the caller knows (class_names, options_json, part, is_part); the
  // schema, encoding, counts, shape, source_bytes, reencoded/resized records and created_by are
  // filled in here. Fails (and writes nothing) when no sample was written, unless
  // `allow_empty` (an empty part of a split pack). Call once. With `numbered_classes` (a
  // schema with a class field and no class names from the caller) the classes are named
  // "0".."the largest label packed": a sample skipped (a bad image) names no class.
  Status Finish(format::Manifest manifest, bool allow_empty = false, bool numbered_classes = false);

  // Counts and the skip list so far (final after Finish(), also when it failed). `progress`, if
  // set, is called from the thread that calls Write()/Finish() about ten times a second.
  const PackResult& result() const;
  void set_progress(ProgressFn progress);

  class Impl;

 private:
  explicit SampleWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardfeed::converter
