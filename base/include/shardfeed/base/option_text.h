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
// A whole number >= 0, digits only, at most 19 of them.
bool ParseCountText(std::string_view text, uint64_t* out);
// A finite decimal number.
bool ParseNumberText(std::string_view text, double* out);
// Comma-separated numbers: exactly `n` of them, or one (repeated n times) when `broadcast`.
bool ParseNumberList(std::string_view text, size_t n, bool broadcast, std::vector<double>* out);
// A byte size with an optional unit: 64K, 1M, 1.5G, 2T (powers of 1024), or plain bytes.
bool ParseByteSize(std::string_view text, uint64_t* out);
// The CLI flag of an option name: "batch_size" -> "--batch-size".
std::string OptionFlag(std::string_view name);
// kInvalidArgument: "<name> (<flag>) must be <what>, not '<text>'".
Status BadOption(std::string_view name, const std::string& what, std::string_view text);
// A number as option text ("%.9g").
std::string NumberText(double value);

}  // namespace shardfeed
