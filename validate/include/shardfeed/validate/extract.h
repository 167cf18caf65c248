// extract: an archive written back as an image folder. Reads the archive; writes only a folder
// that did not exist before (or was empty), and only once every file is written.
#pragma once

#include <cstdint>
#include <string>

#include "shardfeed/base/status.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/imaging/image.h"

namespace shardfeed::validate {

struct ExtractOptions {
  // A record declaring more pixels than this is refused before anything is decompressed or
  // written (the same limit as verify --decode, the loader and inspect --grid).
  uint64_t max_pixels = imaging::Limits().max_pixels;
};

// Writes every sample to DIR/<class>/<index>.jpg (JPEG records, their exact bytes) or .png
// (pixel records), after checking its checksum. Version 4: the source layout back: a sample
// with a `path` field (a safe relative path) is written there (its extension replaced by the
// record's when it was stored in another form; names are decided before anything is written,
// in sample order: a name taken already, or below a file taken already, falls back to the
// class layout, with -1, -2... where a source file has that name); an archive with fields other
// than image, label and path also gets DIR/samples.jsonl (one JSON object per sample: the image's
// path relative to DIR and every other field: arrays as nested lists, bytes as {"base64": ...},
// JSON as parsed, float NaN/infinities as "NaN"/"Infinity"/"-Infinity", masks as the paths of
// PNG files under DIR/masks/<field>/), DIR/schema.json (the schema as `pack --schema` takes it)
// and, when the archive has class names, DIR/class_names.json (`pack --class-names`). DIR must
// not exist or be an empty directory (kept: its mode, owner and group go to the folder that
// replaces it); its parent must exist, and it must be neither a symbolic link nor a mount point
// (kInvalidArgument). Atomic: the files are written into "DIR.extracting-XXXXXX"
// (mkdtemp; marked as ours by a
// ".shardfeed-extracting" file locked while the extract runs), renamed to DIR at the end; on any
// error that folder is removed and DIR is as it was. One left by an extract that was killed
// (Ctrl-C, kill -9) is removed by the next extract to the same DIR: only with our marker and
// no live owner, so a rerun starts afresh.
// Checks first what verify checks beyond the records (Archive::VerifyDerived), then each
// record's checksum as it is written. Returns the number of files written. Errors name the
// archive and the sample.
Result<uint64_t> Extract(const format::Archive& archive, const std::string& dir,
                         const ExtractOptions& options = {});

// Creates `path` and writes `data` to it; never replaces anything: an existing path is
// kInvalidArgument naming it (O_EXCL, so no race either).
Status WriteNewFile(const std::string& path, const uint8_t* data, size_t size);
// What WriteNewFile would refuse, said before the work that makes the file's contents (a
// stats pass, a contact sheet): `path` exists (a link too), or its folder does not. A check,
// not a reservation: WriteNewFile still refuses a file made meanwhile.
Status CheckNewFile(const std::string& path);

}  // namespace shardfeed::validate
