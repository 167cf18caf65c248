// shardfeed._native.Archive: an opened archive; samples decoded as a reader sees them, every
// field of the schema as Python values (sample()).
#include <unistd.h>

#include <cstring>

#include "common.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/format/fields.h"
#include "shardfeed/imaging/image.h"
#include "shardfeed/validate/inspect.h"

namespace shardfeed_py {
namespace {

using namespace shardfeed;

struct PyArchive {
  std::shared_ptr<format::Archive> archive;
  pid_t pid = 0;
};

uint64_t CheckedIndex(const PyArchive& a, int64_t i) {
  const int64_t n = static_cast<int64_t>(a.archive->size());
  if (i < 0) i += n;
  if (i < 0 || i >= n) throw py::index_error("sample index out of range");
  return static_cast<uint64_t>(i);
}

// A remote archive's shard not yet open is downloaded first, with Ctrl-C live (KeyboardInterrupt
// within about a second; the shard is tried again at the next access). Its other failures are
// left to the read that follows, which reports them. A shard whose open failed is left to that
// read too: it answers with the kept error, or tries again on the archive's own schedule.
void FetchInterruptibly(const PyArchive& a, uint64_t i) {
  if (!a.archive->remote() || i >= a.archive->size()) return;
  const size_t s = a.archive->ShardOf(i);
  if (a.archive->ShardOpen(s) || a.archive->ShardFailed(s)) return;
  RunInterruptible([&](const CancelToken& cancel) { (void)a.archive->OpenShardNow(s, &cancel); });
}

// (image, label): the sample decoded to an upright HWC uint8 RGB array by the same function
// extract and inspect use (checksum checked, pixel limit before any allocation).
py::tuple GetItem(const PyArchive& a, int64_t index) {
  const uint64_t i = CheckedIndex(a, index);
  FetchInterruptibly(a, i);
  auto image = std::make_shared<imaging::Image>();
  Status s;
  {
    py::gil_scoped_release release;
    s = validate::DecodeSample(*a.archive, i, image.get());
    // A shard truncated under the mapping read as zeros: that, not the image, is the reason.
    if (!s.ok()) {
      if (Status changed = a.archive->CheckUnchanged(i); !changed.ok()) s = changed;
    }
  }
  Check(s);
  auto arr = View<uint8_t>(image->pixels.data(), {image->height, image->width, 3}, image);
  if (a.archive->schema().label_field() < 0) return py::make_tuple(arr, py::none());
  return py::make_tuple(arr, a.archive->Label(i));
}

// cache_dir= and cache_limit= through storage::CacheOptionTable (None: the default). Ctrl-C
// while a remote archive downloads raises KeyboardInterrupt (RunInterruptible).
PyArchive Open(const std::string& path, const std::string& check, const py::object& cache_dir,
               const py::object& cache_limit) {
  format::OpenOptions options;
  options.cache = CacheFrom(cache_dir, cache_limit);
  format::IndexCheck& c = options.check;
  if (check == "full") {
    c = format::IndexCheck::kFull;
  } else if (check == "lazy") {
    c = format::IndexCheck::kLazy;
  } else if (check != "auto") {
    throw py::value_error("index_check must be 'auto', 'full' or 'lazy'");
  }
  Result<std::shared_ptr<format::Archive>> opened = Status::Internal("unset");
  RunInterruptible([&](const CancelToken& cancel) {  // a remote archive downloads its shards
    options.cancel = &cancel;
    opened = format::Archive::Open(path, options);
  });
  PyArchive a;
  a.archive = Check(std::move(opened));
  a.pid = ::getpid();
  return a;
}

// Archive::At(i) without the GIL: it opens the sample's shard on first use, which for a remote
// archive is a download (seconds, or a wait for another process's); other Python threads run.
format::RecordView At(const PyArchive& a, uint64_t i) {
  FetchInterruptibly(a, i);
  Result<format::RecordView> r = Status::Internal("unset");
  {
    py::gil_scoped_release release;
    r = a.archive->At(i);
  }
  return Check(std::move(r));
}

// Every sample's class id; None when the samples have no class field (an index entry's label is
// then 0 for every sample, which is no class).
py::object Labels(const PyArchive& a) {
  if (a.archive->schema().label_field() < 0) return py::none();
  const uint64_t n = a.archive->size();
  py::array_t<int64_t> out(static_cast<ssize_t>(n));
  int64_t* p = out.mutable_data();  // owned by `out`, which this call holds
  Status s;
  {
    py::gil_scoped_release release;  // every shard is opened: downloads, for a remote archive
    for (uint64_t i = 0; i < n && s.ok(); ++i) {
      Result<format::RecordView> r = a.archive->At(i);
      if (r.ok()) {
        p[i] = r->entry->label;
      } else {
        s = r.status();
      }
    }
  }
  Check(s);
  return out;
}

// The stored payload, zero-copy: a read-only array over the mapping.
py::array_t<uint8_t> Record(const PyArchive& a, uint64_t i) {
  if (i >= a.archive->size()) throw py::index_error("sample index out of range");
  const format::RecordView r = At(a, i);
  auto arr = View<uint8_t>(const_cast<uint8_t*>(r.data), {static_cast<ssize_t>(r.size)}, a.archive);
  py::detail::array_proxy(arr.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return arr;
}

py::dtype DtypeOf(format::ElemType t) { return py::dtype(std::string(format::ElemName(t))); }

// An array over a field view: zero-copy and read-only over the mapping (kept alive by the
// archive) when the view is aligned for its element type, else a copy.
py::array ArrayOf(const PyArchive& a, const format::FieldSpec& spec, const format::FieldView& v,
                  std::vector<ssize_t> shape) {
  const py::dtype dt = DtypeOf(spec.elem);
  if (!v.aligned) {
    py::array out(dt, shape);
    std::memcpy(out.mutable_data(), v.data, v.size);
    return out;
  }
  py::array arr = ViewOf(dt, const_cast<uint8_t*>(v.data), shape, a.archive);
  py::detail::array_proxy(arr.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return arr;
}

// One stored field of sample i as a Python value (the image and the class field aside), checked
// as the writers check values (format::CheckStoredValue: text that is not UTF-8 or JSON past its
// depth would otherwise surface as a raw UnicodeDecodeError or RecursionError). `entry` gives the
// stored shape and orientation masks and boxes turn with; `box_rows` the rows of a per field's
// boxes (-1: none). Damage is a DataError naming the archive, the sample and the field.
py::object FieldObject(const PyArchive& a, uint64_t i, const format::FieldSpec& spec,
                       const format::FieldView& v, const format::IndexEntry& entry,
                       int64_t box_rows) {
  auto damage = [&](const Status& s) {
    return Status::Corrupt(a.archive->path(), ": sample ", i, ": ", s.message());
  };
  if (Status s = format::CheckStoredValue(spec, v, entry.height, entry.width, box_rows); !s.ok()) {
    Check(damage(s));
  }
  using format::FieldKind;
  const char* text = reinterpret_cast<const char*>(v.data);
  switch (spec.kind) {
    case FieldKind::kStr:
      return py::str(text, v.size);
    case FieldKind::kBytes:
      return py::bytes(text, v.size);
    case FieldKind::kJson:
      return FromJson(std::string(text, v.size));
    case FieldKind::kInt64: {
      int64_t x;
      std::memcpy(&x, v.data, sizeof x);
      return py::int_(x);
    }
    case FieldKind::kFloat32: {  // a numpy float32: the stored value with its stored type
      float x;
      std::memcpy(&x, v.data, sizeof x);
      return py::module_::import("numpy").attr("float32")(x);
    }
    case FieldKind::kFloat64: {
      double x;
      std::memcpy(&x, v.data, sizeof x);
      return py::float_(x);
    }
    case FieldKind::kMask: {
      imaging::Image mask;
      mask.Resize(v.dims[1], v.dims[0], 1);
      if (Status s = format::DecodeMask(v, mask.pixels.data()); !s.ok()) {
        Check(damage(Status::Corrupt("field '", spec.name, "': ", s.message())));
      }
      imaging::ApplyOrientation(&mask, entry.orientation);
      py::array_t<uint8_t> out({ssize_t(mask.height), ssize_t(mask.width)});
      std::memcpy(out.mutable_data(), mask.pixels.data(), mask.pixels.size());
      return out;
    }
    case FieldKind::kBoxes: {
      const ssize_t n = v.dims[0];
      if (entry.orientation <= 1) return ArrayOf(a, spec, v, {n, 4});
      py::array_t<float> out({n, ssize_t{4}});
      std::memcpy(out.mutable_data(), v.data, v.size);
      imaging::OrientBoxes(out.mutable_data(), n, entry.width, entry.height, entry.orientation);
      return out;
    }
    default: {  // arrays: the view's dims (variable) or the type's (fixed)
      std::vector<ssize_t> shape;
      for (uint32_t d = 0; d < v.ndim; ++d) shape.push_back(v.dims[d]);
      if (v.ndim == 0) shape.assign(spec.dims.begin(), spec.dims.end());
      return ArrayOf(a, spec, v, shape);
    }
  }
}

// Every field of sample `index`, in schema order: the image decoded upright (as GetItem), the
// class field from the index, the rest from Archive::Field with checksums checked.
py::dict Sample(const PyArchive& a, int64_t index) {
  const uint64_t i = CheckedIndex(a, index);
  const format::Schema& schema = a.archive->schema();
  const format::RecordView r = At(a, i);
  py::dict out;
  std::vector<int64_t> rows(schema.size(), -1);  // of each boxes field, for the fields per them
  for (size_t f = 0; f < schema.size(); ++f) {
    const format::FieldSpec& spec = schema.fields()[f];
    if (static_cast<int>(f) == schema.image_field()) {
      out[spec.name.c_str()] = GetItem(a, index)[0];
    } else if (static_cast<int>(f) == schema.label_field()) {
      out[spec.name.c_str()] = py::int_(r.entry->label);
    } else {
      Result<format::FieldView> v = Status::Internal("unset");
      {
        py::gil_scoped_release release;
        v = a.archive->Field(i, f, /*verify=*/true);
        if (!v.ok()) {
          if (Status changed = a.archive->CheckUnchanged(i); !changed.ok()) v = changed;
        }
      }
      const format::FieldView view = Check(std::move(v));
      if (spec.kind == format::FieldKind::kBoxes) rows[f] = view.dims[0];
      const int64_t box_rows = spec.per.empty() ? -1 : rows[schema.Find(spec.per)];
      out[spec.name.c_str()] = FieldObject(a, i, spec, view, *r.entry, box_rows);
    }
  }
  return out;
}

// {name: type} in schema order; a per-box field as {"type", "per"}.
py::dict SchemaDict(const PyArchive& a) {
  py::dict out;
  for (const format::FieldSpec& spec : a.archive->schema().fields()) {
    if (spec.per.empty()) {
      out[spec.name.c_str()] = spec.TypeName();
    } else {
      py::dict d;
      d["type"] = spec.TypeName();
      d["per"] = spec.per;
      out[spec.name.c_str()] = d;
    }
  }
  return out;
}

py::object Shape(const PyArchive& a) {
  const auto& mf = a.archive->manifest();
  if (!mf.height) return py::none();
  return py::make_tuple(mf.height, mf.width, mf.channels);
}

}  // namespace

// The loader binding takes the archive's shared_ptr from here.
std::shared_ptr<format::Archive> ArchiveOf(const py::handle& archive) {
  return archive.cast<const PyArchive&>().archive;
}

void BindArchive(py::module_& m) {
  py::class_<PyArchive>(m, "Archive")
      .def(py::init(&Open), py::arg("path"), py::arg("index_check") = "auto",
           py::arg("cache_dir") = py::none(), py::arg("cache_limit") = py::none())
      .def_property_readonly("lazy", [](const PyArchive& a) { return a.archive->lazy(); })
      .def("__len__", [](const PyArchive& a) { return a.archive->size(); })
      .def("__getitem__", &GetItem)
      .def("sample", &Sample)
      .def_property_readonly("schema", &SchemaDict)
      .def_property_readonly("path", [](const PyArchive& a) { return a.archive->path(); })
      .def_property_readonly("class_names",
                             [](const PyArchive& a) { return a.archive->manifest().class_names; })
      .def_property_readonly(
          "encoding",
          [](const PyArchive& a) {
            return std::string(format::EncodingName(a.archive->manifest().encoding));
          })
      .def_property_readonly("shape", &Shape)
      .def_property_readonly("opened_in_pid", [](const PyArchive& a) { return a.pid; })
      .def("label",
           [](const PyArchive& a, uint64_t i) -> py::object {
             if (i >= a.archive->size()) throw py::index_error("sample index out of range");
             if (a.archive->schema().label_field() < 0) return py::none();
             return py::int_(At(a, i).entry->label);
           })
      .def("labels", &Labels)
      .def("record", &Record);
}

}  // namespace shardfeed_py
