// The whole-archive tools as Python functions (pack, verify, stats, convert, merge, inspect), the
// option tables, and what CUDA this build and machine offer.
#include "common.h"
#include "shardfeed/base/option_text.h"
#include "shardfeed/converter/convert.h"
#include "shardfeed/converter/options.h"
#include "shardfeed/converter/pack.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/reader/options.h"
#include "shardfeed/reader/pinned.h"
#include "shardfeed/storage/remote.h"
#include "shardfeed/validate/inspect.h"
#include "shardfeed/validate/stats.h"
#include "shardfeed/validate/verify.h"

namespace shardfeed_py {
namespace {

using namespace shardfeed;

// An option table as a list of dicts: name, flag, kind, choices, default, help (+ `extra`).
template <typename Table, typename Options, typename Extra>
py::list OptionList(const Table& table, const Options& defaults, Extra extra) {
  py::list out;
  for (const auto& o : table) {
    py::dict d;
    d["name"] = o.name;
    d["flag"] = OptionFlag(o.name);
    d["kind"] = OptionKindName(o.kind);
    d["range"] = o.range;
    d["choices"] = o.choices ? py::cast(std::string(o.choices)) : py::none();
    d["default"] = o.get(defaults);
    d["help"] = o.help;
    extra(o, d);
    out.append(d);
  }
  return out;
}

py::object Pack(const std::string& src, const std::string& out, const py::kwargs& kw) {
  converter::PackOptions o;
  std::string list, parts_dir;
  for (auto item : kw) {
    const std::string k = py::str(item.first);
    if (k == "list") {
      list = item.second.cast<std::string>();
    } else if (k == "parts_dir") {
      parts_dir = item.second.cast<std::string>();
    } else if (const converter::PackOption* option = converter::FindPackOption(k);
               option && k.find('-') == std::string::npos) {
      Check(option->set(&o, OptionText(item.second)));
    } else {
      throw py::type_error(converter::PackOptionTable().Unknown(k).message());
    }
  }
  Check(converter::ValidatePackOptions(o));
  o.options_json = converter::PackOptionsJson(o, list.empty() ? "folder" : "list");
  converter::PackResult result;
  Status st;
  std::string target = out;
  if (o.part_record) {
    target = converter::DefaultPartPath(out, o.part, o.parts);
    if (!parts_dir.empty()) target = parts_dir + "/" + target.substr(target.find_last_of('/') + 1);
  }
  {
    py::gil_scoped_release release;
    auto source = list.empty() ? converter::ScanImageFolder(src, converter::OutputPaths(out))
                               : converter::ReadListFile(list, src);
    st = source.ok() ? converter::Pack(*source, target, o, &result) : source.status();
  }
  Check(st);
  return FromJson(converter::PackReportJson(result, src));
}

// Damage of any kind is a report with ok False; only a path that is not there or not an
// archive at all raises.
py::object Verify(const std::string& path, bool decode, const py::dict& options,
                  const py::object& cache_dir, const py::object& cache_limit) {
  validate::VerifyOptions o;
  o.cache = CacheFrom(cache_dir, cache_limit);
  o.decode = decode;
  // workers, max_pixels through the one table the CLI reads: a range or type it refuses is
  // refused here too (workers=5000 was taken).
  SetOptions(validate::VerifyOptionTable(), options, &o);
  Result<validate::VerifyReport> report = Status::Internal("unset");
  RunInterruptible([&](const CancelToken& cancel) {
    o.cancel = &cancel;
    report = validate::VerifyPath(path, o);
  });
  return FromJson(Check(std::move(report)).ToJson());
}

// stats: the dict `shardfeed stats --json` writes (validate/stats.h).
// The archives a tool reads, fully checked, through the cache given (remote locations); the
// GIL is released while a remote one downloads, and Ctrl-C raises KeyboardInterrupt.
std::shared_ptr<format::Archive> OpenFull(const std::string& path,
                                          const storage::CacheOptions& cache = {}) {
  format::OpenOptions open;
  open.check = format::IndexCheck::kFull;
  open.cache = cache;
  Result<std::shared_ptr<format::Archive>> archive = Status::Internal("unset");
  RunInterruptible([&](const CancelToken& cancel) {
    open.cancel = &cancel;
    archive = format::Archive::Open(path, open);
  });
  return Check(std::move(archive));
}

py::object Stats(const std::string& path, const std::vector<std::string>& against,
                 const py::dict& options, const py::object& cache_dir,
                 const py::object& cache_limit) {
  const storage::CacheOptions cache = CacheFrom(cache_dir, cache_limit);
  // Keyword options through the one table the CLI reads (validate::StatsOptionTable).
  validate::StatsOptions o;
  SetOptions(validate::StatsOptionTable(), options, &o);
  Check(validate::ValidateStatsOptions(o));
  auto archive = OpenFull(path, cache);
  std::vector<validate::OtherArchive> others;
  for (const std::string& a : against) others.push_back({a, OpenFull(a, cache)});
  Result<validate::StatsReport> report = Status::Internal("unset");
  RunInterruptible([&](const CancelToken& cancel) {  // Ctrl-C: KeyboardInterrupt
    o.cancel = &cancel;
    report = validate::Stats(*archive, o, others);
  });
  const validate::StatsReport r = Check(std::move(report));
  if (!r.save_error.empty()) Raise(Status::InvalidArgument(r.save_error));  // save=True: not saved
  return FromJson(r.ToJson());
}

uint64_t Convert(const std::string& path, const std::string& out, const std::string& backend,
                 const std::string& jpeg_layout, bool overwrite) {
  auto archive = OpenFull(path);
  const converter::ConvertTarget t =
      Check(converter::ResolveConvertTarget(*archive, backend, jpeg_layout));
  Result<uint64_t> n = Status::Internal("unset");
  RunInterruptible([&](const CancelToken& cancel) {  // Ctrl-C: KeyboardInterrupt, OUT untouched
    n = converter::Convert(*archive, out, t.backend, overwrite, t.jpeg_indexed, &cancel);
  });
  return Check(std::move(n));
}

py::dict Merge(const std::vector<std::string>& parts, const std::string& out, bool overwrite) {
  converter::MergeResult r;
  Status st;
  {
    py::gil_scoped_release release;
    st = converter::Merge(parts, out, overwrite, &r);
  }
  Check(st);
  py::dict d;
  d["parts"] = r.parts;
  d["shards"] = r.shards;
  d["samples"] = r.samples;
  d["copied_shards"] = r.copied_shards;
  return d;
}

}  // namespace

void BindTools(py::module_& m) {
  m.attr("max_class_id") = format::kMaxClassId;  // format/layout.h: the largest label
  // This process's remote fetch counters, all archives together, since it started
  // (storage::GetFetchStats): what opening an archive downloaded is here, not in Loader.stats().
  m.def("fetch_stats", [] {
    const storage::FetchStats s = storage::GetFetchStats();
    py::dict d;
    d["bytes_fetched"] = s.bytes_fetched;
    d["requests"] = s.requests;
    d["cache_hits"] = s.hits;
    d["cache_misses"] = s.misses;
    d["waits"] = s.waits;
    d["retries"] = s.retries;
    d["fetch_wait_seconds"] = s.fetch_wait_ns * 1e-9;
    d["evictions"] = s.evictions;
    d["discards"] = s.discards;
    return d;
  });
  m.def("cuda_available", &reader::CudaAvailable);
  m.def("cuda_kernels_built", &reader::CudaKernelsBuilt);
  m.def("cuda_unavailable_reason", &reader::CudaUnavailableReason);
  // The option tables (reader/options.h, converter/options.h) as the CLI and this module
  // both read them.
  // The closest known name for an unknown one (base's ClosestName: the CLI's and C++'s too).
  m.def("closest_name", [](const std::string& name, const std::vector<std::string>& names) {
    return ClosestName(name, names);
  });
  // pack --report's rule (converter/pack.h): a new file, or a previous report with overwrite.
  m.def("check_report_path", [](const std::string& path, bool overwrite) {
    Check(converter::CheckReportPath(path, overwrite));
  });
  m.def("write_report", [](const std::string& path, const std::string& text, bool overwrite) {
    Check(converter::WriteReport(path, text, overwrite));
  });
  m.def("loader_options", [] {
    return OptionList(reader::LoaderOptionTable(), reader::LoaderOptions(),
                      [](const reader::LoaderOption&, py::dict&) {});
  });
  m.def("pack_options", [] {
    return OptionList(
        converter::PackOptionTable(), converter::PackOptions(),
        [](const converter::PackOption& o, py::dict& d) { d["recorded"] = o.recorded; });
  });
  m.def("pack", &Pack, py::arg("src"), py::arg("out"));
  m.def("verify", &Verify, py::arg("path"), py::arg("decode"), py::arg("options"),
        py::arg("cache_dir") = py::none(), py::arg("cache_limit") = py::none());
  m.def("stats", &Stats, py::arg("path"), py::arg("against"), py::arg("options"),
        py::arg("cache_dir") = py::none(), py::arg("cache_limit") = py::none());
  m.def("convert", &Convert, py::arg("path"), py::arg("out"), py::arg("backend"),
        py::arg("jpeg_layout"), py::arg("overwrite") = false);
  m.def("merge", &Merge, py::arg("parts"), py::arg("out"), py::arg("overwrite") = false);
  m.def(
      "inspect",
      [](const std::string& path, const py::object& cache_dir, const py::object& cache_limit) {
        auto archive = OpenFull(path, CacheFrom(cache_dir, cache_limit));
        return FromJson(validate::InspectJson(*archive));
      },
      py::arg("path"), py::arg("cache_dir") = py::none(), py::arg("cache_limit") = py::none());
}

}  // namespace shardfeed_py
