// shardfeed stats: the command over validate/stats.h. Exit 0 clean, 1 when a --fail-on check
// fails (one line on stderr says what), 2 for usage and I/O errors.
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_internal.h"
#include "shardfeed/validate/extract.h"
#include "shardfeed/validate/inspect.h"
#include "shardfeed/validate/stats.h"

namespace po = boost::program_options;

namespace shardfeed::cli {
namespace {

int Error(const Status& s) {
  std::fprintf(stderr, "shardfeed: error: %s\n", s.ToString().c_str());
  return 2;
}

Status WriteText(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return Status::OK();
  }
  return validate::WriteNewFile(path, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

void PrintSummary(const validate::StatsReport& r) {
  std::printf("%s: %llu samples, %llu decoded\n", r.archive.c_str(),
              static_cast<unsigned long long>(r.samples),
              static_cast<unsigned long long>(r.decoded));
  std::printf("mean  %.4f %.4f %.4f  (0-255: %.2f %.2f %.2f)%s\n", r.mean[0], r.mean[1], r.mean[2],
              r.mean[0] * 255, r.mean[1] * 255, r.mean[2] * 255,
              r.size ? " after the centre crop" : "");
  std::printf("std   %.4f %.4f %.4f  (0-255: %.2f %.2f %.2f)\n", r.std[0], r.std[1], r.std[2],
              r.std[0] * 255, r.std[1] * 255, r.std[2] * 255);
  if (r.class_names.empty()) {
    std::printf("labels: none (the samples have no class field)\n");
  } else {
    if (std::isfinite(r.imbalance_ratio)) {
      std::printf("labels: %zu classes, imbalance ratio %.2f\n", r.class_names.size(),
                  r.imbalance_ratio);
    } else {  // the JSON's null
      std::printf("labels: %zu classes, imbalance ratio none (a class has no samples)\n",
                  r.class_names.size());
    }
  }
  std::printf(
      "sizes: width %.0f..%.0f, height %.0f..%.0f; %llu grayscale, %llu CMYK, %llu "
      "EXIF-rotated\n",
      r.width.min, r.width.max, r.height.min, r.height.max,
      static_cast<unsigned long long>(r.grayscale), static_cast<unsigned long long>(r.cmyk),
      static_cast<unsigned long long>(r.exif_rotated));
  std::printf("duplicates: %zu groups exact, %zu across labels, %zu near (within %d bits)\n",
              r.duplicates.size(), r.cross_label_duplicates.size(), r.near_duplicates.size(),
              r.options.near_threshold);
  std::printf(
      "flags: %zu uniform, %zu dark, %zu bright, %zu blurry, %zu extreme aspect, %zu "
      "tiny, %zu not decodable\n",
      r.uniform.size(), r.dark.size(), r.bright.size(), r.blurry.size(), r.extreme_aspect.size(),
      r.tiny.size(), r.errors.size());
  std::printf("leaks: %zu\n", r.leaks.size());
  // Version 4: one line per field besides image and label.
  const auto fields = nlohmann::json::parse(r.fields_json, nullptr, false);
  for (auto it = fields.begin(); fields.is_object() && it != fields.end(); ++it) {
    std::string line = validate::Printable(it.key()) + " (" + it.value().value("type", "") + ")";
    for (const char* k : {"rows", "values", "bytes"}) {
      const auto& v = it.value().contains(k) ? it.value()[k] : nlohmann::json();
      if (!v.is_object()) continue;
      char buf[160];
      if (v.contains("min")) {
        std::snprintf(buf, sizeof(buf), " %s %g..%g (mean %.3g)", k, v["min"].get<double>(),
                      v["max"].get<double>(), v["mean"].get<double>());
        line += buf;
      }
      if (v.contains("non_finite")) {
        line +=
            " (" + std::to_string(v["non_finite"].get<uint64_t>()) + " " + k + " NaN or infinite)";
      }
    }
    std::printf("field %s\n", line.c_str());
  }
}

}  // namespace

int CmdStats(int argc, char** argv) {
  po::options_description desc("stats options");
  std::string path, json_out, html_out, fail_on_text;
  std::vector<std::string> against;
  validate::StatsOptions o;
  desc.add_options()("archive", po::value(&path)->required(), "archive to describe")(
      "against", po::value(&against)->multitoken(),
      "other archives (val/test) to check for samples of this one: exact and near leaks")(
      "json", po::value(&json_out), "write the JSON report here ('-': stdout)")(
      "html", po::value(&html_out), "write a self-contained HTML page here")(
      "fail-on", po::value(&fail_on_text),
      "exit 1 when any of these is found: duplicates,leaks,cross-label,flags,imbalance=RATIO");
  // Every threshold through the one table (validate::StatsOptionTable), as Python's stats().
  const auto& table = validate::StatsOptionTable();
  std::vector<std::string> helps;
  AddOptionTable(desc, table, o, &helps);
  AddCacheOptions(desc, &helps);
  desc.add_options()("quiet,q", "no progress bar");
  po::positional_options_description pos;
  pos.add("archive", 1);
  po::variables_map vm;
  int rc = ParseArgs(argc, argv, desc, pos, vm,
                     "shardfeed stats ARCHIVE [--against OTHER ...] [--json FILE] [--html FILE] "
                     "[--fail-on duplicates,leaks,cross-label,flags,imbalance=RATIO] [--size N] "
                     "[-q]");
  if (rc >= 0) return rc;
  if (Status s = ApplyOptionTable(vm, table, &o); !s.ok()) return Error(s);
  if (Status s = ApplyCacheOptions(vm); !s.ok()) return Error(s);
  validate::FailOn fail_on;
  if (!fail_on_text.empty()) {
    auto f = validate::ParseFailOn(fail_on_text);
    if (!f.ok()) return Error(f.status());
    fail_on = *f;
  }
  if (Status s = validate::ValidateStatsOptions(o); !s.ok()) return Error(s);
  std::error_code ec;
  if (json_out == "-" && html_out == "-") {
    return Error(Status::InvalidArgument(
        "--json - and --html - both write to stdout: give one of them a file"));
  }
  if (!json_out.empty() && json_out != "-" && !html_out.empty() &&
      std::filesystem::weakly_canonical(json_out, ec) ==
          std::filesystem::weakly_canonical(html_out, ec)) {
    return Error(Status::InvalidArgument("--json and --html name the same file, ", json_out));
  }
  for (const std::string* out : {&json_out, &html_out}) {  // before the pass, not after it
    if (out->empty() || *out == "-") continue;
    if (Status s = validate::CheckNewFile(*out); !s.ok()) return Error(s);
  }
  auto archive = format::Archive::Open(path, format::IndexCheck::kFull);
  if (!archive.ok()) return Error(archive.status());
  std::vector<validate::OtherArchive> others;
  for (const std::string& a : against) {
    auto other = format::Archive::Open(a, format::IndexCheck::kFull);
    if (!other.ok()) return Error(other.status());
    others.push_back({a, *other});
  }
  const bool tty = !vm.count("quiet") && ::isatty(STDERR_FILENO);
  auto progress = [tty](uint64_t done, uint64_t total) {
    if (!tty) return;
    std::fprintf(stderr, "\r\033[Kstats %llu/%llu (%.1f%%)", static_cast<unsigned long long>(done),
                 static_cast<unsigned long long>(total), total ? 100.0 * done / total : 100.0);
    std::fflush(stderr);
  };
  auto report = validate::Stats(**archive, o, others, progress);
  if (tty) std::fprintf(stderr, "\n");
  if (!report.ok()) return Error(report.status());
  if (json_out != "-" && html_out != "-") PrintSummary(*report);  // stdout is the document
  if (!json_out.empty()) {
    if (Status s = WriteText(json_out, report->ToJson()); !s.ok()) return Error(s);
  }
  if (!html_out.empty()) {
    auto html = validate::StatsHtml(*report, **archive, others);
    if (!html.ok()) return Error(html.status());
    if (Status s = WriteText(html_out, *html); !s.ok()) return Error(s);
  }
  if (!report->save_error.empty()) {  // the report is written; the record was not
    return Error(Status::InvalidArgument(report->save_error));
  }
  const std::string failed = validate::FailureSummary(*report, fail_on);
  if (!failed.empty()) {
    std::fprintf(stderr, "shardfeed stats: FAILED: %s\n", failed.c_str());
    return 1;
  }
  return 0;
}

}  // namespace shardfeed::cli
