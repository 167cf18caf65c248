// Every Loader option, declared once: its name, kind, allowed values, help, and how its text
// form sets a LoaderOptions field. The CLI (`shardfeed bench --batch-size 64`), the Python
// bindings (`shardfeed.Loader(path, batch_size=64)`) and C++ callers (SetLoaderOption, or the
// struct fields directly, then ValidateLoaderOptions) all go through this table, so they accept
// and refuse the same values with the same messages (tests/cli/test_options.py walks it).
//
// Thread-safety: the table is immutable; the functions touch only their arguments.
// Errors: kInvalidArgument whose message starts with the option's name and its flag, e.g.
// "batch_size (--batch-size) must be a whole number of at least 1, not 'x'".
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "shardfeed/base/option_text.h"  // OptionFlag
#include "shardfeed/base/status.h"
#include "shardfeed/reader/loader.h"

namespace shardfeed::reader {

enum class OptionKind {
  kBool,    // true|false (also 1|0, yes|no, on|off); a bare CLI flag means true
  kCount,   // a whole number >= 0 (some options: >= 1)
  kNumber,  // a finite decimal number
  kChoice,  // one of `choices`
  kList,    // comma-separated numbers ("R,G,B", "MIN,MAX")
  kText,    // free-form, checked by the setter (device)
};

struct LoaderOption {
  const char* name;  // Python keyword; the CLI flag is "--" + name with '_' as '-'
  OptionKind kind;
  const char* choices;  // kChoice: "a|b|c"; else nullptr
  const char* help;
  Status (*set)(LoaderOptions* options, std::string_view text);
  std::string (*get)(const LoaderOptions& options);  // the current value as text
};

// All options, in the order help lists them.
const std::vector<LoaderOption>& LoaderOptionTable();
// "batch_size" or "batch-size" -> its entry; nullptr if there is none.
const LoaderOption* FindLoaderOption(std::string_view name);
// Sets one option from its text form. Unknown names are kInvalidArgument naming them.
Status SetLoaderOption(LoaderOptions* options, std::string_view name, std::string_view text);
// Rules across fields and ranges the setters cannot see (a C++ caller may set fields
// directly): batch size >= 1, prefetch and max_prefetch at most 4096 (prefetch 0 is "auto",
// max_prefetch 0 or >= 2), rank < world size, timeout >= 0, the transform's
// rules (ValidateTransform), normalize_on_device only with device copies and a float dtype.
// Loader::Create calls it first.
Status ValidateLoaderOptions(const LoaderOptions& options);

}  // namespace shardfeed::reader
