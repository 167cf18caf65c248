// Shared by the CLI's command files.
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "shardfeed/base/option_text.h"
#include "shardfeed/base/status.h"
#include "shardfeed/converter/pack.h"
#include "shardfeed/reader/loader.h"

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
int CmdTune(int argc, char** argv);
int CmdStats(int argc, char** argv);  // stats_cmd.cpp
double CpuSeconds();  // user + system CPU of this process so far
// Parses a subcommand's options (adding --help). Returns -1 to go on, else the exit code: 0
// after printing help, 2 after printing the error and `usage`.
int ParseArgs(int argc, char** argv, boost::program_options::options_description& desc,
              boost::program_options::positional_options_description& pos,
              boost::program_options::variables_map& vm, const char* usage);

// The flags of an option table (reader/options.h, converter/options.h): one per entry, named
// OptionFlag(name), with the value in `current` as default (none when empty) and `implicit`
// (may be null) as the value of the bare flag. `helps` keeps the help texts alive.
template <typename Table, typename Options, typename Implicit>
void AddOptionTable(boost::program_options::options_description& desc, const Table& table,
                    const Options& current, Implicit implicit, std::vector<std::string>* helps) {
  helps->reserve(helps->size() + table.size());  // program_options keeps the pointers
  for (const auto& o : table) {
    auto* value = boost::program_options::value<std::string>();
    if (const std::string v = o.get(current); !v.empty()) value->default_value(v);
    if (const char* bare = implicit(o)) value->implicit_value(bare);
    helps->push_back(std::string(o.help) +
                     (o.choices ? std::string(" [") + o.choices + "]" : std::string()));
    desc.add_options()(OptionFlag(o.name).substr(2).c_str(), value, helps->back().c_str());
  }
}

// Sets the options the command line gave (not the defaults) through the table's setters.
template <typename Table, typename Options>
Status ApplyOptionTable(const boost::program_options::variables_map& vm, const Table& table,
                        Options* options) {
  for (const auto& o : table) {
    const std::string flag = OptionFlag(o.name).substr(2);
    if (vm.count(flag) && !vm[flag].defaulted()) {
      SF_RETURN_IF_ERROR(o.set(options, vm[flag].as<std::string>()));
    }
  }
  return Status::OK();
}

// Every loader option as a flag (bench, tune): a bare bool flag means true, a bare --device
// means cuda.
void AddLoaderOptions(boost::program_options::options_description& desc,
                      const reader::LoaderOptions& current, std::vector<std::string>* helps);

}  // namespace shardfeed::cli
