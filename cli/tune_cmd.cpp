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

// Runs `opt` for kWarmup + `batches` batches (epochs wrap) with a `step_ms` consumer and
// measures the batches after the warm-up.
Result<Measured> Run(const std::shared_ptr<const format::Archive>& archive,
                     const reader::LoaderOptions& opt, uint64_t batches, double step_ms) {
  SF_ASSIGN_OR_RETURN(auto loader, reader::Loader::Create(archive, opt));
  if (loader->batches_per_epoch() == 0) {
    return Status::InvalidArgument(archive->path(), ": no batch to measure (", archive->size(),
                                   " samples)");
  }
  Measured m;
  reader::EpochStats at;  // the stats when measuring began (or this epoch began)
  std::chrono::steady_clock::time_point t0;
  double cpu0 = 0;
  uint64_t epoch = 0, taken = 0;
  SF_RETURN_IF_ERROR(loader->StartEpoch(epoch));
  auto add = [&](const reader::EpochStats& now) {  // what this epoch did since `at`
    m.images += double(now.images - at.images);
    m.wait += now.wait_seconds - at.wait_seconds;
    m.consumer += now.consumer_seconds - at.consumer_seconds;
    m.read += now.read - at.read;
    m.decode += now.decode - at.decode;
    m.collate += now.collate - at.collate;
    m.ring_full += now.ring_full_seconds - at.ring_full_seconds;
  };
  while (taken < kWarmup + batches) {
    SF_ASSIGN_OR_RETURN(reader::Batch b, loader->Next());
    if (!b) {  // the epoch ended: go on with the next (stats restart with it)
      if (taken > kWarmup) add(loader->Stats());
      SF_RETURN_IF_ERROR(loader->StartEpoch(++epoch));
      at = reader::EpochStats();
      continue;
    }
    b.Release();
    if (++taken == kWarmup) {
      at = loader->Stats();
      t0 = std::chrono::steady_clock::now();
      cpu0 = CpuSeconds();
    }
    if (step_ms > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(step_ms));
  }
  add(loader->Stats());
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.cpu = CpuSeconds() - cpu0;
  return m;
}

// The consumer's wait fraction when data arrives at `rate` images/s and a step takes `step_s`.
double ModelWait(double batch, double rate, double step_s) {
  const double produce = rate > 0 ? batch / rate : 1e9;
  const double wait = std::max(0.0, produce - step_s);
  return wait + step_s > 0 ? wait / (wait + step_s) : 1.0;
}

}  // namespace

int CmdTune(int argc, char** argv) {
  reader::LoaderOptions opt;
  opt.shuffle = true;  // read as training does
  po::options_description desc("tune options (and the loader's, as shardfeed.Loader takes them)");
  std::string path;
  double step_ms = -1;
  uint64_t batches = 40;
  std::vector<std::string> helps;
  desc.add_options()("archive", po::value(&path)->required(), "archive to measure")(
      "step-ms", po::value(&step_ms)->required(),
      "the consumer's time per batch (ms): a training step; 0 asks for the ceiling")(
      "batches", po::value(&batches)->default_value(40),
      "batches measured per run (after 4 warm-up batches)")("json", "print one JSON object");
  AddLoaderOptions(desc, opt, &helps);
  po::positional_options_description pos;
  pos.add("archive", 1);
  po::variables_map vm;
  int rc = ParseArgs(argc, argv, desc, pos, vm,
                     "shardfeed tune ARCHIVE --step-ms T [--batch-size N ...] [--json]");
  if (rc >= 0) return rc;
  for (const char* chosen : {"workers", "prefetch"}) {
    if (vm.count(chosen) && !vm[chosen].defaulted()) {
      return Fail(Status::InvalidArgument("tune chooses --", chosen,
                                          " itself; --max-workers sets its CPU budget"));
    }
  }
  if (Status s = ApplyOptionTable(vm, reader::LoaderOptionTable(), &opt); !s.ok()) return Fail(s);
  if (!(step_ms >= 0) || !std::isfinite(step_ms) || step_ms > 600000) {
    return Fail(Status::InvalidArgument("--step-ms must be a number of milliseconds >= 0"));
  }
  if (batches < 1 || batches > 100000) {
    return Fail(Status::InvalidArgument("--batches must be between 1 and 100000"));
  }
  if (Status s = reader::ValidateLoaderOptions(opt); !s.ok()) return Fail(s);
  const bool json = vm.count("json") > 0;
  auto archive = format::Archive::Open(path);
  if (!archive.ok()) return Fail(archive.status());
  const int cpus = opt.max_workers > 0 ? int(opt.max_workers) : AvailableCpus();
  const double batch = opt.batch_size, step_s = step_ms / 1000;
  auto say = [&](const char* what) {
    if (!json) std::fprintf(stderr, "tune: %s...\n", what);
  };

  // 1. One worker, an empty step.
  say("measuring the stages with one worker");
  reader::LoaderOptions one = opt;
  one.workers = 1;
  one.prefetch = 4;
  auto stages = Run(*archive, one, batches, 0);
  if (!stages.ok()) return Fail(stages.status());
  const double per_image = (stages->read + stages->decode + stages->collate) / stages->images;
  const double one_rate = stages->images_per_second();

  // 2. The ceiling: every CPU, an empty step.
  say("measuring the ceiling with every CPU");
  reader::LoaderOptions all = opt;
  all.workers = cpus;
  all.prefetch = 4;
  auto ceiling = Run(*archive, all, batches, 0);
  if (!ceiling.ok()) return Fail(ceiling.status());
  const double ceiling_rate = ceiling->images_per_second();

  // 3. The model's choice.
  const double demand = step_s > 0 ? batch / step_s : INFINITY;
  const bool data_bound = demand > ceiling_rate / 1.1;
  int workers = data_bound ? cpus : std::clamp(int(std::ceil(1.1 * demand / one_rate)), 1, cpus);
  uint32_t prefetch = 2;

  // 4. Check it with the step, adding what the waiting shows is short.
  Measured check;
  int rounds = 0;
  for (;;) {
    ++rounds;
    say(("checking " + std::to_string(workers) + " workers, prefetch " + std::to_string(prefetch) +
         " with the step")
            .c_str());
    reader::LoaderOptions o = opt;
    o.workers = workers;
    o.prefetch = prefetch;
    auto r = Run(*archive, o, batches, step_ms);
    if (!r.ok()) return Fail(r.status());
    check = *r;
    if (check.wait_fraction() <= opt.wait_target || rounds >= 8) break;
    // Workers idle on a full ring a tenth of their time: depth is short, not CPU.
    const bool ring_bound = check.ring_full > 0.1 * check.seconds * workers;
    if (ring_bound && prefetch < 8) {
      ++prefetch;
    } else if (workers < cpus) {
      ++workers;
    } else if (prefetch < 8 && check.ring_full > 0) {
      ++prefetch;
    } else {
      break;  // data-bound: nothing left to add
    }
  }
  const bool within = check.wait_fraction() <= opt.wait_target;

  if (json) {
    nlohmann::json j = {
        {"archive", path},
        {"batch_size", opt.batch_size},
        {"step_ms", step_ms},
        {"cpus", cpus},
        {"wait_target", opt.wait_target},
        {"stage_ms_per_image",
         {{"read", 1000 * stages->read / stages->images},
          {"decode", 1000 * stages->decode / stages->images},
          {"collate", 1000 * stages->collate / stages->images},
          {"total", 1000 * per_image}}},
        {"one_worker_images_per_second", one_rate},
        {"ceiling",
         {{"workers", cpus},
          {"images_per_second", ceiling_rate},
          {"cpu_seconds_per_1000_images", 1000 * ceiling->cpu / ceiling->images}}},
        {"demand_images_per_second", step_s > 0 ? nlohmann::json(demand) : nlohmann::json()},
        {"data_bound", data_bound},
        {"model_wait_fraction",
         ModelWait(batch, std::min(ceiling_rate, workers * one_rate), step_s)},
        {"recommended", {{"workers", workers}, {"prefetch", prefetch}}},
        {"expected",
         {{"images_per_second", check.images_per_second()},
          {"wait_fraction", check.wait_fraction()},
          {"cpu_seconds_per_1000_images", 1000 * check.cpu / check.images},
          {"within_target", within},
          {"batches_measured", batches},
          {"checks", rounds}}}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s: batch %u, %d CPUs for workers\n", path.c_str(), opt.batch_size, cpus);
  std::printf(
      "stages per image (1 worker): read %.3f ms, decode %.3f ms, collate %.3f ms; one worker "
      "delivers %.0f images/s\n",
      1000 * stages->read / stages->images, 1000 * stages->decode / stages->images,
      1000 * stages->collate / stages->images, one_rate);
  std::printf("ceiling (%d workers, empty step): %.0f images/s, %.2f CPU-s per 1000 images\n", cpus,
              ceiling_rate, 1000 * ceiling->cpu / ceiling->images);
  if (step_s > 0) {
    std::printf("a %.1f ms step asks for %.0f images/s: %s\n", step_ms, demand,
                data_bound ? "more than this machine delivers (data-bound)"
                           : "within this machine's ceiling");
  }
  std::printf("recommended: --workers %d --prefetch %u\n", workers, prefetch);
  std::printf(
      "expected (measured over %llu batches with the step): %.0f images/s, the consumer waits "
      "%.1f%% of its time (target %.1f%%%s), %.2f CPU-s per 1000 images\n",
      static_cast<unsigned long long>(batches), check.images_per_second(),
      100 * check.wait_fraction(), 100 * opt.wait_target,
      within ? ", met" : ": not reachable on this machine with these options",
      1000 * check.cpu / check.images);
  return 0;
}

}  // namespace shardfeed::cli
