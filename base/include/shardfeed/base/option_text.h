// Reading option values from text, the one form the CLI and the Python bindings share (see
// reader/options.h and converter/options.h, the tables that use these). Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardfeed/base/status.h"

namespace shardfeed {

// true|false, 1|0, yes|no, on|off (and Python's True|False).
bool ParseBoolText(std::string_view text, bool* out);
// A whole number in 0..2^64-1: ASCII digits only (no sign, no space).
bool ParseCountText(std::string_view text, uint64_t* out);
// A finite decimal number: an optional '-', then a digit or '.' ("1", "-0.5", ".5", "1e3");
// no leading space, no '+', no hex, no inf/nan.
bool ParseNumberText(std::string_view text, double* out);
// Comma-separated numbers: exactly `n` of them, or one (repeated n times) when `broadcast`.
bool ParseNumberList(std::string_view text, size_t n, bool broadcast, std::vector<double>* out);
// A byte size with an optional unit, dd's rule: K M G T, KiB MiB GiB TiB (also Ki...) are powers
// of 1024, KB MB GB TB powers of 1000, B or nothing bytes; one space may separate number and
// unit ("2 GiB"). Starts with a digit (no sign, no hex) and stays below 2^64. The one parser of
// sizes (options, SHARDFEED_CACHE_LIMIT).
bool ParseByteSize(std::string_view text, uint64_t* out);
// The CLI flag of an option name: "batch_size" -> "--batch-size".
std::string OptionFlag(std::string_view name);
// kInvalidArgument: "<name> (<flag>) must be <what>, not '<text>'".
Status BadOption(std::string_view name, const std::string& what, std::string_view text);
// A number as option text ("%.9g").
std::string NumberText(double value);

// The allowed values of a whole-number option as help and errors state them: "a whole number
// in 1..4096", or "a whole number >= 1" when `max` is 2^64-1.
std::string CountRange(uint64_t min, uint64_t max);
// Reads a whole number in [min, max]; else BadOption naming the option and CountRange.
Status ParseCountOption(std::string_view name, std::string_view text, uint64_t min, uint64_t max,
                        uint64_t* out);

// The allowed values of a decimal option: [min, max], each end open or closed.
struct NumberRange {
  double min, max;
  bool min_open = false, max_open = false;
};
// "a number in (0, 1)", "a number in [0, 1000000000]".
std::string NumberRangeText(const NumberRange& range);
// Reads a finite number inside `range`; else BadOption naming the option and the range.
Status ParseNumberOption(std::string_view name, std::string_view text, const NumberRange& range,
                         double* out);

// The candidate closest to `name` by edit distance (case, '-' and '_' ignored), when it is close
// enough to be a likely typo ("batch_sise" -> "batch_size", "num_workers" -> "workers");
// empty when none is.
std::string ClosestName(std::string_view name, const std::vector<std::string>& candidates);

}  // namespace shardfeed
