// Shared by the CLI's command files.
#pragma once

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardfeed/base/option_table.h"
#include "shardfeed/base/status.h"
#include "shardfeed/converter/pack.h"
#include "shardfeed/reader/loader.h"
#include "shardfeed/storage/remote.h"

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
double CpuSeconds();                  // user + system CPU of this process so far
// Parses a subcommand's options (adding --help). Returns -1 to go on, else the exit code: 0
// after printing help, 2 after printing the error and `usage`.
int ParseArgs(int argc, char** argv, boost::program_options::options_description& desc,
              boost::program_options::positional_options_description& pos,
              boost::program_options::variables_map& vm, const char* usage);

// The flags of an option table (base/option_table.h: the loader's, pack's, and each command's
// own): one per entry, named OptionFlag(name), with the value in `current` as default (none when
// empty); a bare bool flag means true, a bare --device cuda. Help states each entry's choices
// and range. `helps` keeps the help texts alive (program_options stores the pointers).
template <typename T>
void AddOptionTable(boost::program_options::options_description& desc, const OptionTable<T>& table,
                    const T& current, std::vector<std::string>* helps,
                    const std::vector<std::string>& except = {}) {
  helps->reserve(helps->size() + table.size());
  for (const Option<T>& o : table) {
    if (std::find(except.begin(), except.end(), o.name) != except.end()) continue;
    auto* value = boost::program_options::value<std::string>();
    if (const std::string v = o.get(current); !v.empty()) value->default_value(v);
    if (o.kind == OptionKind::kBool) value->implicit_value("true");
    if (std::string_view(o.name) == "device") value->implicit_value("cuda");
    std::string help = o.help;
    if (o.choices) help += std::string(" [") + o.choices + "]";
    if (!o.range.empty()) help += " [" + o.range + "]";
    helps->push_back(std::move(help));
    desc.add_options()(OptionFlag(o.name).substr(2).c_str(), value, helps->back().c_str());
  }
}

// Sets the options the command line gave (not the defaults) through the table's setters.
template <typename T>
Status ApplyOptionTable(const boost::program_options::variables_map& vm,
                        const OptionTable<T>& table, T* options) {
  for (const Option<T>& o : table) {
    const std::string flag = OptionFlag(o.name).substr(2);
    if (vm.count(flag) && !vm[flag].defaulted()) {
      SF_RETURN_IF_ERROR(o.set(options, vm[flag].as<std::string>()));
    }
  }
  return Status::OK();
}

// --cache-dir and --cache-limit (storage::CacheOptionTable) for a command that opens archives,
// which may be remote; ApplyCacheOptions sets what the command line gave as the process's
// defaults (storage::SetCacheOptions), so every archive the command opens reads through them.
inline void AddCacheOptions(boost::program_options::options_description& desc,
                            std::vector<std::string>* helps) {
  AddOptionTable(desc, storage::CacheOptionTable(), storage::CacheOptions(), helps);
}
inline Status ApplyCacheOptions(const boost::program_options::variables_map& vm) {
  storage::CacheOptions cache;
  SF_RETURN_IF_ERROR(ApplyOptionTable(vm, storage::CacheOptionTable(), &cache));
  storage::SetCacheOptions(cache);
  return Status::OK();
}

// The consumer every timing command runs (bench, bench --sweep, tune): takes batches of the
// current epoch (the caller starts it) as a training loop does, waiting for each device copy
// and simulating a `step_ms` training step after each batch, until the epoch ends or
// `max_batches` were taken (0: no limit). Batches are released at once.
struct Consumed {
  uint64_t batches = 0;
  double images = 0, bytes = 0;         // bytes: the batches' image bytes
  double seconds = 0, cpu_seconds = 0;  // wall and process CPU time of this call
  bool epoch_ended = false;
};
Result<Consumed> Consume(reader::Loader& loader, uint64_t max_batches, double step_ms);

// Every loader option as a flag (bench, tune), but those in `except` (tune chooses workers and
// prefetch itself).
void AddLoaderOptions(boost::program_options::options_description& desc,
                      const reader::LoaderOptions& current, std::vector<std::string>* helps,
                      std::vector<std::string> except = {});

// The resolved value of every loader option, as text ("batch_size": "64", "flip": "false"):
// what bench and tune echo, so a run says exactly what it ran with.
std::vector<std::pair<std::string, std::string>> LoaderOptionValues(
    const reader::LoaderOptions& options);

// An OUT of pack, merge or convert that may be s3://bucket/prefix (remote_out.cpp; docs/REMOTE.md,
// "Writing"). For a local OUT, path() is OUT and Finish() passes the status through. For s3://:
// Prepare refuses a destination that already has a manifest.json unless `overwrite` (before any
// work), and the command builds into path(), <staging>/<last component of OUT> (staging: --staging
// DIR, else a new folder under $TMPDIR or /tmp); Finish uploads it when the build succeeded
// (shards, then the manifest last) and removes the local copy; on failure it keeps the copy and
// says where. SIGINT/SIGTERM during the upload stop it (storage::CancelUploads: multipart
// uploads begun are aborted, no manifest is written unless it was already on its way: the message
// then says it may have landed), keep the copy, say so, and then end the process by that signal.
// During the build before it they end the process as usual: the staging folder is then left as
// it was. With `overwrite`, the replaced archive's shards that the new one does not overwrite are
// removed after the upload, each only while it is still the object it was before the upload
// (storage::RemoteDeleteIfUnchanged; kept with a warning otherwise), and the new manifest is
// then checked to be still this command's (kChanged otherwise: another job wrote the prefix).
class StagedOut {
 public:
  static Result<StagedOut> Prepare(const std::string& out, const std::string& staging,
                                   bool overwrite);
  const std::string& path() const { return path_; }  // where the command writes
  Status Finish(const Status& built) const;

 private:
  void ReplacedShards(std::vector<std::string>* files, std::vector<std::string>* etags) const;
  Status RemoveReplaced(const std::vector<std::string>& files,
                        const std::vector<std::string>& etags,
                        const std::string& manifest_etag) const;

  std::string out_, path_, root_;
  bool overwrite_ = false, made_root_ = false;
};

}  // namespace shardfeed::cli
