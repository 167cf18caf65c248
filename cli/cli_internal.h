// Shared by the CLI's command files.
#pragma once

#include <cstdint>
#include <string>

#include "shardfeed/format/status.h"

namespace shardfeed::cli {

int ExitCodeFor(const Status& s);
int Fail(const Status& s);  // prints the error, returns its exit code
bool ParseBytes(const std::string& text, uint64_t* out);
std::string FormatDuration(double seconds);
int CmdBench(int argc, char** argv);

}  // namespace shardfeed::cli
