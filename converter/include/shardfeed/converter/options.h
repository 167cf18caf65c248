// Every pack option, declared once (base/option_table.h, as reader/options.h for the loader): the
// CLI
// (`shardfeed pack SRC OUT --size 512`), the Python bindings (`shardfeed.pack(src, out,
// size=512)`) and C++ (PackOptions fields, then ValidatePackOptions, which Pack() calls) read
// the same names and values and refuse them with the same messages. The record-shaping ones are
// recorded in the manifest (PackOptionsJson), so an archive says how it was made whichever
// surface made it, and `pack --part` fingerprints compare equal across surfaces.
//
// Arguments that are places, not options (SRC, OUT, --list, --report, --parts-dir), stay with
// each surface. Thread-safety: immutable table, pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "shardfeed/base/option_table.h"
#include "shardfeed/base/status.h"
#include "shardfeed/converter/pack.h"

namespace shardfeed::converter {

using PackOption = Option<PackOptions>;  // base/option_table.h: the mechanism both sides share

const OptionTable<PackOptions>& PackOptionTable();
const PackOption* FindPackOption(std::string_view name);  // "max_side" or "max-side"
// An unknown name is kInvalidArgument naming it and the closest known one.
Status SetPackOption(PackOptions* options, std::string_view name, std::string_view text);
// Rules across options (what Pack() refuses before reading anything).
Status ValidatePackOptions(const PackOptions& options);
// jpeg_layout indexed re-lays JPEG records: kInvalidArgument, naming `holder` (what would hold
// the records: the pack, an archive), for an encoding that stores none (raw, zstd).
Status CheckJpegLayout(bool indexed, format::Encoding encoding, const std::string& holder);
// The recorded options as a JSON object, plus "source": `source_kind` ("folder" or "list").
std::string PackOptionsJson(const PackOptions& options, std::string_view source_kind);

}  // namespace shardfeed::converter
