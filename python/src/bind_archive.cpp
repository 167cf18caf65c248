// shardfeed._native.Archive: an opened archive; samples decoded as a reader sees them.
#include <unistd.h>

#include "common.h"
#include "shardfeed/format/archive.h"
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

// (image, label): the sample decoded to an upright HWC uint8 RGB array by the same function
// extract and inspect use (checksum checked, pixel limit before any allocation).
py::tuple GetItem(const PyArchive& a, int64_t index) {
  const uint64_t i = CheckedIndex(a, index);
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
  return py::make_tuple(arr, a.archive->Label(i));
}

PyArchive Open(const std::string& path, const std::string& check) {
  format::IndexCheck c = format::IndexCheck::kAuto;
  if (check == "full") {
    c = format::IndexCheck::kFull;
  } else if (check == "lazy") {
    c = format::IndexCheck::kLazy;
  } else if (check != "auto") {
    throw py::value_error("index_check must be 'auto', 'full' or 'lazy'");
  }
  PyArchive a;
  a.archive = Check(format::Archive::Open(path, c));
  a.pid = ::getpid();
  return a;
}

py::array_t<int64_t> Labels(const PyArchive& a) {
  py::array_t<int64_t> out(static_cast<ssize_t>(a.archive->size()));
  auto* p = out.mutable_data();
  for (uint64_t i = 0; i < a.archive->size(); ++i) p[i] = Check(a.archive->At(i)).entry->label;
  return out;
}

// The stored payload, zero-copy: a read-only array over the mapping.
py::array_t<uint8_t> Record(const PyArchive& a, uint64_t i) {
  if (i >= a.archive->size()) throw py::index_error("sample index out of range");
  const format::RecordView r = Check(a.archive->At(i));
  auto arr = View<uint8_t>(const_cast<uint8_t*>(r.data), {static_cast<ssize_t>(r.size)}, a.archive);
  py::detail::array_proxy(arr.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return arr;
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
      .def(py::init(&Open), py::arg("path"), py::arg("index_check") = "auto")
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
      .def_property_readonly("shape", &Shape)
      .def_property_readonly("opened_in_pid", [](const PyArchive& a) { return a.pid; })
      .def("label",
           [](const PyArchive& a, uint64_t i) {
             if (i >= a.archive->size()) throw py::index_error("sample index out of range");
             return Check(a.archive->At(i)).entry->label;
           })
      .def("labels", &Labels)
      .def("record", &Record);
}

}  // namespace shardfeed_py
