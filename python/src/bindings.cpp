// shardfeed._native: the C++ library as Python sees it. Thin: public headers only.
//
// Zero-copy: a batch's images and labels reach Python as numpy arrays pointing into the loader's
// ring slot; their base object holds the slot's lease, so the slot returns to the ring only when
// the last array (or a torch tensor made from it) is gone. Errors become exceptions.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "dlpack_export.h"
#include "shardfeed/codec/codec.h"
#include "shardfeed/converter/convert.h"
#include "shardfeed/converter/options.h"
#include "shardfeed/converter/pack.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/imaging/image.h"
#include "shardfeed/reader/loader.h"
#include "shardfeed/reader/options.h"
#include "shardfeed/validate/inspect.h"
#include "shardfeed/validate/stats.h"
#include "shardfeed/validate/verify.h"

namespace py = pybind11;
using namespace shardfeed;
using namespace shardfeed_py;

namespace {

PyObject* g_error = nullptr;         // shardfeed.Error
PyObject* g_data_error = nullptr;    // shardfeed.DataError (corrupt data, checksum mismatch)
PyObject* g_worker_error = nullptr;  // shardfeed.WorkerError (a worker process died)
PyObject* g_timeout = nullptr;       // shardfeed.Timeout (no batch within the loader's timeout)

[[noreturn]] void Raise(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
      throw py::value_error(s.message());
    case StatusCode::kNotFound:
      PyErr_SetString(PyExc_FileNotFoundError, s.message().c_str());
      break;
    case StatusCode::kCorrupt:
    case StatusCode::kChecksumMismatch:
      PyErr_SetString(g_data_error, s.ToString().c_str());
      break;
    case StatusCode::kTimeout:
      PyErr_SetString(g_timeout, s.message().c_str());
      break;
    default:
      if (s.message().find("worker process") != std::string::npos) {
        PyErr_SetString(g_worker_error, s.message().c_str());
      } else {
        PyErr_SetString(g_error, s.ToString().c_str());
      }
  }
  throw py::error_already_set();
}

template <typename T>
T Check(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(*r);
}
void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

py::object FromJson(const std::string& text) {
  return py::module_::import("json").attr("loads")(text);
}

// A numpy array over memory kept alive by `owner` (a shared_ptr copied into a capsule).
template <typename T>
py::array_t<T> View(T* data, std::vector<ssize_t> shape, std::shared_ptr<void> owner) {
  auto* holder = new std::shared_ptr<void>(std::move(owner));
  py::capsule base(holder, [](void* p) { delete static_cast<std::shared_ptr<void>*>(p); });
  return py::array_t<T>(shape, data, base);
}

// The numpy dtype of a batch's images. numpy has no bfloat16: its bits come as uint16
// (shardfeed.torch views them as torch.bfloat16).
py::dtype NumpyDType(reader::DType d) {
  switch (d) {
    case reader::DType::kFloat32:
      return py::dtype("float32");
    case reader::DType::kFloat16:
      return py::dtype("float16");
    case reader::DType::kBFloat16:
      return py::dtype("uint16");
    case reader::DType::kUint8:
      break;
  }
  return py::dtype("uint8");
}

py::array ViewAs(void* data, reader::DType d, std::vector<ssize_t> shape,
                 std::shared_ptr<void> owner) {
  auto* holder = new std::shared_ptr<void>(std::move(owner));
  py::capsule base(holder, [](void* p) { delete static_cast<std::shared_ptr<void>*>(p); });
  return py::array(NumpyDType(d), shape, data, base);
}

DLDataType DlpackType(reader::DType d) {
  switch (d) {
    case reader::DType::kFloat32:
      return {kDLFloat, 32, 1};
    case reader::DType::kFloat16:
      return {kDLFloat, 16, 1};
    case reader::DType::kBFloat16:
      return {kDLBfloat, 16, 1};
    case reader::DType::kUint8:
      break;
  }
  return {kDLUInt, 8, 1};
}

// A name from a str or a torch.dtype / torch.device ("torch.float32" -> "float32").
std::string OptionName(const py::handle& v) {
  std::string s = py::str(v);
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  return s;
}

struct PyArchive {
  std::shared_ptr<format::Archive> archive;
  pid_t pid = 0;
};

py::tuple GetItem(const PyArchive& a, int64_t i) {
  const int64_t n = static_cast<int64_t>(a.archive->size());
  if (i < 0) i += n;
  if (i < 0 || i >= n) throw py::index_error("sample index out of range");
  auto at = a.archive->At(static_cast<uint64_t>(i));
  if (!at.ok()) Raise(at.status());
  const format::RecordView r = *at;
  auto image = std::make_shared<imaging::Image>();
  {
    py::gil_scoped_release release;
    imaging::Limits limits;  // the packer's pixel limit, checked before any allocation
    Status s = format::CheckPixelLimit(*r.entry, limits.max_pixels);
    if (s.ok()) {
      auto c = codec::CodecFor(*r.entry);
      codec::Context ctx;
      s = c.ok() ? (*c)->Decode(ctx, r, limits, /*strict=*/false, image.get()) : c.status();
    }
    // A shard truncated under the mapping read as zeros: that, not the image, is the reason.
    if (Status changed = a.archive->CheckUnchanged(static_cast<uint64_t>(i)); !changed.ok()) {
      py::gil_scoped_acquire acquire;
      Raise(changed);
    }
    if (!s.ok()) {
      py::gil_scoped_acquire acquire;
      Raise(Status(s.code(),
                   a.archive->path() + ": sample " + std::to_string(i) + ": " + s.message()));
    }
  }
  auto arr = View<uint8_t>(image->pixels.data(), {image->height, image->width, 3}, image);
  return py::make_tuple(arr, a.archive->Label(static_cast<uint64_t>(i)));
}

// An option table as a list of dicts (see loader_options / pack_options below).
template <typename Table, typename Options, typename Extra>
py::list OptionList(const Table& table, const Options& defaults,
                    std::initializer_list<const char*> kinds, Extra extra) {
  const std::vector<const char*> kind_names(kinds);
  py::list out;
  for (const auto& o : table) {
    py::dict d;
    d["name"] = o.name;
    d["flag"] = OptionFlag(o.name);
    d["kind"] = kind_names.at(static_cast<size_t>(o.kind));
    d["choices"] = o.choices ? py::cast(std::string(o.choices)) : py::none();
    d["default"] = o.get(defaults);
    d["help"] = o.help;
    extra(o, d);
    out.append(d);
  }
  return out;
}

// A keyword argument's text form, as the CLI would receive it (reader/options.h parses both):
// bools true/false, numbers as Python prints them, sequences comma-separated, None "none",
// torch dtypes and devices by name.
std::string OptionText(const py::handle& v) {
  if (v.is_none()) return "none";
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "true" : "false";
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    std::string out;
    for (py::handle item : v) out += (out.empty() ? "" : ",") + OptionText(item);
    return out;
  }
  return OptionName(v);
}

reader::LoaderOptions ParseLoaderOptions(const py::dict& kw) {
  reader::LoaderOptions o;
  for (auto item : kw) {
    const std::string name = py::str(item.first);
    const reader::LoaderOption* option = reader::FindLoaderOption(name);
    if (!option || name.find('-') != std::string::npos) {  // as Python: an unknown keyword
      throw py::type_error("unexpected loader option '" + name + "'");
    }
    Check(option->set(&o, OptionText(item.second)));
  }
  Check(reader::ValidateLoaderOptions(o));
  return o;
}

struct PyLoader {
  std::unique_ptr<reader::Loader> loader;
  pid_t pid = 0;
  // The native loader, or a clear error once close() ran.
  reader::Loader& get() const {
    if (!loader) {
      PyErr_SetString(g_error, "this Loader is closed");
      throw py::error_already_set();
    }
    return *loader;
  }
};

py::dict StatsDict(const reader::EpochStats& s) {
  py::dict d;
  d["epoch"] = s.epoch;
  d["batches"] = s.batches;
  d["images"] = s.images;
  d["skipped"] = s.skipped;
  d["seconds"] = s.seconds;
  d["wait_seconds"] = s.wait_seconds;
  d["consumer_seconds"] = s.consumer_seconds;
  d["wait_fraction"] = s.wait_fraction();
  d["workers"] = s.workers;    // claiming work at the end of the epoch (workers="auto": tuned)
  d["prefetch"] = s.prefetch;  // ring slots in use (prefetch="auto": tuned)
  d["ring_bytes"] = s.ring_bytes;
  d["ring_full_seconds"] = s.ring_full_seconds;
  d["run_ahead_batches"] = s.run_ahead_batches;
  d["ahead_kept"] = s.ahead_kept;
  d["tuning"] = s.tuning;
  d["images_per_second"] = s.seconds > 0 ? s.images / s.seconds : 0.0;
  py::dict stages;
  stages["read"] = s.read;
  stages["decode"] = s.decode;
  stages["collate"] = s.collate;
  stages["copy"] = s.copy;
  d["stage_seconds"] = stages;
  return d;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "shardfeed native core (use the shardfeed package, not this module)";
  static py::exception<std::runtime_error> error(m, "Error", PyExc_RuntimeError);
  g_error = error.ptr();
  static py::exception<std::runtime_error> data_error(m, "DataError", g_error);
  g_data_error = data_error.ptr();
  static py::exception<std::runtime_error> worker_error(m, "WorkerError", g_error);
  g_worker_error = worker_error.ptr();
  static py::exception<std::runtime_error> timeout(m, "Timeout", g_error);
  g_timeout = timeout.ptr();

  py::class_<PyArchive>(m, "Archive")
      .def(py::init([](const std::string& path, const std::string& check) {
             format::IndexCheck c = format::IndexCheck::kAuto;
             if (check == "full")
               c = format::IndexCheck::kFull;
             else if (check == "lazy")
               c = format::IndexCheck::kLazy;
             else if (check != "auto")
               throw py::value_error("index_check must be 'auto', 'full' or 'lazy'");
             PyArchive a;
             a.archive = Check(format::Archive::Open(path, c));
             a.pid = ::getpid();
             return a;
           }),
           py::arg("path"), py::arg("index_check") = "auto")
      .def_property_readonly("lazy", [](const PyArchive& a) { return a.archive->lazy(); })
      .def("__len__", [](const PyArchive& a) { return a.archive->size(); })
      .def("__getitem__", &GetItem)
      .def_property_readonly("path", [](const PyArchive& a) { return a.archive->path(); })
      .def_property_readonly("class_names",
                             [](const PyArchive& a) { return a.archive->manifest().class_names; })
      .def_property_readonly(
          "encoding",
          [](const PyArchive& a) {
            return std::string(format::EncodingName(a.archive->manifest().encoding));
          })
      .def_property_readonly("shape",
                             [](const PyArchive& a) -> py::object {
                               const auto& mf = a.archive->manifest();
                               if (!mf.height) return py::none();
                               return py::make_tuple(mf.height, mf.width, mf.channels);
                             })
      .def_property_readonly("opened_in_pid", [](const PyArchive& a) { return a.pid; })
      .def("label",
           [](const PyArchive& a, uint64_t i) {
             if (i >= a.archive->size()) throw py::index_error("sample index out of range");
             return Check(a.archive->At(i)).entry->label;
           })
      .def("labels",
           [](const PyArchive& a) {
             py::array_t<int64_t> out(static_cast<ssize_t>(a.archive->size()));
             auto* p = out.mutable_data();
             for (uint64_t i = 0; i < a.archive->size(); ++i) {
               p[i] = Check(a.archive->At(i)).entry->label;
             }
             return out;
           })
      .def("record", [](const PyArchive& a, uint64_t i) {
        // The stored payload, zero-copy: a read-only memoryview into the mapping.
        if (i >= a.archive->size()) throw py::index_error("sample index out of range");
        const format::RecordView r = Check(a.archive->At(i));
        auto arr =
            View<uint8_t>(const_cast<uint8_t*>(r.data), {static_cast<ssize_t>(r.size)}, a.archive);
        py::detail::array_proxy(arr.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
        return arr;
      });

  py::class_<PyLoader>(m, "Loader")
      .def(py::init([](const PyArchive& a, py::kwargs kw) {
             reader::LoaderOptions o = ParseLoaderOptions(kw);
             PyLoader l;
             {
               py::gil_scoped_release release;
               auto r = reader::Loader::Create(a.archive, o);
               py::gil_scoped_acquire acquire;
               l.loader = Check(std::move(r));
             }
             l.pid = ::getpid();
             return l;
           }),
           py::arg("archive"))
      .def(
          "start_epoch",
          [](PyLoader& l, uint64_t epoch, uint64_t position, uint64_t plan_start) {
            Check(l.get().StartEpoch(epoch, position, plan_start));
          },
          py::arg("epoch"), py::arg("position") = 0, py::arg("plan_start") = 0)
      .def(
          "resume",
          [](PyLoader& l, const py::dict& d) {
            reader::LoaderState s;
            s.epoch = d["epoch"].cast<uint64_t>();
            s.position = d["position"].cast<uint64_t>();
            s.seed = d["seed"].cast<uint64_t>();
            s.plan_start = d.contains("plan_start") ? d["plan_start"].cast<uint64_t>() : 0;
            s.world_size = d.contains("world_size") ? d["world_size"].cast<uint32_t>()
                                                    : l.get().options().world_size;
            s.consumed = d.contains("consumed") ? d["consumed"].cast<uint64_t>() : 0;
            Check(l.get().Resume(s));
          },
          py::arg("state"))
      .def(
          "next",
          [](PyLoader& l, uintptr_t consumer_stream) -> py::object {
            if (::getpid() != l.pid) {
              throw py::value_error("this Loader's workers live in process " +
                                    std::to_string(l.pid) +
                                    "; create the loader in the process that iterates it");
            }
            reader::Loader& loader = l.get();
            Result<reader::Batch> r = Status::Internal("unset");
            bool interrupted = false;
            {
              py::gil_scoped_release release;
              // Wake for Python's signal handlers while waiting: Ctrl-C raises
              // KeyboardInterrupt here within kWaitPollSeconds.
              r = loader.Next([&interrupted]() -> Status {
                py::gil_scoped_acquire acquire;
                if (PyErr_CheckSignals() != 0) {
                  interrupted = true;
                  return Status::Cancelled("interrupted by a signal");
                }
                return Status::OK();
              });
            }
            if (interrupted) throw py::error_already_set();
            reader::Batch b = Check(std::move(r));
            if (!b) return py::none();
            const std::vector<int64_t> batch_shape = b.shape();
            std::vector<ssize_t> shape(batch_shape.begin(), batch_shape.end());
            auto images = ViewAs(b.images(), b.dtype(), shape, b.lease());
            auto labels = View<int64_t>(const_cast<int64_t*>(b.labels()), {b.size()}, b.lease());
            auto indices =
                View<uint64_t>(const_cast<uint64_t*>(b.indices()), {b.size()}, b.lease());
            if (!l.get().on_device()) return py::make_tuple(images, labels, indices);
            // The consumer's stream waits for this batch's copy; the host does not block.
            Check(b.Wait(reinterpret_cast<void*>(consumer_stream)));
            const int device = b.device();
            const DLDataType dt = DlpackType(b.device_dtype());
            const std::vector<int64_t> device_shape = b.device_shape();
            auto dimages = ExportDlpack(
                const_cast<void*>(b.device_images()),
                std::vector<ssize_t>(device_shape.begin(), device_shape.end()),
                static_cast<DLDataTypeCode>(dt.code), dt.bits, kDLCUDA, device, b.lease());
            auto dlabels = ExportDlpack(const_cast<int64_t*>(b.device_labels()), {b.size()}, kDLInt,
                                        64, kDLCUDA, device, b.lease());
            return py::make_tuple(images, labels, indices, dimages, dlabels);
          },
          py::arg("consumer_stream") = 0)
      .def("state",
           [](const PyLoader& l) {
             reader::LoaderState s = l.get().State();
             py::dict d;
             d["epoch"] = s.epoch;
             d["position"] = s.position;
             d["seed"] = s.seed;
             d["plan_start"] = s.plan_start;
             d["consumed"] = s.consumed;
             d["world_size"] = s.world_size;
             return d;
           })
      .def("stats", [](const PyLoader& l) { return StatsDict(l.get().Stats()); })
      .def("__len__", [](const PyLoader& l) { return l.get().batches_per_epoch(); })
      .def_property_readonly("samples_per_epoch",
                             [](const PyLoader& l) { return l.get().samples_per_epoch(); })
      .def_property_readonly("out_size",
                             [](const PyLoader& l) {
                               return py::make_tuple(l.get().out_height(), l.get().out_width());
                             })
      .def_property_readonly(
          "pinned", [](const PyLoader& l) { return reader::PinKindName(l.get().pin_kind()); })
      .def_property_readonly("on_device", [](const PyLoader& l) { return l.get().on_device(); })
      .def_property_readonly("worker_pids", [](const PyLoader& l) { return l.get().worker_pids(); })
      .def_property_readonly("closed", [](const PyLoader& l) { return !l.loader; })
      .def("close", [](PyLoader& l) {
        std::unique_ptr<reader::Loader> doomed = std::move(l.loader);
        py::gil_scoped_release release;
        doomed.reset();
      });

  m.def("cuda_available", &reader::CudaAvailable);
  m.def("cuda_kernels_built", &reader::CudaKernelsBuilt);
  // The option tables (reader/options.h, converter/options.h) as the CLI and this module
  // both read them: name, flag, kind, choices, default, help.
  m.def("loader_options", [] {
    return OptionList(reader::LoaderOptionTable(), reader::LoaderOptions(),
                      {"bool", "count", "number", "choice", "list", "text"},
                      [](const reader::LoaderOption&, py::dict&) {});
  });
  m.def("pack_options", [] {
    return OptionList(
        converter::PackOptionTable(), converter::PackOptions(),
        {"bool", "count", "choice", "bytes", "text"},
        [](const converter::PackOption& o, py::dict& d) { d["recorded"] = o.recorded; });
  });
  m.def("cuda_unavailable_reason", &reader::CudaUnavailableReason);

  m.def(
      "pack",
      [](const std::string& src, const std::string& out, py::kwargs kw) {
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
            throw py::type_error("unexpected pack option '" + k + "'");
          }
        }
        Check(converter::ValidatePackOptions(o));
        o.options_json = converter::PackOptionsJson(o, list.empty() ? "folder" : "list");
        converter::PackResult result;
        Status st;
        std::string target = out;
        if (o.part_record) {
          target = converter::DefaultPartPath(out, o.part, o.parts);
          if (!parts_dir.empty()) {
            target = parts_dir + "/" + target.substr(target.find_last_of('/') + 1);
          }
        }
        {
          py::gil_scoped_release release;
          auto source = list.empty() ? converter::ScanImageFolder(src, converter::OutputPaths(out))
                                     : converter::ReadListFile(list, src);
          st = source.ok() ? converter::Pack(*source, target, o, &result) : source.status();
        }
        Check(st);
        return FromJson(converter::PackReportJson(result, src));
      },
      py::arg("src"), py::arg("out"));

  m.def(
      "verify",
      [](const std::string& path, bool decode, int workers, uint64_t max_pixels) {
        // Damage of any kind is a report with ok False; only a path that is not there or not
        // an archive at all raises.
        validate::VerifyOptions o;
        o.decode = decode;
        o.workers = workers;
        if (max_pixels) o.max_pixels = max_pixels;
        Result<validate::VerifyReport> report = Status::Internal("unset");
        {
          py::gil_scoped_release release;
          report = validate::VerifyPath(path, o);
        }
        return FromJson(Check(std::move(report)).ToJson());
      },
      py::arg("path"), py::arg("decode") = false, py::arg("workers") = 0,
      py::arg("max_pixels") = 0);

  m.def(
      "convert",
      [](const std::string& path, const std::string& out, const std::string& backend,
         bool overwrite) {
        format::Backend b;
        if (!format::ParseBackend(backend, &b))
          throw py::value_error("backend must be lmdb or hdf5");
        auto archive = Check(format::Archive::Open(path, format::IndexCheck::kFull));
        Result<uint64_t> n = Status::Internal("unset");
        {
          py::gil_scoped_release release;
          n = converter::Convert(*archive, out, b, overwrite);
        }
        return Check(std::move(n));
      },
      py::arg("path"), py::arg("out"), py::arg("backend"), py::arg("overwrite") = false);

  m.def(
      "merge",
      [](const std::vector<std::string>& parts, const std::string& out, bool overwrite) {
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
      },
      py::arg("parts"), py::arg("out"), py::arg("overwrite") = false);

  m.def(
      "stats",
      [](const std::string& path, const std::vector<std::string>& against, uint32_t size,
         int workers, int near_threshold, double dark, double bright, double uniform, double blurry,
         double extreme_aspect, uint32_t tiny) {
        validate::StatsOptions o;
        o.size = size;
        o.workers = workers;
        o.near_threshold = near_threshold;
        o.dark = dark, o.bright = bright, o.uniform = uniform, o.blurry = blurry;
        o.extreme_aspect = extreme_aspect;
        o.tiny = tiny;
        Check(validate::ValidateStatsOptions(o));
        auto archive = Check(format::Archive::Open(path, format::IndexCheck::kFull));
        std::vector<validate::OtherArchive> others;
        for (const std::string& a : against) {
          others.push_back({a, Check(format::Archive::Open(a, format::IndexCheck::kFull))});
        }
        Result<validate::StatsReport> report = Status::Internal("unset");
        {
          py::gil_scoped_release release;
          report = validate::Stats(*archive, o, others);
        }
        return FromJson(Check(std::move(report)).ToJson());
      },
      py::arg("path"), py::arg("against"), py::arg("size"), py::arg("workers"),
      py::arg("near_threshold"), py::arg("dark"), py::arg("bright"), py::arg("uniform"),
      py::arg("blurry"), py::arg("extreme_aspect"), py::arg("tiny"));

  m.def(
      "inspect",
      [](const std::string& path) {
        auto archive = Check(format::Archive::Open(path, format::IndexCheck::kFull));
        return FromJson(validate::InspectJson(*archive));
      },
      py::arg("path"));
}
