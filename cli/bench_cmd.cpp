// shardfeed bench: reads epochs as training would and reports throughput and the wait profile.
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "cli_internal.h"
#include "plot_source.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/reader/loader.h"
#include "shardfeed/reader/options.h"
#include "shardfeed/storage/remote.h"
#include "shardfeed/validate/extract.h"

namespace po = boost::program_options;

namespace shardfeed::cli {

Result<Consumed> Consume(reader::Loader& loader, uint64_t max_batches, double step_ms) {
  Consumed c;
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = CpuSeconds();
  while (max_batches == 0 || c.batches < max_batches) {
    SF_ASSIGN_OR_RETURN(reader::Batch batch, loader.Next());
    if (!batch) {
      c.epoch_ended = true;
      break;
    }
    ++c.batches;
    c.images += double(batch.size());
    c.bytes += double(batch.image_bytes());
    if (loader.on_device()) SF_RETURN_IF_ERROR(batch.Synchronize());
    batch.Release();
    if (step_ms > 0) {  // the simulated training step
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(step_ms));
    }
  }
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  c.cpu_seconds = CpuSeconds() - cpu0;
  return c;
}

void AddLoaderOptions(boost::program_options::options_description& desc,
                      const reader::LoaderOptions& current, std::vector<std::string>* helps,
                      std::vector<std::string> except) {
  AddOptionTable(desc, reader::LoaderOptionTable(), current, helps, except);
}

std::vector<std::pair<std::string, std::string>> LoaderOptionValues(
    const reader::LoaderOptions& options) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const reader::LoaderOption& o : reader::LoaderOptionTable()) {
    out.emplace_back(o.name, o.get(options));
  }
  return out;
}

namespace {

// bench's own flags (the loader's come from reader/options.h).
struct BenchArgs {
  uint32_t epochs = 1;
  double step_ms = 0;
};

const OptionTable<BenchArgs>& BenchArgTable() {
  static const OptionTable<BenchArgs> table(
      "bench option",
      {CountOption<BenchArgs>("epochs", 1, 1000000, "epochs to read", &BenchArgs::epochs),
       NumberOption<BenchArgs>("step_ms", {0, 600000}, "simulated training step per batch (ms)",
                               &BenchArgs::step_ms)});
  return table;
}

using Axes = std::vector<std::pair<std::string, std::vector<std::string>>>;

// --sweep NAME=V1,V2,...: each NAME a loader option, each value one it accepts.
Result<Axes> ParseSweep(const std::vector<std::string>& specs, const reader::LoaderOptions& base) {
  Axes axes;
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos) {
      return Status::InvalidArgument(
          "--sweep takes NAME=V1,V2,... with NAME a loader option, not '", spec, "'");
    }
    const reader::LoaderOption* o = reader::FindLoaderOption(spec.substr(0, eq));
    if (!o) return reader::LoaderOptionTable().Unknown(spec.substr(0, eq));
    std::vector<std::string> values;
    for (size_t start = eq + 1; start <= spec.size();) {
      size_t end = spec.find(',', start);
      if (end == std::string::npos) end = spec.size();
      values.push_back(spec.substr(start, end - start));
      reader::LoaderOptions probe = base;
      SF_RETURN_IF_ERROR(o->set(&probe, values.back()));
      start = end + 1;
    }
    axes.emplace_back(o->name, values);
  }
  return axes;
}

// One combination of a sweep: `epochs` epochs (the first a warm-up when there are two or more).
Result<nlohmann::json> SweepPoint(const std::shared_ptr<const format::Archive>& archive,
                                  reader::LoaderOptions opt, const nlohmann::json& settings,
                                  uint32_t epochs, double step_ms) {
  for (const auto& [name, value] : settings.items()) {
    SF_RETURN_IF_ERROR(reader::SetLoaderOption(&opt, name, value.get<std::string>()));
  }
  SF_RETURN_IF_ERROR(reader::ValidateLoaderOptions(opt));
  const int asked_workers = opt.workers;  // -1: auto (the loader's options hold what it chose)
  SF_ASSIGN_OR_RETURN(auto loader, reader::Loader::Create(archive, opt));
  double images = 0, seconds = 0, wait = 0, consumer = 0, cpu = 0;
  reader::EpochStats st;
  for (uint32_t e = 0; e < epochs; ++e) {
    SF_RETURN_IF_ERROR(loader->StartEpoch(e));
    SF_ASSIGN_OR_RETURN(Consumed c, Consume(*loader, 0, step_ms));
    st = loader->Stats();
    if (epochs >= 2 && e == 0) continue;  // the warm-up
    seconds += c.seconds, images += double(st.images), cpu += c.cpu_seconds;
    wait += st.wait_seconds, consumer += st.consumer_seconds;
  }
  return nlohmann::json{{"settings", settings},
                        {"images_per_second", seconds > 0 ? images / seconds : 0.0},
                        {"wait_fraction", wait + consumer > 0 ? wait / (wait + consumer) : 0.0},
                        {"cpu_seconds_per_1000_images", images > 0 ? 1000 * cpu / images : 0.0},
                        {"workers", asked_workers},
                        {"active_workers", st.workers},
                        {"prefetch", st.prefetch},
                        {"ring_bytes", st.ring_bytes},
                        {"tuning", st.tuning}};
}

// Draws a sweep's JSON (`data`) into `plot` with a Python child. Returns 0, or 3 after saying
// why it could not.
int DrawSweep(const std::string& data, const std::string& plot) {
  // The drawing is Python's (matplotlib): python/shardfeed/plot.py, built into this program, run
  // with `-c`. $SHARDFEED_PYTHON names the interpreter; else the first of these that has
  // matplotlib: python3 beside this program (a venv pip installed it into), the interpreter
  // this build's module was made for, Debian's, python3 on PATH.
  std::vector<std::string> pythons;
  if (const char* env = std::getenv("SHARDFEED_PYTHON"); env && *env) {
    pythons.push_back(env);
  } else {
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) pythons.push_back((self.parent_path() / "python3").string());
    pythons.push_back(SHARDFEED_BUILD_PYTHON);
    pythons.push_back("/usr/bin/python3");
    pythons.push_back("python3");
  }
  double limit = 120;
  if (const char* t = std::getenv("SHARDFEED_PLOT_TIMEOUT"); t && *t) {
    double v = 0;
    if (ParseNumberText(t, &v) && v > 0) limit = v;
  }
  std::string outcome = "failed: no Python interpreter with matplotlib was found (tried";
  for (const std::string& p : pythons) outcome += " " + p;
  outcome += "; set $SHARDFEED_PYTHON)";
  bool drawn = false;
  std::vector<std::string> tried;
  for (const std::string& python : pythons) {
    if (python.empty() || std::find(tried.begin(), tried.end(), python) != tried.end()) continue;
    tried.push_back(python);
    if (python.find('/') != std::string::npos && ::access(python.c_str(), X_OK) != 0) continue;
    std::vector<std::string> args = {python, "-c", kPlotSource, data, plot};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawnp(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
      continue;
    }
    // A bounded wait: a plotting child that hangs (a broken backend, a font cache rebuilt over
    // a slow filesystem) is killed after $SHARDFEED_PLOT_TIMEOUT seconds (120), and the
    // sweep's JSON stays for a rerun.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit);
    int status = 0;
    bool exited = false, timed_out = false;
    for (;;) {
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        exited = true;
        break;
      }
      if (r < 0 && errno != EINTR) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pid, SIGKILL);
        while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const int code = exited && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (code == 0) {
      drawn = true;
      break;
    }
    if (code == 4 || code == 127) continue;  // no matplotlib there (plot.py), or no program
    outcome = timed_out
                  ? "took over " + NumberText(limit) + " s with " + python + " and was stopped"
                  : "failed with " + python;
    break;
  }
  if (!drawn) {
    std::fprintf(stderr,
                 "shardfeed: the sweep is in %s; drawing it %s: run python3 -m shardfeed.plot "
                 "%s %s where matplotlib is installed\n",
                 data.c_str(), outcome.c_str(), data.c_str(), plot.c_str());
    return 3;
  }
  std::printf("sweep: %s, plot: %s\n", data.c_str(), plot.c_str());
  return 0;
}

// bench --sweep: every combination of the given option values, one loader each.
int RunSweep(const std::string& path, const reader::LoaderOptions& base,
             const std::vector<std::string>& specs, uint32_t epochs, double step_ms,
             const std::string& plot) {
  auto axes = ParseSweep(specs, base);
  if (!axes.ok()) return Fail(axes.status());
  auto archive = format::Archive::Open(path);
  if (!archive.ok()) return Fail(archive.status());
  nlohmann::json results = nlohmann::json::array(), swept = nlohmann::json::array();
  for (const auto& a : *axes) swept.push_back(a.first);
  std::vector<size_t> at(axes->size(), 0);
  for (bool more = true; more;) {
    nlohmann::json settings = nlohmann::json::object();
    for (size_t k = 0; k < axes->size(); ++k) settings[(*axes)[k].first] = (*axes)[k].second[at[k]];
    auto r = SweepPoint(*archive, base, settings, epochs, step_ms);
    if (!r.ok()) return Fail(r.status());
    std::printf(
        "sweep %-40s %9.0f images/s  wait %5.1f%%  %6.2f CPU-s/1000 images  %d workers, %d "
        "slots (%.0f MB)\n",
        settings.dump().c_str(), (*r)["images_per_second"].get<double>(),
        100 * (*r)["wait_fraction"].get<double>(),
        (*r)["cpu_seconds_per_1000_images"].get<double>(), (*r)["active_workers"].get<int>(),
        (*r)["prefetch"].get<int>(), (*r)["ring_bytes"].get<double>() / 1e6);
    std::fflush(stdout);
    results.push_back(std::move(*r));
    more = false;
    for (size_t k = axes->size(); k-- > 0;) {
      if (++at[k] < (*axes)[k].second.size()) {
        more = true;
        break;
      }
      at[k] = 0;
    }
  }
  const nlohmann::json out = {{"archive", path},  {"step_ms", step_ms},
                              {"epochs", epochs}, {"batch_size", base.batch_size},
                              {"swept", swept},   {"results", results}};
  if (plot.empty()) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  const std::string data = plot + ".json";
  const std::string text = out.dump(2) + "\n";
  if (Status s =
          validate::WriteNewFile(data, reinterpret_cast<const uint8_t*>(text.data()), text.size());
      !s.ok()) {
    return Fail(s);
  }
  return DrawSweep(data, plot);
}

// Every option as the loader resolved it (`resolved`); workers and prefetch asked as auto
// (`asked`) say so: the loader's options hold its first choice, which tuning then changes (the
// summary's count).
nlohmann::json EchoedOptions(const reader::LoaderOptions& asked,
                             const reader::LoaderOptions& resolved) {
  nlohmann::json options = nlohmann::json::object();
  for (const auto& [name, value] : LoaderOptionValues(resolved)) {
    const bool automatic =
        (name == "workers" && asked.workers == reader::LoaderOptions::kAutoWorkers) ||
        (name == "prefetch" && asked.prefetch == reader::LoaderOptions::kAutoPrefetch);
    options[name] = automatic ? std::string("auto") : value;
  }
  return options;
}

// One epoch's figures as bench's JSON has them.
nlohmann::json EpochJson(uint32_t e, const Consumed& c, const reader::EpochStats& st) {
  return {{"epoch", e},
          {"images", st.images},
          {"seconds", c.seconds},
          {"images_per_second", st.images / c.seconds},
          {"wait_fraction", st.wait_fraction()},
          {"skipped", st.skipped},
          {"active_workers", st.workers},
          {"prefetch", st.prefetch},
          {"ring_bytes", st.ring_bytes},
          {"ring_full_seconds", st.ring_full_seconds},
          {"run_ahead_batches", st.run_ahead_batches},
          {"ahead_kept", st.ahead_kept},
          {"kept_slots", st.kept_slots},
          {"tuning", st.tuning},
          {"wait_seconds", st.wait_seconds},
          {"consumer_seconds", st.consumer_seconds},
          {"bytes_fetched", st.bytes_fetched},
          {"cache_hits", st.cache_hits},
          {"cache_misses", st.cache_misses},
          {"fetch_wait_seconds", st.fetch_wait_seconds},
          {"stage_seconds",
           {{"read", st.read}, {"decode", st.decode}, {"collate", st.collate}, {"copy", st.copy}}}};
}

// Reads `epochs` epochs and prints them (one JSON object, or a line per epoch and a summary).
int BenchEpochs(const std::string& path, const reader::LoaderOptions& opt, const BenchArgs& args,
                bool json) {
  // A remote archive checked whole at open downloads its shards there, before any epoch: those
  // downloads are the open's (the epochs' remote lines count their own).
  const storage::FetchStats before = storage::GetFetchStats();
  auto archive = format::Archive::Open(path);
  if (!archive.ok()) return Fail(archive.status());
  const storage::FetchStats opened = storage::GetFetchStats();
  const uint64_t open_bytes = opened.bytes_fetched - before.bytes_fetched;
  const uint64_t open_hits = opened.hits - before.hits, open_misses = opened.misses - before.misses;
  if (!json && (open_bytes || open_hits || open_misses)) {
    std::printf("open: remote: %.1f MB fetched, %llu shards from the cache, %llu downloaded\n",
                open_bytes / 1e6, static_cast<unsigned long long>(open_hits),
                static_cast<unsigned long long>(open_misses));
  }
  auto loader = reader::Loader::Create(*archive, opt);
  if (!loader.ok()) return Fail(loader.status());
  reader::Loader& l = **loader;
  nlohmann::json epochs_json = nlohmann::json::array();
  double total_images = 0, total_seconds = 0, total_bytes = 0;
  reader::EpochStats last;
  for (uint32_t e = 0; e < args.epochs; ++e) {
    if (Status s = l.StartEpoch(e); !s.ok()) return Fail(s);
    auto c = Consume(l, 0, args.step_ms);
    if (!c.ok()) return Fail(c.status());
    const double secs = c->seconds;
    const reader::EpochStats st = last = l.Stats();
    total_images += st.images, total_seconds += secs, total_bytes += c->bytes;
    epochs_json.push_back(EpochJson(e, *c, st));
    if (json) continue;
    std::printf(
        "epoch %u: %llu images in %.2f s = %.0f images/s, %.1f MB/s out; consumer waited %.0f%% "
        "of its time (%.2f s wait, %.2f s between batches); worker time: read %.2f s, decode "
        "%.2f s, collate %.2f s, copy %.2f s\n",
        e, static_cast<unsigned long long>(st.images), secs, st.images / secs,
        c->bytes / secs / 1e6, 100 * st.wait_fraction(), st.wait_seconds, st.consumer_seconds,
        st.read, st.decode, st.collate, st.copy);
    if (st.bytes_fetched || st.cache_hits || st.cache_misses) {
      std::printf(
          "  remote: %.1f MB fetched, %llu shards from the cache, %llu downloaded; workers waited "
          "%.2f s for downloads%s\n",
          st.bytes_fetched / 1e6, static_cast<unsigned long long>(st.cache_hits),
          static_cast<unsigned long long>(st.cache_misses), st.fetch_wait_seconds,
          st.wait_seconds > 0 && st.fetch_wait_seconds >= 0.005  // not for what prints as 0.00
              ? " (the consumer's wait was, at least in part, fetch wait)"
              : "");
    }
  }
  const double ips = total_images / total_seconds;
  const std::string crop = reader::FindLoaderOption("crop")->get(opt);
  const std::string layout = reader::FindLoaderOption("layout")->get(opt);
  const nlohmann::json options = EchoedOptions(opt, l.options());
  if (json) {
    nlohmann::json j = {
        {"archive", path},
        {"images_per_second", ips},
        {"mb_per_second", total_bytes / total_seconds / 1e6},
        {"images", total_images},
        {"seconds", total_seconds},
        {"batch_size", opt.batch_size},
        {"workers", l.options().workers},
        {"crop", crop},
        {"dtype", reader::DTypeName(opt.transform.dtype)},
        {"layout", layout},
        {"size", l.out_height()},
        {"output_shape", {l.out_height(), l.out_width()}},
        {"mode", reader::FindLoaderOption("mode")->get(opt)},
        {"flip", opt.transform.flip},
        {"pinned", reader::PinKindName(l.pin_kind())},
        {"device", l.on_device()},
        {"step_ms", args.step_ms},
        {"options", options},
        {"open",
         {{"bytes_fetched", open_bytes}, {"cache_hits", open_hits}, {"cache_misses", open_misses}}},
        {"epochs", epochs_json}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf(
      "read %.0f images in %.2f s: %.0f images/s (%s, batch %u, %d workers%s, %d ring slots%s, "
      "%ux%u %s, %s%s %s, ring in %s memory%s)\n",
      total_images, total_seconds, ips, path.c_str(), opt.batch_size, last.workers,
      opt.workers == reader::LoaderOptions::kAutoWorkers ? " (auto)" : "", last.prefetch,
      opt.prefetch == reader::LoaderOptions::kAutoPrefetch ? " (auto)" : "", l.out_height(),
      l.out_width(),
      crop == "none" ? "whole images at their stored shape" : (crop + " crop").c_str(),
      opt.transform.flip ? "random flip, " : "no flip, ", reader::DTypeName(opt.transform.dtype),
      layout.c_str(), reader::PinKindName(l.pin_kind()), l.on_device() ? ", copied to GPU" : "");
  std::string line;
  for (const auto& [name, value] : options.items()) {
    line += " " + name + "=" + value.get<std::string>();
  }
  std::printf("options:%s\n", line.c_str());
  if (!last.tuning.empty()) std::printf("tuning: %s\n", last.tuning.c_str());
  return 0;
}

}  // namespace

int CmdBench(int argc, char** argv) {
  // Every loader option comes from reader/options.h (the Python Loader takes the same ones);
  // bench adds its own. It reads as training does: shuffled unless told otherwise.
  reader::LoaderOptions opt;
  opt.shuffle = true;
  BenchArgs args;
  po::options_description desc("bench options (the loader's, as shardfeed.Loader takes them)");
  std::string path, plot;
  std::vector<std::string> sweep, helps;  // helps: kept alive, program_options stores pointers
  desc.add_options()("archive", po::value(&path)->required(), "archive to read");
  AddLoaderOptions(desc, opt, &helps);
  AddOptionTable(desc, BenchArgTable(), args, &helps);
  AddCacheOptions(desc, &helps);
  desc.add_options()(
      "sweep", po::value(&sweep)->multitoken(),
      "NAME=V1,V2,... [NAME=...]: run every combination of these loader options (e.g. "
      "workers=1,2 prefetch=2,4,8), each for --epochs epochs (the first a warm-up when there "
      "are two or more), and report images/s, the consumer's wait and CPU per 1000 images")(
      "plot", po::value(&plot),
      "with --sweep: also draw the results into this PNG (with matplotlib, as python3 -m "
      "shardfeed.plot does)")("json", "print one JSON object")("quiet,q",
                                                               "accepted; bench "
                                                               "prints no progress");
  po::positional_options_description pos;
  pos.add("archive", 1);
  po::variables_map vm;
  int rc = ParseArgs(argc, argv, desc, pos, vm, "shardfeed bench ARCHIVE [options]");
  if (rc >= 0) return rc;
  if (Status s = ApplyOptionTable(vm, reader::LoaderOptionTable(), &opt); !s.ok()) return Fail(s);
  if (Status s = ApplyOptionTable(vm, BenchArgTable(), &args); !s.ok()) return Fail(s);
  if (Status s = ApplyCacheOptions(vm); !s.ok()) return Fail(s);
  if (Status s = reader::ValidateLoaderOptions(opt); !s.ok()) return Fail(s);
  // Outputs are new files only, checked before any work (the plot's JSON is created then).
  for (const std::string& file : {plot, plot + ".json"}) {
    if (!plot.empty() && std::filesystem::exists(file)) {
      return Fail(Status::InvalidArgument(file,
                                          ": exists; shardfeed writes only new files here "
                                          "(remove it or choose another name)"));
    }
  }
  if (!sweep.empty()) return RunSweep(path, opt, sweep, args.epochs, args.step_ms, plot);
  if (!plot.empty()) return Fail(Status::InvalidArgument("--plot goes with --sweep"));
  return BenchEpochs(path, opt, args, vm.count("json") > 0);
}

}  // namespace shardfeed::cli
