// The shardfeed command line: a thin layer over the public headers. Exit codes:
//   0 success; 1 the work found bad data (verify failures, --strict skips);
//   2 wrong arguments; 3 any other error (I/O, corrupt archive).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cctype>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli_internal.h"
#include "shardfeed/converter/convert.h"
#include "shardfeed/converter/importers.h"
#include "shardfeed/converter/options.h"
#include "shardfeed/converter/pack.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/storage/remote.h"
#include "shardfeed/validate/extract.h"
#include "shardfeed/validate/inspect.h"
#include "shardfeed/validate/verify.h"

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

int ParseArgs(int argc, char** argv, po::options_description& desc,
              po::positional_options_description& pos, po::variables_map& vm, const char* usage) {
  desc.add_options()("help,h", "show this help");
  // A negative number after a flag is that flag's value ("--epochs -1" is "--epochs=-1", refused
  // by its range), not a short option "-1" that boost would report as something else.
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool negative = a.size() > 1 && a[0] == '-' &&
                          (std::isdigit(static_cast<unsigned char>(a[1])) || a[1] == '.');
    std::string& flag = args[i - 1];
    if (negative && flag.rfind("--", 0) == 0 && flag.size() > 2 &&
        flag.find('=') == std::string::npos) {
      flag += "=" + a;
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i--));
    }
  }
  try {
    // No guessing: boost took a prefix of a flag for the flag (`--worker 2` as --workers,
    // `--over` as --overwrite) without a word; a flag is its whole name, or a "did you mean".
    po::store(
        po::command_line_parser(args)
            .options(desc)
            .positional(pos)
            .style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing)
            .run(),
        vm);
    if (vm.count("help")) {
      std::cout << "usage: " << usage << "\n\n" << desc << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    // boost's message, and the closest flag this command has (base's ClosestName, which the
    // option tables' Unknown() and the Python bindings use too).
    std::vector<std::string> flags;
    for (const auto& o : desc.options()) flags.push_back(o->long_name());
    std::string name = e.get_option_name();
    while (!name.empty() && name[0] == '-') name.erase(0, 1);
    const std::string close = ClosestName(name, flags);
    std::fprintf(stderr, "shardfeed: error: %s%s\nusage: %s\n", e.what(),
                 close.empty() ? "" : ("; did you mean --" + close + "?").c_str(), usage);
    return 2;
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

double CpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

}  // namespace shardfeed::cli

namespace {

using cli::Fail;
using cli::ParseArgs;

constexpr const char* kStagingHelp =
    "with an s3:// OUT: build the archive in this folder, then upload it (default: a new folder "
    "under $TMPDIR, removed after the upload; kept, with a message, when it fails)";

bool IsMpiJob() {
#ifdef SHARDFEED_WITH_MPI
  return cli::MpiWorldSize() > 1;
#else
  return false;
#endif
}

void PrintUsage() {
  std::printf(
      "usage: shardfeed <command> [options]\n\n"
      "commands:\n"
      "  pack SRC OUT        pack an image folder, list, JSONL/CSV, COCO or WebDataset source\n"
      "  verify ARCHIVE      check every record checksum and shard hash (--decode: decode too)\n"
      "  inspect ARCHIVE     samples, classes, encoding, shapes, sizes\n"
      "  extract ARCHIVE DIR write the samples back as an image folder\n"
      "  stats ARCHIVE       mean/std, labels, sizes, duplicates, leaks, quality flags\n"
      "  bench ARCHIVE       read epochs as training would and report images/s\n"
      "  tune ARCHIVE        the workers and prefetch a step of --step-ms T needs here\n"
      "  convert ARCHIVE OUT rewrite an archive into the other backend (LMDB <-> HDF5)\n"
      "  merge PARTS OUT     join the parts of a split pack (pack --part I/N) into one archive\n\n"
      "Run 'shardfeed <command> --help' for a command's options.\n");
}

// pack --from parquet: the Python package's importer, run with the interpreter the Python module
// was built for (the build tree's package first on its path).
int PackParquet(int argc, char** argv) {
  const std::string python = SHARDFEED_BUILD_PYTHON;
  const std::string path = SHARDFEED_BUILD_PYTHONPATH;
  if (python.empty() || ::access(python.c_str(), X_OK) != 0) {
    return Fail(Status::Unsupported(
        "parquet import needs the shardfeed Python package and pyarrow (pip install "
        "shardfeed pyarrow; then python -m shardfeed.importers.parquet SRC OUT)"));
  }
  std::string pythonpath = path;
  if (const char* old = std::getenv("PYTHONPATH"); old && *old)
    pythonpath += ":" + std::string(old);
  // The import's own error in one line (not a traceback): any failure used to read as "needs
  // pyarrow", a broken package or a missing numpy included.
  const std::string check =
      "import sys\ntry:\n    import shardfeed.importers.parquet, pyarrow\n"
      "except BaseException as e:\n"
      "    sys.stderr.write('shardfeed: the import failed: %s: %s\\n' % (type(e).__name__, e))\n"
      "    sys.exit(1)\n";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("PYTHONPATH", pythonpath.c_str(), 1);
    ::execl(python.c_str(), python.c_str(), "-c", check.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    // The line above says why (the import's own error); this one what was tried.
    return Fail(Status::Unsupported(
        "parquet import runs python -m shardfeed.importers.parquet SRC OUT with ", python,
        ", which could not import it and pyarrow (see above)"));
  }
  // The importer takes pack's arguments but --from (it is the parquet one) and -q (it prints
  // no progress line).
  std::vector<std::string> args = {python, "-m", "shardfeed.importers.parquet"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--from") {
      ++i;
    } else if (a.rfind("--from=", 0) != 0 && a != "-q" && a != "--quiet") {
      args.push_back(a);
    }
  }
  std::vector<char*> argv_out;
  for (std::string& a : args) argv_out.push_back(a.data());
  argv_out.push_back(nullptr);
  std::fflush(nullptr);
  ::setenv("PYTHONPATH", pythonpath.c_str(), 1);
  ::execv(python.c_str(), argv_out.data());
  return Fail(Status::IOError("cannot run ", python, ": ", std::strerror(errno)));
}

// long: the flags, the source (folder, list or an importer), the pack, the summary.
int CmdPack(int argc, char** argv) {
  // Every pack option comes from converter/options.h (shardfeed.pack takes the same ones).
  po::options_description desc("pack options (as shardfeed.pack takes them)");
  std::string src, out, list, report, parts_dir, from, schema_file, staging;
  converter::ImportOptions import;
  converter::PackOptions opt;
  std::vector<std::string> helps;  // kept alive: program_options stores the pointers
  const std::string from_help =
      std::string("what SRC is [") + converter::SourceKinds() + "] (default: recognised from SRC)";
  desc.add_options()("src", po::value(&src)->required(),
                     "image folder (ROOT/<class>/<image>), the root of --list paths, a JSONL/CSV "
                     "manifest, a COCO instances .json, .tar shards or a directory of them")(
      "out", po::value(&out)->required(), "archive to write (a directory)")(
      "list", po::value(&list), "list file: 'path label' or MXNet 'index\\tlabel\\tpath' per line")(
      "from", po::value(&from), from_help.c_str())(
      "schema", po::value(&schema_file),
      "jsonl/csv/webdataset: the fields as a JSON file "
      "({name: type, ...}; default: inferred from the data)")(
      "images", po::value(&import.images), "coco: the folder the file_names are relative to")(
      "captions", po::value(&import.captions), "coco: a COCO captions file (a captions field)")(
      "class-names", po::value(&import.class_names),
      "list/jsonl/csv/webdataset: the class names in id order (a JSON list, or one per line; "
      "extract writes class_names.json)");
  cli::AddOptionTable(desc, converter::PackOptionTable(), opt, &helps);
  desc.add_options()("report", po::value(&report), "write a JSON report of skipped files here")(
      "parts-dir", po::value(&parts_dir), "where --part writes (default OUT.parts)")(
      "staging", po::value(&staging), kStagingHelp)("quiet,q", "no progress line");
  po::positional_options_description pos;
  pos.add("src", 1).add("out", 1);
  po::variables_map vm;
  int rc = ParseArgs(argc, argv, desc, pos, vm, "shardfeed pack SRC OUT [options]");
  if (rc >= 0) return rc;
  if (from == "parquet" || (from.empty() && list.empty() && converter::DetectSourceKind(src).ok() &&
                            *converter::DetectSourceKind(src) == "parquet")) {
    if (storage::IsRemote(out) || !staging.empty()) {
      return Fail(Status::InvalidArgument(
          out,
          ": pack --from parquet writes a local OUT only (--staging and s3:// are not "
          "supported there)"));
    }
    return PackParquet(argc, argv);
  }
  if (Status s = cli::ApplyOptionTable(vm, converter::PackOptionTable(), &opt); !s.ok())
    return Fail(s);
  if (Status s = converter::ValidatePackOptions(opt); !s.ok()) return Fail(s);
  // The report is a new file (or a previous report, with --overwrite), checked before any work.
  if (!report.empty()) {
    if (Status s = converter::CheckReportPath(report, opt.writer.overwrite); !s.ok())
      return Fail(s);
  }
  if (!schema_file.empty()) {
    std::ifstream f(schema_file);
    std::stringstream text;
    text << f.rdbuf();
    if (!f) return Fail(Status::NotFound(schema_file, ": cannot read the schema file"));
    import.schema_json = text.str();
    if (auto parsed = format::Schema::FromJson(import.schema_json); !parsed.ok()) {
      return Fail(parsed.status().WithContext(schema_file));
    }
  }
  import.kind = from;
  import.list = list;
  import.skip_bad = opt.skip_bad;
  const std::string backend(format::BackendName(opt.writer.backend));
  if (storage::IsRemote(out) && (opt.part_record || IsMpiJob())) {
    return Fail(Status::InvalidArgument(
        out,
        ": pack --part and MPI packs write locally; merge the parts into s3:// (shardfeed "
        "merge PARTS... s3://bucket/prefix)"));
  }
  if (!opt.part_record && !parts_dir.empty()) {
    return Fail(Status::InvalidArgument("--parts-dir goes with --part"));
  }
  const std::string remote_out = out;
  auto staged = cli::StagedOut::Prepare(out, staging, opt.writer.overwrite);
  if (!staged.ok()) return Fail(staged.status());
  out = staged->path();
  const std::string archive_out = out;  // the final archive (what the scan must never pack)
  import.exclude = converter::OutputPaths(archive_out);
  if (opt.part_record) {
    const uint32_t i = opt.part, n = opt.parts;
    out = parts_dir.empty()
              ? converter::DefaultPartPath(out, i, n)
              : (std::filesystem::path(parts_dir) /
                 std::filesystem::path(converter::DefaultPartPath("x", i, n)).filename())
                    .string();
  }
#ifdef SHARDFEED_WITH_MPI
  if (!opt.part_record && cli::MpiWorldSize() > 1 &&
      (from.empty() || from == "folder" || from == "list")) {
    opt.options_json = converter::PackOptionsJson(opt, list.empty() ? "folder" : "list");
    return cli::MpiPack(src, list, archive_out, opt, report);
  }
#endif

  // The report, written whether the pack succeeds or fails (with its error then).
  auto write_report = [&](const converter::PackResult& result, const Status& st) {
    if (report.empty()) return;
    const Status w = converter::WriteReport(
        report, converter::PackReportJson(result, src, st.ok() ? "" : st.message()),
        opt.writer.overwrite);
    if (!w.ok()) std::fprintf(stderr, "shardfeed: warning: %s\n", w.message().c_str());
  };
  Result<converter::SourceList> source = converter::ImportSource(src, import);
  if (!source.ok()) {
    write_report({}, source.status());
    (void)staged->Finish(source.status());  // nothing built: an s3:// OUT's staging folder goes
    // A bad row or annotation in the source is bad data (exit 1), like a --strict skip.
    if (source.status().code() == StatusCode::kCorrupt) {
      std::fprintf(stderr, "shardfeed: error: %s\n", source.status().message().c_str());
      return 1;
    }
    const int code = Fail(source.status());
    // A SRC that is not there is a wrong argument (exit 2), as verify's missing ARCHIVE.
    return source.status().code() == StatusCode::kNotFound ? 2 : code;
  }
  opt.options_json = converter::PackOptionsJson(opt, source->kind);

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
  st = staged->Finish(st);  // an s3:// OUT: uploaded now, the manifest last
  out = remote_out;
  write_report(result, st);
  for (const std::string& note : result.notes) std::fprintf(stderr, "note: %s\n", note.c_str());
  for (size_t i = 0; i < result.skipped.size() && i < 20; ++i) {
    std::fprintf(stderr, "skipped %s: %s\n", result.skipped[i].path.c_str(),
                 result.skipped[i].reason.c_str());
  }
  if (result.skipped.size() > 20) {
    std::fprintf(stderr, "... and %zu more skipped (see --report)\n", result.skipped.size() - 20);
  }
  if (!st.ok()) {
    // Bad data (exit 1): a --strict skip, every file skipped, a sample whose fields do not
    // match the schema.
    if (!result.failed_sample.empty() ||
        (!result.skipped.empty() && (opt.strict || result.stats.packed == 0))) {
      std::fprintf(stderr, "shardfeed: error: %s\n", st.message().c_str());
      return 1;
    }
    return Fail(st);
  }
  const auto& s = result.stats;
  // A part is written to its own folder (OUT.parts/part-...), not to OUT.
  const std::string written = opt.part_record ? result.output : out;
  std::printf("packed %llu of %llu files into %s (%s, %s): %llu skipped, %zu ignored\n",
              static_cast<unsigned long long>(s.packed), static_cast<unsigned long long>(s.total),
              written.c_str(), std::string(format::EncodingName(result.encoding)).c_str(),
              backend.c_str(), static_cast<unsigned long long>(result.skipped.size()),
              result.ignored.size());
  if (source->kind != "folder" && source->kind != "list") {  // the schema the importer made
    std::string fields;
    for (const format::FieldSpec& f : source->schema.fields()) {
      fields += (fields.empty() ? "" : ", ") + f.name + " " + f.TypeName();
      if (&f - source->schema.fields().data() == source->schema.label_field()) {
        fields += " (the class field, " + std::to_string(source->class_names.size()) + " classes)";
      }
    }
    std::printf("fields: %s\n", fields.c_str());
  }
  if (s.reencoded > 0) {
    std::printf("%llu re-encoded (%s); the rest keep their bytes\n",
                static_cast<unsigned long long>(s.reencoded),
                result.encoding == format::Encoding::kJpeg ? "as JPEG, lossy" : "lossless");
  }
  if (auto c = codec::CodecFor(result.encoding);
      c.ok() && (*c)->CapsResolution(converter::EncodeOptionsOf(opt))) {
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
  using VO = validate::VerifyOptions;
  const OptionTable<VO>& table = validate::VerifyOptionTable();
  po::options_description desc("verify options");
  std::string path;
  VO opt;
  std::vector<std::string> helps;
  desc.add_options()("archive", po::value(&path)->required(), "archive to check")(
      "decode", po::bool_switch(&opt.decode), "also decode every record");
  cli::AddOptionTable(desc, table, opt, &helps);
  cli::AddCacheOptions(desc, &helps);
  desc.add_options()("json", "print one JSON object")("quiet,q", "no progress line");
  po::positional_options_description pos;
  pos.add("archive", 1);
  po::variables_map vm;
  int rc = ParseArgs(argc, argv, desc, pos, vm, "shardfeed verify ARCHIVE [--decode] [--json]");
  if (rc >= 0) return rc;
  if (Status s = cli::ApplyOptionTable(vm, table, &opt); !s.ok()) return Fail(s);
  if (Status s = cli::ApplyCacheOptions(vm); !s.ok()) return Fail(s);
  const bool json = vm.count("json") > 0;
  const bool tty = !json && !vm.count("quiet") && ::isatty(STDERR_FILENO);
  auto progress = [tty](uint64_t done, uint64_t total) {
    if (!tty) return;
    std::fprintf(stderr, "\r\033[Kverifying %llu/%llu (%.1f%%)",
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(total),
                 total ? 100.0 * done / total : 100.0);
    std::fflush(stderr);
  };
  // Damage of any kind (an archive too damaged to open, a shard file missing, a bad record) is
  // a report and exit 1; a path that is not there or not an archive at all is exit 2; a remote
  // archive that could not be read (the network, the cache unusable) is exit 3.
  auto result = validate::VerifyPath(path, opt, progress);
  if (!result.ok()) {
    const StatusCode code = result.status().code();
    Fail(result.status());
    return code == StatusCode::kNotFound || code == StatusCode::kInvalidArgument ? 2 : 3;
  }
  const validate::VerifyReport& report = *result;
  if (tty) std::fprintf(stderr, "\n");
  if (json) {
    std::printf("%s", report.ToJson().c_str());
  } else {
    if (!report.error.empty()) {
      std::fprintf(stderr, "shardfeed: error: %s\n", report.error.c_str());
      std::printf("BAD archive: %s\n", report.error.c_str());
    }
    std::printf("%s", report.ToText(path, opt.decode).c_str());
  }
  return report.ok() ? 0 : 1;
}

int CmdInspect(int argc, char** argv) {
  using CS = validate::ContactSheetOptions;
  static const OptionTable<CS> table(
      "inspect option",
      {CountOption<CS>("per_class", 1, 64, "with --grid: samples per class", &CS::per_class),
       CountOption<CS>("size", 16, 512, "with --grid: thumbnail side", &CS::tile)});
  po::options_description desc("inspect options");
  std::string path, grid;
  CS sheet;
  std::vector<std::string> helps;
  desc.add_options()("archive", po::value(&path)->required(), "archive")("json", "print JSON")(
      "grid", po::value(&grid),
      "also write a contact sheet (PNG) here: a row per class, its first samples as thumbnails "
      "with their indices");
  cli::AddOptionTable(desc, table, sheet, &helps);
  cli::AddCacheOptions(desc, &helps);
  desc.add_options()("quiet,q", "accepted; inspect prints no progress");
  po::positional_options_description pos;
  pos.add("archive", 1);
  po::variables_map vm;
  int rc = ParseArgs(argc, argv, desc, pos, vm,
                     "shardfeed inspect ARCHIVE [--json] [--grid SHEET.png [--per-class K] "
                     "[--size S]]");
  if (rc >= 0) return rc;
  if (Status s = cli::ApplyOptionTable(vm, table, &sheet); !s.ok()) return Fail(s);
  if (Status s = cli::ApplyCacheOptions(vm); !s.ok()) return Fail(s);
  if (vm.count("grid") && grid.empty()) {
    return Fail(Status::InvalidArgument("--grid needs the path of the PNG file to write"));
  }
  auto given = [&](const char* flag) { return vm.count(flag) && !vm[flag].defaulted(); };
  if (!vm.count("grid") && (given("per-class") || given("size"))) {
    return Fail(
        Status::InvalidArgument("--per-class and --size shape the contact sheet: they "
                                "go with --grid SHEET.png"));
  }
  if (!grid.empty()) {
    if (Status s = validate::CheckNewFile(grid); !s.ok()) return Fail(s);
  }
  auto archive = format::Archive::Open(path, format::IndexCheck::kFull);
  if (!archive.ok()) return Fail(archive.status());
  if (!grid.empty()) {
    auto image = validate::ContactSheet(**archive, sheet);
    if (!image.ok()) return Fail(image.status());
    auto png = imaging::EncodePng(*image);
    if (!png.ok()) return Fail(png.status());
    if (Status s = validate::WriteNewFile(grid, png->data(), png->size()); !s.ok()) {
      return Fail(s);
    }
    std::fprintf(stderr, "contact sheet: %s (%ux%u)\n", grid.c_str(), image->width, image->height);
  }
  std::printf("%s", vm.count("json") ? validate::InspectJson(**archive).c_str()
                                     : validate::InspectText(**archive).c_str());
  return 0;
}

int CmdExtract(int argc, char** argv) {
  using EO = validate::ExtractOptions;
  static const OptionTable<EO> table(
      "extract option",
      {CountOption<EO>("max_pixels", 1, UINT64_MAX,
                       "refuse records declaring more pixels than this (as verify --decode and "
                       "the loader)",
                       &EO::max_pixels)});
  po::options_description desc("extract options");
  std::string path, dir;
  EO opt;
  std::vector<std::string> helps;
  desc.add_options()("archive", po::value(&path)->required(), "archive")(
      "dir", po::value(&dir)->required(), "output folder (created; must be empty)");
  cli::AddOptionTable(desc, table, opt, &helps);
  cli::AddCacheOptions(desc, &helps);
  desc.add_options()("quiet,q", "accepted; extract prints no progress");
  po::positional_options_description pos;
  pos.add("archive", 1).add("dir", 1);
  po::variables_map vm;
  int rc = ParseArgs(argc, argv, desc, pos, vm, "shardfeed extract ARCHIVE DIR");
  if (rc >= 0) return rc;
  if (Status s = cli::ApplyOptionTable(vm, table, &opt); !s.ok()) return Fail(s);
  if (Status s = cli::ApplyCacheOptions(vm); !s.ok()) return Fail(s);
  auto archive = format::Archive::Open(path, format::IndexCheck::kFull);
  if (!archive.ok()) return Fail(archive.status());
  auto n = validate::Extract(**archive, dir, opt);
  if (!n.ok()) return Fail(n.status());
  std::printf("extracted %llu samples to %s\n", static_cast<unsigned long long>(*n), dir.c_str());
  // Labels or fields that the folder layout cannot carry went to DIR/samples.jsonl: say how to
  // pack them again (a plain `pack DIR` would renumber or drop them).
  const std::filesystem::path d(dir);
  std::error_code ec;
  auto quoted = [](const std::filesystem::path& p) {  // as a POSIX shell reads it back
    const std::string s = p.string();
    if (s.find_first_not_of(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./-+=:,@") ==
        std::string::npos) {
      return s;
    }
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  if (std::filesystem::exists(d / "samples.jsonl", ec)) {
    std::string again = "shardfeed pack " + quoted(d / "samples.jsonl") + " OUT --schema " +
                        quoted(d / "schema.json");
    if (std::filesystem::exists(d / "class_names.json", ec)) {
      again += " --class-names " + quoted(d / "class_names.json");
    }
    std::printf("labels and fields are in %s; to pack them again: %s\n",
                (d / "samples.jsonl").string().c_str(), again.c_str());
  }
  return 0;
}

int CmdConvert(int argc, char** argv) {
  po::options_description desc("convert options");
  std::string path, out, backend, jpeg_layout = "original", staging;
  bool overwrite = false;
  desc.add_options()("archive", po::value(&path)->required(), "archive to read")(
      "out", po::value(&out)->required(), "archive to write")(
      "backend", po::value(&backend),
      "lmdb | hdf5 (default: the one ARCHIVE does not use; with --jpeg-layout indexed, its own)")(
      "jpeg-layout", po::value(&jpeg_layout),
      "original (records as they are) | indexed (re-lay JPEG records as pack --jpeg-layout "
      "indexed does)")("overwrite", po::bool_switch(&overwrite),
                       "replace an existing archive at OUT")(
      "staging", po::value(&staging), kStagingHelp)("quiet,q",
                                                    "accepted; convert prints no progress");
  po::positional_options_description pos;
  pos.add("archive", 1).add("out", 1);
  po::variables_map vm;
  int rc =
      ParseArgs(argc, argv, desc, pos, vm, "shardfeed convert ARCHIVE OUT [--backend lmdb|hdf5]");
  if (rc >= 0) return rc;
  auto archive = format::Archive::Open(path, format::IndexCheck::kFull);
  if (!archive.ok()) return Fail(archive.status());
  auto target = converter::ResolveConvertTarget(**archive, backend, jpeg_layout);
  if (!target.ok()) return Fail(target.status());
  backend = std::string(format::BackendName(target->backend));
  auto staged = cli::StagedOut::Prepare(out, staging, overwrite);
  if (!staged.ok()) return Fail(staged.status());
  auto n = converter::Convert(**archive, staged->path(), target->backend, overwrite,
                              target->jpeg_indexed);
  if (Status st = staged->Finish(n.status()); !st.ok()) return Fail(st);
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
  std::string out, staging;
  bool overwrite = false;
  desc.add_options()("parts", po::value(&parts)->multitoken()->required(),
                     "a directory of parts (OUT.parts) or the part archives, then OUT")(
      "overwrite", po::bool_switch(&overwrite), "replace an existing archive at OUT")(
      "staging", po::value(&staging), kStagingHelp)("quiet,q",
                                                    "accepted; merge prints no progress");
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
  auto staged = cli::StagedOut::Prepare(out, staging, overwrite);
  if (!staged.ok()) return Fail(staged.status());
  Status st = staged->Finish(converter::Merge(parts, staged->path(), overwrite, &r));
  if (!st.ok()) return Fail(st);
  std::printf("merged %llu parts (%llu shards, %llu samples) into %s%s\n",
              static_cast<unsigned long long>(r.parts), static_cast<unsigned long long>(r.shards),
              static_cast<unsigned long long>(r.samples), out.c_str(),
              r.copied_shards ? " (some shards copied: parts on another filesystem)" : "");
  return 0;
}

namespace {

int Dispatch(int argc, char** argv) {
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
    if (argc > 2) {
      std::fprintf(stderr, "shardfeed: error: --version takes no argument (got '%s')\n", argv[2]);
      return 2;
    }
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
  if (cmd == "stats") return cli::CmdStats(argc - 1, argv + 1);
  if (cmd == "bench") return cli::CmdBench(argc - 1, argv + 1);
  if (cmd == "tune") return cli::CmdTune(argc - 1, argv + 1);
  if (cmd == "convert") return CmdConvert(argc - 1, argv + 1);
  if (cmd == "merge") return CmdMerge(argc - 1, argv + 1);
  const std::string close = ClosestName(
      cmd, {"pack", "verify", "inspect", "extract", "bench", "tune", "convert", "merge"});
  std::fprintf(stderr, "shardfeed: error: unknown command '%s'%s\n", cmd.c_str(),
               close.empty() ? "" : ("; did you mean '" + close + "'?").c_str());
  PrintUsage();
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  // The last resort: an exception no command caught (a thread the system refused, memory) is a
  // clear error and exit 2, never an abort.
  try {
    return Dispatch(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "shardfeed: error: out of memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardfeed: error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "shardfeed: error: unexpected failure\n");
  }
  return 2;
}
