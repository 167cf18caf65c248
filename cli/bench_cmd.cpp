// shardfeed bench: reads epochs as training would and reports throughput and the wait profile.
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "cli_internal.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/reader/loader.h"
#include "shardfeed/reader/options.h"

namespace po = boost::program_options;

namespace shardfeed::cli {

int CmdBench(int argc, char** argv) {
  // Every loader option comes from reader/options.h (the Python Loader takes the same ones);
  // bench adds its own four. It reads as training does: shuffled unless told otherwise.
  reader::LoaderOptions opt;
  opt.shuffle = true;
  po::options_description desc("bench options (the loader's, as shardfeed.Loader takes them)");
  std::string path;
  int epochs = 1;
  double step_ms = 0;
  std::vector<std::string> helps;  // kept alive: program_options stores the pointers
  helps.reserve(reader::LoaderOptionTable().size());
  desc.add_options()("archive", po::value(&path)->required(), "archive to read");
  for (const reader::LoaderOption& o : reader::LoaderOptionTable()) {
    const std::string flag = OptionFlag(o.name).substr(2);
    auto* value = po::value<std::string>()->default_value(o.get(opt));
    if (o.kind == reader::OptionKind::kBool) value->implicit_value("true");
    if (std::string(o.name) == "device") value->implicit_value("cuda");
    helps.push_back(std::string(o.help) +
                    (o.choices ? std::string(" [") + o.choices + "]" : std::string()));
    desc.add_options()(flag.c_str(), value, helps.back().c_str());
  }
  desc.add_options()("epochs", po::value(&epochs)->default_value(1), "epochs to read")(
      "step-ms", po::value(&step_ms)->default_value(0), "simulated training step per batch (ms)")(
      "json", "print one JSON object");
  po::positional_options_description pos;
  pos.add("archive", 1);
  po::variables_map vm;
  int rc = ParseArgs(argc, argv, desc, pos, vm, "shardfeed bench ARCHIVE [options]");
  if (rc >= 0) return rc;
  for (const reader::LoaderOption& o : reader::LoaderOptionTable()) {
    const std::string flag = OptionFlag(o.name).substr(2);
    if (vm.count(flag) && !vm[flag].defaulted()) {
      if (Status s = o.set(&opt, vm[flag].as<std::string>()); !s.ok()) return Fail(s);
    }
  }
  if (Status s = reader::ValidateLoaderOptions(opt); !s.ok()) return Fail(s);
  if (epochs < 1) return Fail(Status::InvalidArgument("--epochs must be at least 1"));
  const std::string crop = reader::FindLoaderOption("crop")->get(opt);
  const std::string layout = reader::FindLoaderOption("layout")->get(opt);
  const std::string mode = reader::FindLoaderOption("mode")->get(opt);

  auto archive = format::Archive::Open(path);
  if (!archive.ok()) return Fail(archive.status());
  auto loader = reader::Loader::Create(*archive, opt);
  if (!loader.ok()) return Fail(loader.status());
  reader::Loader& l = **loader;
  const bool json = vm.count("json") > 0;

  nlohmann::json epochs_json = nlohmann::json::array();
  double total_images = 0, total_seconds = 0, total_bytes = 0;
  reader::EpochStats last;
  for (int e = 0; e < epochs; ++e) {
    if (Status s = l.StartEpoch(static_cast<uint64_t>(e)); !s.ok()) return Fail(s);
    auto t0 = std::chrono::steady_clock::now();
    double bytes = 0;
    for (;;) {
      auto batch = l.Next();
      if (!batch.ok()) return Fail(batch.status());
      if (!*batch) break;
      bytes += static_cast<double>(batch->image_bytes());
      if (l.on_device()) {
        if (Status s = batch->Synchronize(); !s.ok()) return Fail(s);
      }
      if (step_ms > 0)
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(step_ms));
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    reader::EpochStats st = l.Stats();
    last = st;
    total_images += st.images;
    total_seconds += secs;
    total_bytes += bytes;
    epochs_json.push_back(
        {{"epoch", e},
         {"images", st.images},
         {"seconds", secs},
         {"images_per_second", st.images / secs},
         {"wait_fraction", st.wait_fraction()},
         {"skipped", st.skipped},
         {"active_workers", st.workers},
         {"tuning", st.tuning},
         {"wait_seconds", st.wait_seconds},
         {"consumer_seconds", st.consumer_seconds},
         {"stage_seconds",
          {{"read", st.read}, {"decode", st.decode}, {"collate", st.collate}, {"copy", st.copy}}}});
    if (!json) {
      std::printf(
          "epoch %d: %llu images in %.2f s = %.0f images/s, %.1f MB/s out; consumer waited %.0f%% "
          "of its time (%.2f s wait, %.2f s between batches); worker time: read %.2f s, decode "
          "%.2f s, collate %.2f s, copy %.2f s\n",
          e, static_cast<unsigned long long>(st.images), secs, st.images / secs, bytes / secs / 1e6,
          100 * st.wait_fraction(), st.wait_seconds, st.consumer_seconds, st.read, st.decode,
          st.collate, st.copy);
    }
  }
  const double ips = total_images / total_seconds;
  if (json) {
    nlohmann::json j = {{"archive", path},
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
                        {"mode", mode},
                        {"pinned", reader::PinKindName(l.pin_kind())},
                        {"device", l.on_device()},
                        {"epochs", epochs_json}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf(
        "read %.0f images in %.2f s: %.0f images/s (%s, batch %u, %d workers, %ux%u %s, %s "
        "%s, ring in %s memory%s)\n",
        total_images, total_seconds, ips, path.c_str(), opt.batch_size, l.options().workers,
        l.out_height(), l.out_width(),
        crop == "none" ? "whole images at their stored shape" : (crop + " crop").c_str(),
        reader::DTypeName(opt.transform.dtype), layout.c_str(), reader::PinKindName(l.pin_kind()),
        l.on_device() ? ", copied to GPU" : "");
  }
  return 0;
}

}  // namespace shardfeed::cli
