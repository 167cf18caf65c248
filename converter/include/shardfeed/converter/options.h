// Every pack option, declared once (as reader/options.h does for the loader): the CLI
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

#include "shardfeed/base/option_text.h"
#include "shardfeed/base/status.h"
#include "shardfeed/converter/pack.h"

namespace shardfeed::converter {

enum class PackOptionKind { kBool, kCount, kChoice, kBytes, kText };

struct PackOption {
  const char* name;  // Python keyword; the CLI flag is OptionFlag(name)
  PackOptionKind kind;
  const char* choices;  // kChoice: "a|b|c"
  const char* help;
  bool recorded;  // shapes the records: written to the manifest's "options"
  Status (*set)(PackOptions* options, std::string_view text);
  std::string (*get)(const PackOptions& options);
};

const std::vector<PackOption>& PackOptionTable();
const PackOption* FindPackOption(std::string_view name);  // "max_side" or "max-side"
Status SetPackOption(PackOptions* options, std::string_view name, std::string_view text);
// Rules across options (what Pack() refuses before reading anything).
Status ValidatePackOptions(const PackOptions& options);
// The recorded options as a JSON object, plus "source": `source_kind` ("folder" or "list").
std::string PackOptionsJson(const PackOptions& options, std::string_view source_kind);

}  // namespace shardfeed::converter
