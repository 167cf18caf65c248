// shardfeed._native.Loader: the C++ loader as python/shardfeed/__init__.py drives it.
//
// Zero-copy: a batch's images reach Python as a numpy array pointing into the loader's ring
// slot; its base object holds the slot's lease, so the slot returns to the ring only when the
// last array (or a torch tensor made from it) is gone. Labels and indices are copied (a few
// bytes) so that keeping them holds no slot. Fields (LoaderOptions::fields) come through a
// BatchFields object, built into arrays only when asked for (shardfeed.Batch["name"]): numpy
// views of the batch (stacked, or each sample's slice of a ragged field's values), holding the
// lease like the images; str and json as Python lists.
#include <unistd.h>

#include <atomic>
#include <memory>
#include <optional>

#include "common.h"
#include "dlpack_export.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/reader/loader.h"
#include "shardfeed/reader/options.h"
#include "shardfeed/storage/remote.h"

namespace shardfeed_py {
namespace {

using namespace shardfeed;

// Appended to a damaged sample's error from the loader (issue 20 item 11).
constexpr const char* kSkipErrorsHint =
    " (skip_errors=True trains on: bad samples become zero images labelled -1, to be ignored "
    "with F.cross_entropy(..., ignore_index=-1))";

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

reader::LoaderOptions ParseLoaderOptions(const py::dict& kw) {
  reader::LoaderOptions o;
  for (auto item : kw) {
    const std::string name = py::str(item.first);
    const reader::LoaderOption* option = reader::FindLoaderOption(name);
    if (!option || name.find('-') != std::string::npos) {  // as Python: an unknown keyword
      throw py::type_error(reader::LoaderOptionTable().Unknown(name).message());
    }
    Check(option->set(&o, OptionText(item.second)));
  }
  Check(reader::ValidateLoaderOptions(o));
  return o;
}

// A batch's fields, as shardfeed.Batch reads them.
struct PyBatchFields {
  reader::Batch batch;
  bool offsets = false;    // LoaderOptions::ragged == kOffsets
  bool has_label = false;  // the schema has a class field

  std::vector<std::string> Names() const {
    std::vector<std::string> out;
    for (const auto& f : batch.fields()) out.emplace_back(f.name);
    return out;
  }

  py::object Get(const std::string& name) const {
    const reader::BatchField* f = batch.field(name);
    if (!f) throw py::key_error(name);
    using format::FieldKind;
    const py::dtype dtype(std::string(format::ElemName(f->elem)));
    py::capsule keep = Keeper(batch.lease());
    auto view = [&](const uint8_t* data, std::vector<ssize_t> shape) {
      return py::array(dtype, std::move(shape), data, keep);
    };
    if (!f->ragged()) return view(f->data, std::vector<ssize_t>(f->shape.begin(), f->shape.end()));
    const size_t n = batch.size();
    const bool text = f->kind == FieldKind::kStr || f->kind == FieldKind::kJson;
    if (text || f->kind == FieldKind::kBytes) {
      py::list out;
      for (size_t i = 0; i < n; ++i) {
        const char* p = reinterpret_cast<const char*>(f->data) + f->offsets[i];
        const size_t len = static_cast<size_t>(f->offsets[i + 1] - f->offsets[i]);
        if (f->kind == FieldKind::kBytes) {
          out.append(py::bytes(p, len));
        } else if (f->kind == FieldKind::kStr) {
          out.append(py::str(p, len));
        } else if (len == 0) {
          out.append(py::none());
        } else {
          // The workers check json values' UTF-8 and depth, not their syntax (a parse costs
          // 10x a small record's read): a value crafted past its checksum fails here, named.
          try {
            out.append(FromJson(std::string(p, len)));
          } catch (py::error_already_set& e) {
            if (!e.matches(PyExc_ValueError)) throw;
            Check(Status::Corrupt("sample ", batch.indices()[i], ": field '", f->name,
                                  "' (json): not valid JSON (", e.what(), ")"));
          }
        }
      }
      return out;
    }
    // Bytes of one entry of the values' first axis.
    size_t unit = format::ElemSize(f->elem);
    for (size_t d = 1; d < f->shape.size(); ++d) unit *= static_cast<size_t>(f->shape[d]);
    if (offsets) {
      auto values = view(f->data, std::vector<ssize_t>(f->shape.begin(), f->shape.end()));
      py::array_t<int64_t> offs({static_cast<ssize_t>(n + 1)}, f->offsets, keep);
      return py::make_tuple(values, offs);
    }
    py::list out;
    for (size_t i = 0; i < n; ++i) {
      std::vector<ssize_t> shape(f->dims + i * f->ndim, f->dims + (i + 1) * f->ndim);
      out.append(view(f->data + f->offsets[i] * unit, std::move(shape)));
    }
    return out;
  }
};

// Ownership: the Python object owns the native loader through `loader`; a next() in flight
// holds a reference of its own, so close() from another thread never frees what a waiting
// next() uses: it sets `closing`, which ends that wait within kWaitPollSeconds (the waiting
// thread then frees the loader, without the GIL). One consumer: a second thread calling next()
// while one is inside raises RuntimeError (the native Next() has one consumer: two would wait
// for the same batch). Fields other than `closing` are touched with the GIL held.
struct PyLoader {
  std::shared_ptr<reader::Loader> loader;
  std::shared_ptr<std::atomic<bool>> closing = std::make_shared<std::atomic<bool>>(false);
  pid_t pid = 0;
  bool has_label = true;
  bool in_next = false;
  // The last batch next() returned until Python marks it handed out (`held = None`): a
  // KeyboardInterrupt raised after next() returned, before the batch reached the loop, leaves it
  // here, and the next next() returns it again, made afresh (state() counts it as not
  // delivered).
  std::optional<reader::Batch> held;
  PyLoader() = default;
  PyLoader(PyLoader&&) = default;
  PyLoader& operator=(PyLoader&&) = default;
  // Dropped without close() (del loader, garbage collection): the workers stop without the GIL,
  // so other Python threads run meanwhile (a worker stuck in a decode takes its grace period).
  ~PyLoader() {
#if PY_VERSION_HEX >= 0x030D0000
    const bool finalizing = Py_IsFinalizing();
#else
    const bool finalizing = _Py_IsFinalizing();
#endif
    if (loader && Py_IsInitialized() && !finalizing && PyGILState_Check()) {
      std::shared_ptr<reader::Loader> doomed = std::move(loader);
      py::gil_scoped_release release;
      doomed.reset();
    }
  }
  // The native loader, or a clear error once close() ran.
  reader::Loader& get() const {
    if (!loader) RaiseError("this Loader is closed");
    return *loader;
  }
};

PyLoader Create(const py::handle& archive, const py::kwargs& kw) {
  reader::LoaderOptions o = ParseLoaderOptions(kw);
  std::shared_ptr<format::Archive> a = ArchiveOf(archive);
  Result<std::unique_ptr<reader::Loader>> r = Status::Internal("unset");
  if (a->remote() && !o.device) {
    // A remote archive's start-up reads (its manifest again, for the loader's own copy): Ctrl-C
    // raises KeyboardInterrupt. (With device copies Create stays on this thread, whose current
    // CUDA device it takes.)
    RunInterruptible([&](const CancelToken& cancel) { r = reader::Loader::Create(a, o, &cancel); });
  } else {
    py::gil_scoped_release release;
    r = reader::Loader::Create(a, o);
  }
  PyLoader l;
  l.loader = Check(std::move(r));
  l.pid = ::getpid();
  l.has_label = a->schema().label_field() >= 0;
  return l;
}

// The loader's next batch, waiting with Python's signal handlers live (Ctrl-C raises
// KeyboardInterrupt within kWaitPollSeconds). None at the end of the epoch.
Result<reader::Batch> WaitForBatch(reader::Loader& loader, const std::atomic<bool>& closing) {
  Result<reader::Batch> r = Status::Internal("unset");
  bool interrupted = false;
  {
    py::gil_scoped_release release;
    r = loader.Next([&interrupted, &closing]() -> Status {
      if (closing.load(std::memory_order_acquire)) {
        return Status::Cancelled("this Loader was closed while next() waited");
      }
      py::gil_scoped_acquire acquire;
      if (PyErr_CheckSignals() != 0) {
        interrupted = true;
        return Status::Cancelled("interrupted by a signal");
      }
      return Status::OK();
    });
  }
  if (interrupted) throw py::error_already_set();
  // Not where a remote shard's download is not the object the manifest lists (the archive may
  // have been packed again since it was opened): training on would not help. Told by that
  // message's own text, never by a word a path may hold. (A file changed on disk is kChanged,
  // which skip_errors does not skip, and gets no hint.)
  const bool changed = r.status().message().find(storage::kNotTheListedObject) != std::string::npos;
  if (!r.ok() && !changed &&
      (r.status().code() == StatusCode::kCorrupt ||
       r.status().code() == StatusCode::kChecksumMismatch)) {
    Raise(Status(r.status().code(), r.status().message() + kSkipErrorsHint));
  }
  return r;
}

// (images, labels, indices), plus (device images, device labels) as DLPack capsules with
// `device`, ordered after the batch's copy on `consumer_stream`; None at the end of the epoch.
py::object BatchTuple(const PyLoader& l, const reader::Loader& loader, const reader::Batch& b,
                      uintptr_t consumer_stream);

// LoaderBusy (a RuntimeError): next() from a second thread while another is inside it. Python's
// pass leaves the first thread's iteration as it was (it ends a pass on any other error).
PyObject* g_busy = nullptr;

// `again`: the caller may take the held batch (a pass's first call, or one after its previous
// call raised); otherwise a held batch is another thread's, not yet handed out.
py::object Next(PyLoader& l, uintptr_t consumer_stream, bool again) {
  if (::getpid() != l.pid) {
    throw py::value_error("this Loader's workers live in process " + std::to_string(l.pid) +
                          "; create the loader in the process that iterates it");
  }
  reader::Loader& loader = l.get();  // a closed loader raises
  if (l.held && again) return BatchTuple(l, loader, *l.held, consumer_stream);  // first
  if (l.in_next || l.held) {
    PyErr_SetString(g_busy,
                    "another thread is inside next() of this Loader: one thread iterates a Loader "
                    "(give each thread a Loader of its own, or hand batches over with a queue)");
    throw py::error_already_set();
  }
  // While it waits: in_next set, and a reference of its own (close() meanwhile frees nothing
  // it uses). On the way out, however it leaves: in_next cleared, and, if another thread closed
  // the loader meanwhile, that reference (maybe the last) dropped without the GIL.
  struct Waiting {
    PyLoader& l;
    std::shared_ptr<reader::Loader> keep;
    std::shared_ptr<std::atomic<bool>> closing;
    ~Waiting() {
      l.in_next = false;
      if (!closing->load()) return;
      py::gil_scoped_release release;
      keep.reset();
    }
  } waiting{l, l.loader, l.closing};
  l.in_next = true;
  Result<reader::Batch> got = WaitForBatch(*waiting.keep, *waiting.closing);
  if (!got.ok() && waiting.closing->load()) {
    RaiseError("this Loader was closed while next() waited");
  }
  reader::Batch b = Check(std::move(got));
  if (!b) return py::none();
  if (!l.loader) RaiseError("this Loader was closed while next() waited");
  l.held = b;
  try {
    return BatchTuple(l, *l.loader, b, consumer_stream);
  } catch (...) {
    l.held.reset();  // a batch that cannot be handed out is not offered again
    throw;
  }
}

// (images, labels, indices, fields), or with `device` (images, labels, indices, device images,
// device labels, fields), for a batch the loader delivered.
py::object BatchTuple(const PyLoader& l, const reader::Loader& loader, const reader::Batch& b,
                      uintptr_t consumer_stream) {
  const std::vector<int64_t> batch_shape = b.shape();
  auto images = ViewOf(NumpyDType(b.dtype()), b.images(),
                       std::vector<ssize_t>(batch_shape.begin(), batch_shape.end()), b.lease());
  py::array_t<int64_t> labels(static_cast<ssize_t>(b.size()), b.labels());
  py::array_t<uint64_t> indices(static_cast<ssize_t>(b.size()), b.indices());
  // None when there is nothing beyond images and labels (no object, no extra lease per batch).
  py::object fields = py::none();
  if (!b.fields().empty() || !l.has_label) {
    fields = py::cast(PyBatchFields{
        b, loader.options().ragged == reader::LoaderOptions::Ragged::kOffsets, l.has_label});
  }
  if (!loader.on_device()) return py::make_tuple(images, labels, indices, fields);
  // The consumer's stream waits for this batch's copy; the host does not block.
  Check(b.Wait(reinterpret_cast<void*>(consumer_stream)));
  const int device = b.device();
  const DLDataType dt = DlpackType(b.device_dtype());
  const std::vector<int64_t> device_shape = b.device_shape();
  auto dimages =
      ExportDlpack(const_cast<void*>(b.device_images()),
                   std::vector<ssize_t>(device_shape.begin(), device_shape.end()),
                   static_cast<DLDataTypeCode>(dt.code), dt.bits, kDLCUDA, device, b.lease());
  auto dlabels = ExportDlpack(const_cast<int64_t*>(b.device_labels()), {b.size()}, kDLInt, 64,
                              kDLCUDA, device, b.lease());
  return py::make_tuple(images, labels, indices, dimages, dlabels, fields);
}

void Resume(PyLoader& l, const py::dict& d) {
  l.held.reset();  // another position: the held batch is not the next one
  reader::LoaderState s;
  s.epoch = d["epoch"].cast<uint64_t>();
  s.position = d["position"].cast<uint64_t>();
  s.seed = d["seed"].cast<uint64_t>();
  s.plan_start = d.contains("plan_start") ? d["plan_start"].cast<uint64_t>() : 0;
  s.world_size =
      d.contains("world_size") ? d["world_size"].cast<uint32_t>() : l.get().options().world_size;
  s.consumed = d.contains("consumed") ? d["consumed"].cast<uint64_t>() : 0;
  Check(l.get().Resume(s));
}

py::dict StateDict(const PyLoader& l) {
  reader::LoaderState s = l.get().State(l.held ? 1 : 0);
  py::dict d;
  d["epoch"] = s.epoch;
  d["position"] = s.position;
  d["seed"] = s.seed;
  d["plan_start"] = s.plan_start;
  d["consumed"] = s.consumed;
  d["world_size"] = s.world_size;
  return d;
}

py::dict StatsDict(const PyLoader& l) {
  const reader::EpochStats s = l.get().Stats();
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
  d["kept_slots"] = s.kept_slots;  // slots beyond the ring for batches the consumer kept
  // Remote archives (EpochStats): the process's shard downloads this epoch, and worker time
  // spent waiting for them.
  d["bytes_fetched"] = s.bytes_fetched;
  d["cache_hits"] = s.cache_hits;
  d["cache_misses"] = s.cache_misses;
  d["fetch_wait_seconds"] = s.fetch_wait_seconds;
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

void BindLoader(py::module_& m) {
  static py::exception<std::runtime_error> busy(m, "LoaderBusy", PyExc_RuntimeError);
  g_busy = busy.ptr();
  py::class_<PyBatchFields>(m, "BatchFields")
      .def("names", &PyBatchFields::Names)
      .def("get", &PyBatchFields::Get, py::arg("name"))
      .def_readonly("has_label", &PyBatchFields::has_label)
      .def_readonly("offsets", &PyBatchFields::offsets);
  py::class_<PyLoader>(m, "Loader")
      .def(py::init(&Create), py::arg("archive"))
      .def(
          "start_epoch",
          [](PyLoader& l, uint64_t epoch, uint64_t position, uint64_t plan_start) {
            l.held.reset();
            Check(l.get().StartEpoch(epoch, position, plan_start));
          },
          py::arg("epoch"), py::arg("position") = 0, py::arg("plan_start") = 0)
      .def("resume", &Resume, py::arg("state"))
      .def("next", &Next, py::arg("consumer_stream") = 0, py::arg("again") = false)
      .def("state", &StateDict)
      .def("stats", &StatsDict)
      .def("__len__", [](const PyLoader& l) { return l.get().batches_per_epoch(); })
      .def_property_readonly("batch_size",
                             [](const PyLoader& l) { return l.get().options().batch_size; })
      .def_property_readonly("drop_last",
                             [](const PyLoader& l) { return l.get().options().drop_last; })
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
      .def_property(
          "held", [](const PyLoader& l) { return l.held.has_value(); },
          [](PyLoader& l, const py::object& v) {
            if (!v.is_none()) throw py::value_error("held is only ever set to None (handed out)");
            l.held.reset();
          })
      .def("close", [](PyLoader& l) {
        // A next() in flight in another thread holds its own reference and sees `closing`.
        l.closing->store(true, std::memory_order_release);
        l.held.reset();
        std::shared_ptr<reader::Loader> doomed = std::move(l.loader);
        py::gil_scoped_release release;
        doomed.reset();
      });
}

}  // namespace shardfeed_py
