// inspect: what an archive holds (samples, classes, encoding, shapes, sizes), as text for a
// terminal or JSON, a contact sheet of its first samples per class, and one sample decoded as a
// reader sees it. Reads only.
//
// Thread-safety: every function only reads the Archive (thread-safe) and may be called from any
// thread. Text meant for a terminal never carries control or bidirectional-override characters
// from the archive (class names, paths): they are shown escaped (Printable).
#pragma once

#include <cstdint>
#include <string>

#include "shardfeed/base/status.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/imaging/image.h"

namespace shardfeed::validate {

// Human-readable and JSON summaries: samples, classes with counts, encoding, shapes, sizes.
std::string InspectText(const format::Archive& archive);
std::string InspectJson(const format::Archive& archive);

// Text safe to print on a terminal: C0/C1 control characters, DEL, bidirectional formatting
// characters (U+061C, U+200E/F, U+202A..U+202E, U+2066..U+2069) and bytes of invalid UTF-8 are
// shown as \xNN (each byte), backslashes doubled.
std::string Printable(const std::string& text);

// Decodes sample `index` to an upright RGB image as a reader sees it (JPEG orientation applied),
// after checking its record's checksum (not its typed fields', which it does not read) and its
// declared size against `max_pixels`. Errors name the archive and the sample.
Status DecodeSample(const format::Archive& archive, uint64_t index, imaging::Image* out,
                    uint64_t max_pixels = imaging::Limits().max_pixels);

// Where DrawTile put the thumbnail within the sheet (all zero when nothing was drawn).
struct TilePlacement {
  uint32_t x = 0, y = 0, width = 0, height = 0;
};
// Draws `img` into `tile` x `tile` pixels of `sheet` at (x0, y0), aspect kept, centred on a
// light grey background (red when `img` is null: a sample that did not decode).
void DrawTile(imaging::Image* sheet, uint32_t x0, uint32_t y0, uint32_t tile,
              const imaging::Image* img, TilePlacement* placed = nullptr);

// A contact sheet: one row per class (its label and name at the left), the first `per_class`
// samples of that class in archive order as `tile` x `tile` thumbnails (aspect kept, centred on
// grey), each with its sample index beneath, so a person can check labels and orientation at a
// glance. Samples that fail to decode are drawn as a red tile (their error is not fatal).
// Version 4: an archive without a class field shows rows of its first samples in order; the
// first boxes field is drawn as outlines, the first mask tinted, and a str field named caption,
// captions, text or title written under the tile (all turned upright with the image).
struct ContactSheetOptions {
  uint32_t per_class = 8;
  uint32_t tile = 96;
  uint32_t max_classes = 200;  // a sheet for the first this many classes
};
Result<imaging::Image> ContactSheet(const format::Archive& archive,
                                    const ContactSheetOptions& options);

}  // namespace shardfeed::validate
