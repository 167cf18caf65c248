// shardfeed bench: reads epochs as training would and reports throughput and the wait profile.
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_internal.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/reader/loader.h"

namespace po = boost::program_options;

namespace shardfeed::cli {

int CmdBench(int argc, char** argv) {
  po::options_description desc("bench options");
  std::string path, crop, layout, mode, decode, dtype, mean, stdev;
  reader::LoaderOptions opt;
  int epochs = 1;
  double step_ms = 0;
  desc.add_options()("archive", po::value(&path)->required(), "archive to read")(
      "batch-size", po::value(&opt.batch_size)->default_value(64), "samples per batch")(
      "workers", po::value(&opt.workers)->default_value(0), "decode workers (0: all cores)")(
      "prefetch", po::value(&opt.prefetch)->default_value(4), "batches decoded ahead")(
      "crop", po::value(&crop)->default_value("center"),
      "center | random | none (whole images, undistorted: a fixed-shape archive's stored "
      "shape) | squash (whole images resized to --size x --size, aspect ratio not kept)")(
      "size", po::value(&opt.transform.size)->default_value(0),
      "output side (0: 224 for center, random and squash; the stored shape for none)")(
      "flip", po::bool_switch(&opt.transform.flip), "random horizontal flip")(
      "layout", po::value(&layout)->default_value("nhwc"), "nhwc | nchw")(
      "dtype", po::value(&dtype)->default_value("uint8"),
      "uint8 | float32 | float16 | bfloat16 (floats: (x / 255 - mean) / std)")(
      "mean", po::value(&mean)->default_value("0,0,0"),
      "per-channel mean R,G,B in 0..1 units (e.g. 0.485,0.456,0.406); float dtypes only")(
      "std", po::value(&stdev)->default_value("1,1,1"),
      "per-channel std R,G,B in 0..1 units (e.g. 0.229,0.224,0.225); float dtypes only")(
      "shuffle", po::value(&opt.shuffle)->default_value(true), "global shuffle each epoch")(
      "seed", po::value(&opt.seed)->default_value(0), "shuffle/augmentation seed")(
      "epochs", po::value(&epochs)->default_value(1), "epochs to read")(
      "mode", po::value(&mode)->default_value("threads"), "threads | processes")(
      "device", po::bool_switch(&opt.device), "copy batches to the CUDA device")(
      "decode", po::value(&decode)->default_value("scaled"),
      "JPEG decoding: scaled (DCT-scaled by 1/8, 2/8, 4/8 and cropped) | scaled-any (also 3/8, "
      "5/8, 6/8, 7/8: no SIMD, slower on libjpeg-turbo 2.x) | cropped (full scale, crop rows and "
      "columns only) | full (whole image, then crop)")(
      "step-ms", po::value(&step_ms)->default_value(0), "simulated training step per batch (ms)")(
      "shuffle-block", po::value(&opt.shuffle_block)->default_value(0),
      "locality-friendly shuffle: blocks of this many consecutive samples (0: global shuffle)")(
      "shuffle-window", po::value(&opt.shuffle_window)->default_value(8),
      "with --shuffle-block: samples are mixed within windows of this many blocks")(
      "skip-errors", po::bool_switch(&opt.skip_errors),
      "a sample that fails to decode becomes zeros with label -1 (counted), not an error")(
      "json", "print one JSON object");
  po::positional_options_description pos;
  pos.add("archive", 1);
  po::variables_map vm;
  int rc = ParseArgs(argc, argv, desc, pos, vm, "shardfeed bench ARCHIVE [options]");
  if (rc >= 0) return rc;
  {
    auto c = reader::ParseCrop(crop);
    if (!c.ok()) return Fail(c.status());
    opt.transform.crop = *c;
    auto l = reader::ParseLayout(layout);
    if (!l.ok()) return Fail(l.status());
    opt.transform.layout = *l;
    auto d = reader::ParseDType(dtype);
    if (!d.ok()) return Fail(d.status());
    opt.transform.dtype = *d;
    auto m = reader::ParseChannels("mean", mean);
    if (!m.ok()) return Fail(m.status());
    opt.transform.mean = *m;
    auto sd = reader::ParseChannels("std", stdev);
    if (!sd.ok()) return Fail(sd.status());
    opt.transform.std = *sd;
  }
  if (mode == "threads")
    opt.mode = reader::WorkerMode::kThreads;
  else if (mode == "processes")
    opt.mode = reader::WorkerMode::kProcesses;
  else
    return Fail(Status::InvalidArgument("--mode must be threads or processes"));
  if (decode == "scaled" || decode == "scaled-any") {
    opt.transform.scaled_decode = opt.transform.cropped_decode = true;
    opt.transform.any_scale = decode == "scaled-any";
  } else if (decode == "cropped") {
    opt.transform.scaled_decode = false;
    opt.transform.cropped_decode = true;
  } else if (decode == "full") {
    opt.transform.scaled_decode = opt.transform.cropped_decode = false;
  } else {
    return Fail(Status::InvalidArgument("--decode must be scaled, scaled-any, cropped or full"));
  }
  if (epochs < 1) return Fail(Status::InvalidArgument("--epochs must be at least 1"));

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
