// Shared by the CLI's command files.
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <string>

#include "shardfeed/format/status.h"

namespace shardfeed::cli {

int ExitCodeFor(const Status& s);
int Fail(const Status& s);  // prints the error, returns its exit code
bool ParseBytes(const std::string& text, uint64_t* out);
std::string FormatDuration(double seconds);
int CmdBench(int argc, char** argv);
// Parses a subcommand's options (adding --help). Returns -1 to go on, else the exit code: 0
// after printing help, 2 after printing the error and `usage`.
int ParseArgs(int argc, char** argv, boost::program_options::options_description& desc,
              boost::program_options::positional_options_description& pos,
              boost::program_options::variables_map& vm, const char* usage);

}  // namespace shardfeed::cli
