// Every Loader option, declared once (base/option_table.h, the mechanism every table shares):
// its name, kind, allowed values and range, help, and how its text form sets a LoaderOptions
// field. The CLI (`shardfeed bench --batch-size 64`), the Python
// bindings (`shardfeed.Loader(path, batch_size=64)`) and C++ callers (SetLoaderOption, or the
// struct fields directly, then ValidateLoaderOptions) all go through this table, so they accept
// and refuse the same values with the same messages (tests/cli/test_options.py walks it).
//
// Thread-safety: the table is immutable; the functions touch only their arguments.
// Errors: kInvalidArgument whose message starts with the option's name and its flag, e.g.
// "batch_size (--batch-size) must be a whole number in 1..1048576, not 'x'".
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "shardfeed/base/option_table.h"
#include "shardfeed/base/status.h"
#include "shardfeed/reader/loader.h"

namespace shardfeed::reader {

using LoaderOption = Option<LoaderOptions>;

// All options, in the order help lists them (an OptionTable: Find, Set, Unknown).
const OptionTable<LoaderOptions>& LoaderOptionTable();
// "batch_size" or "batch-size" -> its entry; nullptr if there is none.
const LoaderOption* FindLoaderOption(std::string_view name);
// Sets one option from its text form. An unknown name is kInvalidArgument naming it and the
// closest known one ("unexpected loader option 'batch_sise'; did you mean 'batch_size'?").
Status SetLoaderOption(LoaderOptions* options, std::string_view name, std::string_view text);
// Rules across fields and ranges the setters cannot see (a C++ caller may set fields
// directly): batch size in 1..1048576, workers and max_workers at most 4096, prefetch and
// max_prefetch at most 4096 (prefetch 0 is "auto", max_prefetch 0 or >= 2), rank < world size,
// timeout >= 0, the transform's rules (ValidateTransform), normalize_on_device only with device
// copies and a float dtype. Loader::Create calls it first.
Status ValidateLoaderOptions(const LoaderOptions& options);

}  // namespace shardfeed::reader
