// The shardfeed command line: a thin layer over the public headers. Exit codes:
//   0 success; 1 the work found bad data (verify failures, --strict skips);
//   2 wrong arguments; 3 any other error (I/O, corrupt archive).
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_internal.h"
#include "shardfeed/converter/archive_tools.h"
#include "shardfeed/converter/pack.h"
#include "shardfeed/format/archive.h"

namespace po = boost::program_options;
using namespace shardfeed;

namespace shardfeed::cli {

int ExitCodeFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return 0;
    case StatusCode::kInvalidArgument:
      return 2;
    default:
      return 3;
  }
}

int Fail(const Status& s) {
  std::fprintf(stderr, "shardfeed: error: %s\n", s.ToString().c_str());
  return ExitCodeFor(s);
}

bool ParseBytes(const std::string& text, uint64_t* out) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || v < 0) return false;
  std::string unit(end);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB")
    mult = 1024;
  else if (unit == "M" || unit == "MB" || unit == "MIB")
    mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB" || unit == "TIB")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    return false;
  *out = static_cast<uint64_t>(v * mult);
  return true;
}

int ParseArgs(int argc, char** argv, po::options_description& desc,
              po::positional_options_description& pos, po::variables_map& vm, const char* usage) {
  desc.add_options()("help,h", "show this help");
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).positional(pos).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: " << usage << "\n\n" << desc << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "shardfeed: error: %s\nusage: %s\n", e.what(), usage);
    return 2;
  }
  return -1;
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int s = static_cast<int>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

}  // namespace shardfeed::cli

namespace {

using cli::Fail;
using cli::ParseArgs;

void PrintUsage() {
  std::printf(
      "usage: shardfeed <command> [options]\n\n"
      "commands:\n"
      "  pack SRC OUT        pack an image folder (or --list FILE) into an archive\n"
      "  verify ARCHIVE      check every record checksum and shard hash (--decode: decode too)\n"
      "  inspect ARCHIVE     samples, classes, encoding, shapes, sizes\n"
      "  extract ARCHIVE DIR write the samples back as an image folder\n"
      "  bench ARCHIVE       read epochs as training would and report images/s\n"
      "  convert ARCHIVE OUT rewrite an archive into the other backend (LMDB <-> HDF5)\n"
      "  merge PARTS OUT     join the parts of a split pack (pack --part I/N) into one archive\n\n"
      "Run 'shardfeed <command> --help' for a command's options.\n");
}

int CmdPack(int argc, char** argv) {
  po::options_description desc("pack options");
  std::string src, out, list, encoding, crop, report, shard_size, chunk_size, validate, backend;
  std::string part_spec, parts_dir;
  converter::PackOptions opt;
  uint64_t max_pixels = opt.limits.max_pixels;
  desc.add_options()("src", po::value(&src)->required(),
                     "image folder (ROOT/<class>/<image>), or the root of --list paths")(
      "out", po::value(&out)->required(), "archive to write (a directory)")(
      "list", po::value(&list), "list file: 'path label' or MXNet 'index\\tlabel\\tpath' per line")(
      "encoding", po::value(&encoding)->default_value("jpeg"), "jpeg | raw | zstd")(
      "backend", po::value(&backend)->default_value("lmdb"), "container: lmdb | hdf5")(
      "size", po::value(&opt.size)->default_value(0),
      "raw/zstd: resize so the short side is this. jpeg: a resolution cap: images whose short "
      "side (long side with --max-side) exceeds it are resized and re-encoded at --quality "
      "(upright); the others keep their bytes (0: no cap)")(
      "max-side", po::bool_switch(&opt.max_side), "jpeg with --size: cap the long side")(
      "crop", po::value(&crop)->default_value("none"), "raw/zstd with --size: none | center")(
      "quality", po::value(&opt.quality)->default_value(90),
      "JPEG quality of re-encoded images (non-JPEG inputs, --size caps)")(
      "level", po::value(&opt.level)->default_value(1), "zstd level (1..22)")(
      "workers", po::value(&opt.workers)->default_value(0), "worker threads (0: all cores)")(
      "shuffle", po::bool_switch(&opt.shuffle), "store samples in a shuffled order")(
      "seed", po::value(&opt.seed)->default_value(0), "seed for --shuffle")(
      "validate", po::value(&validate)->default_value("header"),
      "JPEG passthrough checks: none | header (markers + end marker) | full (decode)")(
      "max-pixels", po::value(&max_pixels)->default_value(max_pixels), "refuse larger images")(
      "shard-size", po::value(&shard_size), "start a new shard after this many bytes (e.g. 1G)")(
      "chunk-size", po::value(&chunk_size)->default_value("1M"),
      "records are grouped in chunks of this size")("report", po::value(&report),
                                                    "write a JSON report of skipped files here")(
      "strict", po::bool_switch(&opt.strict), "fail (and write no archive) if any file is skipped")(
      "overwrite", po::bool_switch(&opt.writer.overwrite), "replace an existing archive at OUT")(
      "part", po::value(&part_spec),
      "I/N: pack only part I (0-based) of N of the source list, into PARTS-DIR/part-I-of-N; "
      "join the parts with 'shardfeed merge'")("parts-dir", po::value(&parts_dir),
                                               "where --part writes (default OUT.parts)")(
      "quiet,q", "no progress line");
  po::positional_options_description pos;
  pos.add("src", 1).add("out", 1);
  po::variables_map vm;
  int rc = ParseArgs(argc, argv, desc, pos, vm, "shardfeed pack SRC OUT [options]");
  if (rc >= 0) return rc;

  if (!format::ParseEncoding(encoding, &opt.encoding)) {
    return Fail(
        Status::InvalidArgument("--encoding must be jpeg, raw or zstd, not '", encoding, "'"));
  }
  if (!format::ParseBackend(backend, &opt.writer.backend)) {
    return Fail(Status::InvalidArgument("--backend must be lmdb or hdf5, not '", backend, "'"));
  }
  if (crop != "none" && crop != "center") {
    return Fail(Status::InvalidArgument("--crop must be none or center, not '", crop, "'"));
  }
  opt.center_crop = crop == "center";
  if (validate == "none")
    opt.validation = converter::Validation::kNone;
  else if (validate == "header")
    opt.validation = converter::Validation::kHeader;
  else if (validate == "full")
    opt.validation = converter::Validation::kFull;
  else
    return Fail(Status::InvalidArgument("--validate must be none, header or full"));
  opt.limits.max_pixels = max_pixels;
  if (vm.count("shard-size") && !cli::ParseBytes(shard_size, &opt.writer.shard_bytes)) {
    return Fail(Status::InvalidArgument("--shard-size: cannot read '", shard_size, "'"));
  }
  if (!cli::ParseBytes(chunk_size, &opt.writer.chunk_bytes) || opt.writer.chunk_bytes == 0) {
    return Fail(Status::InvalidArgument("--chunk-size: cannot read '", chunk_size, "'"));
  }
  nlohmann::json options = {{"encoding", encoding},
                            {"size", opt.size},
                            {"max_side", opt.max_side},
                            {"crop", crop},
                            {"quality", opt.quality},
                            {"level", opt.level},
                            {"shuffle", opt.shuffle},
                            {"seed", opt.seed},
                            {"validate", validate},
                            {"max_pixels", max_pixels},
                            {"chunk_bytes", opt.writer.chunk_bytes},
                            {"shard_bytes", opt.writer.shard_bytes},
                            {"source", list.empty() ? "folder" : "list"}};
  opt.options_json = options.dump();
  const std::string archive_out = out;  // the final archive (what the scan must never pack)
  if (!part_spec.empty()) {
    unsigned i = 0, n = 0;
    char tail = 0;
    if (std::sscanf(part_spec.c_str(), "%u/%u%c", &i, &n, &tail) != 2 || n == 0 || i >= n) {
      return Fail(
          Status::InvalidArgument("--part must be I/N with 0 <= I < N, not '", part_spec, "'"));
    }
    opt.part = i;
    opt.parts = n;
    opt.part_record = true;
    out = parts_dir.empty()
              ? converter::DefaultPartPath(out, i, n)
              : (std::filesystem::path(parts_dir) /
                 std::filesystem::path(converter::DefaultPartPath("x", i, n)).filename())
                    .string();
  } else if (!parts_dir.empty()) {
    return Fail(Status::InvalidArgument("--parts-dir goes with --part"));
  }
#ifdef SHARDFEED_WITH_MPI
  if (part_spec.empty() && cli::MpiWorldSize() > 1) {
    return cli::MpiPack(src, list, archive_out, opt, report);
  }
#endif

  Result<converter::SourceList> source =
      list.empty() ? converter::ScanImageFolder(src, converter::OutputPaths(archive_out))
                   : converter::ReadListFile(list, src);
  if (!source.ok()) return Fail(source.status());

  const bool tty = !vm.count("quiet") && ::isatty(STDERR_FILENO);
  auto progress = [&](const converter::PackStats& s) {
    if (!tty) return;
    double rate = s.seconds > 0 ? s.done / s.seconds : 0;
    double mbs = s.seconds > 0 ? s.source_bytes / s.seconds / 1e6 : 0;
    double eta = rate > 0 ? (s.total - s.done) / rate : NAN;
    std::fprintf(stderr, "\r\033[Kpacking %llu/%llu (%.1f%%)  %.0f files/s  %.1f MB/s  ETA %s",
                 static_cast<unsigned long long>(s.done), static_cast<unsigned long long>(s.total),
                 s.total ? 100.0 * s.done / s.total : 100.0, rate, mbs,
                 cli::FormatDuration(eta).c_str());
    std::fflush(stderr);
  };
  converter::PackResult result;
  Status st = converter::Pack(*source, out, opt, &result, progress);
  if (tty) std::fprintf(stderr, "\n");
  if (!report.empty()) {
    std::ofstream r(report);
    r << converter::PackReportJson(result, src);
    if (!r) std::fprintf(stderr, "shardfeed: warning: cannot write report %s\n", report.c_str());
  }
  for (size_t i = 0; i < result.skipped.size() && i < 20; ++i) {
    std::fprintf(stderr, "skipped %s: %s\n", result.skipped[i].path.c_str(),
                 result.skipped[i].reason.c_str());
  }
  if (result.skipped.size() > 20) {
    std::fprintf(stderr, "... and %zu more skipped (see --report)\n", result.skipped.size() - 20);
  }
  if (!st.ok()) {
    // Skipped files are bad data (exit 1): a --strict skip, or every file skipped.
    if (!result.skipped.empty() && (opt.strict || result.stats.packed == 0)) {
      std::fprintf(stderr, "shardfeed: error: %s\n", st.message().c_str());
      return 1;
    }
    return Fail(st);
  }
  const auto& s = result.stats;
  std::printf("packed %llu of %llu files into %s (%s, %s): %llu skipped, %zu ignored\n",
              static_cast<unsigned long long>(s.packed), static_cast<unsigned long long>(s.total),
              out.c_str(), encoding.c_str(), backend.c_str(),
              static_cast<unsigned long long>(result.skipped.size()), result.ignored.size());
  if (opt.encoding == format::Encoding::kJpeg && opt.size > 0) {
    std::printf(
        "%llu resized to a %s side of %u and re-encoded at quality %d; the rest keep "
        "their bytes\n",
        static_cast<unsigned long long>(s.resized), opt.max_side ? "long" : "short", opt.size,
        opt.quality);
  }
  std::printf("%.2f s, %.0f files/s, %.1f MB/s read, %.1f MB written\n", s.seconds,
              s.seconds > 0 ? s.done / s.seconds : 0.0,
              s.seconds > 0 ? s.source_bytes / s.seconds / 1e6 : 0.0, s.payload_bytes / 1e6);
  return 0;
}

int CmdVerify(int argc, char** argv) {
  po::options_description desc("verify options");
  std::string path;
  converter::VerifyOptions opt;
  desc.add_options()("archive", po::value(&path)->required(), "archive to check")(
      "decode", po::bool_switch(&opt.decode), "also decode every record")(
      "workers", po::value(&opt.workers)->default_value(0), "threads (0: all cores)")(
      "max-pixels", po::value(&opt.max_pixels)->default_value(opt.max_pixels),
      "with --decode: refuse records declaring more pixels than this")("json",
                                                                       "print one JSON object");
  po::positional_options_description pos;
  pos.add("archive", 1);
  po::variables_map vm;
  int rc = ParseArgs(argc, argv, desc, pos, vm, "shardfeed verify ARCHIVE [--decode] [--json]");
  if (rc >= 0) return rc;
  const bool json = vm.count("json") > 0;
  auto archive = format::Archive::Open(path, format::IndexCheck::kFull);
  if (!archive.ok()) {
    if (json) {
      nlohmann::json j = {{"archive", path}, {"ok", false}, {"error", archive.status().ToString()}};
      std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
    // A damaged or edited archive is bad data, what verify is for: exit 1, as for bad records.
    const StatusCode code = archive.status().code();
    const bool damaged = code == StatusCode::kCorrupt || code == StatusCode::kChecksumMismatch;
    const int exit_code = Fail(archive.status());
    return damaged ? 1 : exit_code;
  }
  const bool tty = !json && ::isatty(STDERR_FILENO);
  auto progress = [tty](uint64_t done, uint64_t total) {
    if (!tty) return;
    std::fprintf(stderr, "\r\033[Kverifying %llu/%llu (%.1f%%)",
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(total),
                 total ? 100.0 * done / total : 100.0);
    std::fflush(stderr);
  };
  converter::VerifyReport report = converter::Verify(**archive, opt, progress);
  if (tty) std::fprintf(stderr, "\n");
  if (json) {
    std::printf("%s", report.ToJson().c_str());
  } else {
    for (const auto& s : report.bad_shards) std::printf("BAD shard: %s\n", s.c_str());
    for (const auto& b : report.bad_samples) {
      std::printf("BAD sample %llu: %s\n", static_cast<unsigned long long>(b.index),
                  b.reason.c_str());
    }
    std::printf("%s: %llu samples checked%s, %zu bad samples, %zu bad shards: %s\n", path.c_str(),
                static_cast<unsigned long long>(report.checked), opt.decode ? " and decoded" : "",
                report.bad_samples.size(), report.bad_shards.size(), report.ok() ? "OK" : "FAILED");
  }
  return report.ok() ? 0 : 1;
}

int CmdInspect(int argc, char** argv) {
  po::options_description desc("inspect options");
  std::string path;
  desc.add_options()("archive", po::value(&path)->required(), "archive")("json", "print JSON");
  po::positional_options_description pos;
  pos.add("archive", 1);
  po::variables_map vm;
  int rc = ParseArgs(argc, argv, desc, pos, vm, "shardfeed inspect ARCHIVE [--json]");
  if (rc >= 0) return rc;
  auto archive = format::Archive::Open(path, format::IndexCheck::kFull);
  if (!archive.ok()) return Fail(archive.status());
  std::printf("%s", vm.count("json") ? converter::InspectJson(**archive).c_str()
                                     : converter::InspectText(**archive).c_str());
  return 0;
}

int CmdExtract(int argc, char** argv) {
  po::options_description desc("extract options");
  std::string path, dir;
  desc.add_options()("archive", po::value(&path)->required(), "archive")(
      "dir", po::value(&dir)->required(), "output folder (created; must be empty)");
  po::positional_options_description pos;
  pos.add("archive", 1).add("dir", 1);
  po::variables_map vm;
  int rc = ParseArgs(argc, argv, desc, pos, vm, "shardfeed extract ARCHIVE DIR");
  if (rc >= 0) return rc;
  auto archive = format::Archive::Open(path, format::IndexCheck::kFull);
  if (!archive.ok()) return Fail(archive.status());
  auto n = converter::Extract(**archive, dir);
  if (!n.ok()) return Fail(n.status());
  std::printf("extracted %llu samples to %s\n", static_cast<unsigned long long>(*n), dir.c_str());
  return 0;
}

int CmdConvert(int argc, char** argv) {
  po::options_description desc("convert options");
  std::string path, out, backend;
  bool overwrite = false;
  desc.add_options()("archive", po::value(&path)->required(), "archive to read")(
      "out", po::value(&out)->required(), "archive to write")(
      "backend", po::value(&backend), "lmdb | hdf5 (default: the one ARCHIVE does not use)")(
      "overwrite", po::bool_switch(&overwrite), "replace an existing archive at OUT");
  po::positional_options_description pos;
  pos.add("archive", 1).add("out", 1);
  po::variables_map vm;
  int rc =
      ParseArgs(argc, argv, desc, pos, vm, "shardfeed convert ARCHIVE OUT [--backend lmdb|hdf5]");
  if (rc >= 0) return rc;
  auto archive = format::Archive::Open(path, format::IndexCheck::kFull);
  if (!archive.ok()) return Fail(archive.status());
  format::Backend b;
  if (backend.empty()) {
    b = (*archive)->manifest().backend == format::Backend::kLmdb ? format::Backend::kHdf5
                                                                 : format::Backend::kLmdb;
    backend = std::string(format::BackendName(b));
  } else if (!format::ParseBackend(backend, &b)) {
    return Fail(Status::InvalidArgument("--backend must be lmdb or hdf5, not '", backend, "'"));
  }
  auto n = converter::Convert(**archive, out, b, overwrite);
  if (!n.ok()) return Fail(n.status());
  std::printf("converted %llu records from %s (%s) to %s (%s)\n",
              static_cast<unsigned long long>(*n), path.c_str(),
              std::string(format::BackendName((*archive)->manifest().backend)).c_str(), out.c_str(),
              backend.c_str());
  return 0;
}

}  // namespace

int CmdMerge(int argc, char** argv) {
  po::options_description desc("merge options");
  std::vector<std::string> parts;
  std::string out;
  bool overwrite = false;
  desc.add_options()("parts", po::value(&parts)->multitoken()->required(),
                     "a directory of parts (OUT.parts) or the part archives, then OUT")(
      "overwrite", po::bool_switch(&overwrite), "replace an existing archive at OUT");
  po::positional_options_description pos;
  pos.add("parts", -1);
  po::variables_map vm;
  int rc = ParseArgs(argc, argv, desc, pos, vm, "shardfeed merge PARTS... OUT [--overwrite]");
  if (rc >= 0) return rc;
  if (parts.size() < 2) {
    return Fail(Status::InvalidArgument("usage: shardfeed merge PARTS... OUT"));
  }
  out = parts.back();
  parts.pop_back();
  converter::MergeResult r;
  Status st = converter::Merge(parts, out, overwrite, &r);
  if (!st.ok()) return Fail(st);
  std::printf("merged %llu parts (%llu shards, %llu samples) into %s%s\n",
              static_cast<unsigned long long>(r.parts), static_cast<unsigned long long>(r.shards),
              static_cast<unsigned long long>(r.samples), out.c_str(),
              r.copied_shards ? " (some shards copied: parts on another filesystem)" : "");
  return 0;
}

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    PrintUsage();
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    PrintUsage();
    return 0;
  }
  if (cmd == "--version") {
    std::printf("shardfeed %s (format version %u", SHARDFEED_VERSION, format::kFormatVersion);
#ifdef SHARDFEED_WITH_MPI
    std::printf(", mpi");
#endif
    std::printf(")\n");
    return 0;
  }
  if (cmd == "pack") return CmdPack(argc - 1, argv + 1);
  if (cmd == "verify") return CmdVerify(argc - 1, argv + 1);
  if (cmd == "inspect") return CmdInspect(argc - 1, argv + 1);
  if (cmd == "extract") return CmdExtract(argc - 1, argv + 1);
  if (cmd == "bench") return cli::CmdBench(argc - 1, argv + 1);
  if (cmd == "convert") return CmdConvert(argc - 1, argv + 1);
  if (cmd == "merge") return CmdMerge(argc - 1, argv + 1);
  std::fprintf(stderr, "shardfeed: error: unknown command '%s'\n", cmd.c_str());
  PrintUsage();
  return 2;
}
