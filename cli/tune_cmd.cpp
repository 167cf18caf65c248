// shardfeed tune ARCHIVE --step-ms T: the loader settings this machine needs to keep a consumer
// that takes T ms per batch fed, measured rather than guessed.
//
// 1. Stage costs: one worker, an empty step: read, decode and collate time per image, and the
//    images/s one worker reaches.
// 2. Ceiling: every CPU the process may use (max_workers), an empty step: the most this machine
//    delivers with these options, and its CPU per image.
// 3. Model: the consumer asks batch/T images/s; the fewest workers whose measured rate covers
//    that with a 10% margin (all of them when even the ceiling does not: data-bound).
// 4. Check: that setting runs with the simulated step; while the consumer waits more than
//    wait_target, a worker is added (or, when the workers stood idle on a full ring, a slot),
//    until it is within the target or nothing is left to add. The figures printed are the
//    measured ones of the last check, not the model's.
//
// Every run is bounded by --batches (plus 4 warm-up batches) and the loader's timeout.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_internal.h"
#include "shardfeed/base/cpus.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/reader/loader.h"
#include "shardfeed/reader/options.h"

namespace po = boost::program_options;

namespace shardfeed::cli {
namespace {

constexpr uint64_t kWarmup = 4;

struct Measured {
  double images = 0, seconds = 0, wait = 0, consumer = 0, cpu = 0;
  double read = 0, decode = 0, collate = 0, ring_full = 0;
  double images_per_second() const { return seconds > 0 ? images / seconds : 0; }
  double wait_fraction() const { return wait + consumer > 0 ? wait / (wait + consumer) : 0; }
};

// Runs `opt` for kWarmup + `batches` batches (epochs wrap) with a `step_ms` consumer (Consume,
// the one bench runs) and measures the batches after the warm-up.
Result<Measured> Run(const std::shared_ptr<const format::Archive>& archive,
                     const reader::LoaderOptions& opt, uint64_t batches, double step_ms) {
  SF_ASSIGN_OR_RETURN(auto loader, reader::Loader::Create(archive, opt));
  if (loader->batches_per_epoch() == 0) {
    return Status::InvalidArgument(archive->path(), ": no batch to measure (", archive->size(),
                                   " samples)");
  }
  Measured m;
  uint64_t epoch = 0;
  SF_RETURN_IF_ERROR(loader->StartEpoch(epoch));
  for (uint64_t warm = 0; warm < kWarmup;) {  // the warm-up: no step, not measured
    SF_ASSIGN_OR_RETURN(Consumed c, Consume(*loader, kWarmup - warm, 0));
    warm += c.batches;
    if (c.epoch_ended) SF_RETURN_IF_ERROR(loader->StartEpoch(++epoch));
  }
  reader::EpochStats at = loader->Stats();  // the stats when measuring began in this epoch
  for (uint64_t taken = 0; taken < batches;) {
    SF_ASSIGN_OR_RETURN(Consumed c, Consume(*loader, batches - taken, step_ms));
    taken += c.batches;
    m.seconds += c.seconds, m.cpu += c.cpu_seconds;
    const reader::EpochStats now = loader->Stats();  // what this epoch did since `at`
    m.images += double(now.images - at.images);
    m.wait += now.wait_seconds - at.wait_seconds;
    m.consumer += now.consumer_seconds - at.consumer_seconds;
    m.read += now.read - at.read;
    m.decode += now.decode - at.decode;
    m.collate += now.collate - at.collate;
    m.ring_full += now.ring_full_seconds - at.ring_full_seconds;
    at = now;
    if (c.epoch_ended) {  // go on with the next epoch (its stats start from zero)
      SF_RETURN_IF_ERROR(loader->StartEpoch(++epoch));
      at = reader::EpochStats();
    }
  }
  return m;
}

// The consumer's wait fraction when data arrives at `rate` images/s and a step takes `step_s`.
double ModelWait(double batch, double rate, double step_s) {
  const double produce = rate > 0 ? batch / rate : 1e9;
  const double wait = std::max(0.0, produce - step_s);
  return wait + step_s > 0 ? wait / (wait + step_s) : 1.0;
}

// tune's own flags (the loader's come from reader/options.h). step_ms < 0: not given.
struct TuneArgs {
  double step_ms = -1;
  uint64_t batches = 40;
};

const OptionTable<TuneArgs>& TuneArgTable() {
  static const NumberRange kStep{0, 600000};
  static const OptionTable<TuneArgs> table(
      "tune option",
      {{"step_ms", OptionKind::kNumber, nullptr,
        "the consumer's time per batch (ms): a training step; 0 asks for the ceiling (required)",
        [](TuneArgs* a, std::string_view t) {
          return ParseNumberOption("step_ms", t, kStep, &a->step_ms);
        },
        [](const TuneArgs& a) { return a.step_ms < 0 ? std::string() : NumberText(a.step_ms); },
        NumberRangeText(kStep)},
       CountOption<TuneArgs>("batches", 1, 100000,
                             "batches measured per run (after 4 warm-up batches)",
                             &TuneArgs::batches)});
  return table;
}

// What the four steps found (see the top of this file).
struct Tuned {
  int cpus = 0, workers = 0, rounds = 0;
  uint32_t prefetch = 2;
  double demand = 0, one_rate = 0, ceiling_rate = 0, per_image = 0;
  bool data_bound = false, within = false;
  Measured stages, ceiling, check;
};

Result<Tuned> Tune(const std::shared_ptr<const format::Archive>& archive,
                   const reader::LoaderOptions& opt, const TuneArgs& args, bool quiet) {
  Tuned t;
  t.cpus = opt.max_workers > 0 ? int(opt.max_workers) : AvailableCpus();
  const double batch = opt.batch_size, step_s = args.step_ms / 1000;
  auto say = [&](const std::string& what) {
    if (!quiet) std::fprintf(stderr, "tune: %s...\n", what.c_str());
  };
  say("measuring the stages with one worker");  // 1. one worker, an empty step
  reader::LoaderOptions one = opt;
  one.workers = 1, one.prefetch = 4;
  SF_ASSIGN_OR_RETURN(t.stages, Run(archive, one, args.batches, 0));
  t.per_image = (t.stages.read + t.stages.decode + t.stages.collate) / t.stages.images;
  t.one_rate = t.stages.images_per_second();
  say("measuring the ceiling with every CPU");  // 2. the ceiling: every CPU, an empty step
  reader::LoaderOptions all = opt;
  all.workers = t.cpus, all.prefetch = 4;
  SF_ASSIGN_OR_RETURN(t.ceiling, Run(archive, all, args.batches, 0));
  t.ceiling_rate = t.ceiling.images_per_second();
  // 3. The model's choice.
  t.demand = step_s > 0 ? batch / step_s : INFINITY;
  t.data_bound = t.demand > t.ceiling_rate / 1.1;
  t.workers =
      t.data_bound ? t.cpus : std::clamp(int(std::ceil(1.1 * t.demand / t.one_rate)), 1, t.cpus);
  // 4. Check it with the step, adding what the waiting shows is short.
  for (;;) {
    ++t.rounds;
    say("checking " + std::to_string(t.workers) + " workers, prefetch " +
        std::to_string(t.prefetch) + " with the step");
    reader::LoaderOptions o = opt;
    o.workers = t.workers, o.prefetch = t.prefetch;
    SF_ASSIGN_OR_RETURN(t.check, Run(archive, o, args.batches, args.step_ms));
    if (t.check.wait_fraction() <= opt.wait_target || t.rounds >= 8) break;
    // Workers idle on a full ring a tenth of their time: depth is short, not CPU.
    const bool ring_bound = t.check.ring_full > 0.1 * t.check.seconds * t.workers;
    if (ring_bound && t.prefetch < 8) {
      ++t.prefetch;
    } else if (t.workers < t.cpus) {
      ++t.workers;
    } else if (t.prefetch < 8 && t.check.ring_full > 0) {
      ++t.prefetch;
    } else {
      break;  // data-bound: nothing left to add
    }
  }
  t.within = t.check.wait_fraction() <= opt.wait_target;
  return t;
}

nlohmann::json TuneJson(const std::string& path, const reader::LoaderOptions& opt,
                        const TuneArgs& args, const Tuned& t) {
  const double step_s = args.step_ms / 1000;
  const Measured& s = t.stages;
  nlohmann::json options = nlohmann::json::object();
  for (const auto& [name, value] : LoaderOptionValues(opt)) options[name] = value;
  return {{"archive", path},
          {"batch_size", opt.batch_size},
          {"step_ms", args.step_ms},
          {"cpus", t.cpus},
          {"wait_target", opt.wait_target},
          {"options", options},
          {"stage_ms_per_image",
           {{"read", 1000 * s.read / s.images},
            {"decode", 1000 * s.decode / s.images},
            {"collate", 1000 * s.collate / s.images},
            {"total", 1000 * t.per_image}}},
          {"one_worker_images_per_second", t.one_rate},
          {"ceiling",
           {{"workers", t.cpus},
            {"images_per_second", t.ceiling_rate},
            {"cpu_seconds_per_1000_images", 1000 * t.ceiling.cpu / t.ceiling.images}}},
          {"demand_images_per_second", step_s > 0 ? nlohmann::json(t.demand) : nlohmann::json()},
          {"data_bound", t.data_bound},
          {"model_wait_fraction",
           ModelWait(opt.batch_size, std::min(t.ceiling_rate, t.workers * t.one_rate), step_s)},
          {"recommended", {{"workers", t.workers}, {"prefetch", t.prefetch}}},
          {"expected",
           {{"images_per_second", t.check.images_per_second()},
            {"wait_fraction", t.check.wait_fraction()},
            {"cpu_seconds_per_1000_images", 1000 * t.check.cpu / t.check.images},
            {"within_target", t.within},
            {"batches_measured", args.batches},
            {"checks", t.rounds}}}};
}

void PrintTune(const std::string& path, const reader::LoaderOptions& opt, const TuneArgs& args,
               const Tuned& t) {
  const Measured& s = t.stages;
  std::printf("%s: batch %u, %d CPUs for workers\n", path.c_str(), opt.batch_size, t.cpus);
  std::printf(
      "stages per image (1 worker): read %.3f ms, decode %.3f ms, collate %.3f ms; one worker "
      "delivers %.0f images/s\n",
      1000 * s.read / s.images, 1000 * s.decode / s.images, 1000 * s.collate / s.images,
      t.one_rate);
  std::printf("ceiling (%d workers, empty step): %.0f images/s, %.2f CPU-s per 1000 images\n",
              t.cpus, t.ceiling_rate, 1000 * t.ceiling.cpu / t.ceiling.images);
  if (args.step_ms > 0) {
    std::printf("a %.1f ms step asks for %.0f images/s: %s\n", args.step_ms, t.demand,
                t.data_bound ? "more than this machine delivers (data-bound)"
                             : "within this machine's ceiling");
  }
  std::printf("recommended: --workers %d --prefetch %u\n", t.workers, t.prefetch);
  std::printf(
      "expected (measured over %llu batches with the step): %.0f images/s, the consumer waits "
      "%.1f%% of its time (target %.1f%%%s), %.2f CPU-s per 1000 images\n",
      static_cast<unsigned long long>(args.batches), t.check.images_per_second(),
      100 * t.check.wait_fraction(), 100 * opt.wait_target,
      t.within ? ", met" : ": not reachable on this machine with these options",
      1000 * t.check.cpu / t.check.images);
}

}  // namespace

int CmdTune(int argc, char** argv) {
  reader::LoaderOptions opt;
  opt.shuffle = true;  // read as training does
  TuneArgs args;
  po::options_description desc(
      "tune options (and the loader's, as shardfeed.Loader takes them, but --workers and "
      "--prefetch, which tune chooses)");
  std::string path;
  std::vector<std::string> helps;
  desc.add_options()("archive", po::value(&path)->required(), "archive to measure");
  AddOptionTable(desc, TuneArgTable(), args, &helps);
  desc.add_options()("json", "print one JSON object")("quiet,q", "no progress lines");
  AddLoaderOptions(desc, opt, &helps, {"workers", "prefetch"});
  AddCacheOptions(desc, &helps);
  po::positional_options_description pos;
  pos.add("archive", 1);
  // The two options tune chooses: said so, not "did you mean --max-workers".
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    for (const char* chosen : {"--workers", "--prefetch"}) {
      if (a == chosen || a.rfind(std::string(chosen) + "=", 0) == 0) {
        return Fail(Status::InvalidArgument(
            chosen, " is what tune chooses (it measures the settings and prints them); --max-",
            chosen + 2, " caps what it tries"));
      }
    }
  }
  po::variables_map vm;
  int rc = ParseArgs(argc, argv, desc, pos, vm,
                     "shardfeed tune ARCHIVE --step-ms T [--batch-size N ...] [--json]");
  if (rc >= 0) return rc;
  if (Status s = ApplyOptionTable(vm, TuneArgTable(), &args); !s.ok()) return Fail(s);
  if (Status s = ApplyOptionTable(vm, reader::LoaderOptionTable(), &opt); !s.ok()) return Fail(s);
  if (Status s = ApplyCacheOptions(vm); !s.ok()) return Fail(s);
  if (args.step_ms < 0) {
    return Fail(Status::InvalidArgument(
        "--step-ms is required: the consumer's time per batch in ms (0 asks for the ceiling)"));
  }
  if (Status s = reader::ValidateLoaderOptions(opt); !s.ok()) return Fail(s);
  const bool json = vm.count("json") > 0;
  auto archive = format::Archive::Open(path);
  if (!archive.ok()) return Fail(archive.status());
  auto tuned = Tune(*archive, opt, args, json || vm.count("quiet"));
  if (!tuned.ok()) return Fail(tuned.status());
  if (json) {
    std::printf("%s\n", TuneJson(path, opt, args, *tuned).dump(2).c_str());
  } else {
    PrintTune(path, opt, args, *tuned);
  }
  return 0;
}

}  // namespace shardfeed::cli
