// Shared by the CLI's command files.
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <string>

#include "shardfeed/base/status.h"
#include "shardfeed/converter/pack.h"

namespace shardfeed::cli {

int ExitCodeFor(const Status& s);

#ifdef SHARDFEED_WITH_MPI
// Ranks in the MPI job this process was started in by mpirun (1 outside one).
int MpiWorldSize();
// pack on every rank of the job: see mpi_pack.cpp.
int MpiPack(const std::string& src, const std::string& list, const std::string& out,
            converter::PackOptions opt, const std::string& report);
#endif
int Fail(const Status& s);  // prints the error, returns its exit code
std::string FormatDuration(double seconds);
int CmdBench(int argc, char** argv);
// Parses a subcommand's options (adding --help). Returns -1 to go on, else the exit code: 0
// after printing help, 2 after printing the error and `usage`.
int ParseArgs(int argc, char** argv, boost::program_options::options_description& desc,
              boost::program_options::positional_options_description& pos,
              boost::program_options::variables_map& vm, const char* usage);

}  // namespace shardfeed::cli
