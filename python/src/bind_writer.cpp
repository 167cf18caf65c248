// shardfeed._native.Writer: converter::SampleWriter (the streaming pack pipeline every importer
// uses) as Python sees it. The Python side (python/shardfeed/writer.py) turns each sample dict
// into one value per schema field already of the field's type (bytes, numbers, C-contiguous numpy
// arrays of the field's dtype); this file copies them into the sample the writer owns and queues
// it. Errors are the writer's (ValueError naming the sample and the field for a bad value).
#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "common.h"
#include "shardfeed/converter/importers.h"
#include "shardfeed/converter/options.h"
#include "shardfeed/converter/pack.h"
#include "shardfeed/converter/sample_writer.h"
#include "shardfeed/format/fields.h"

namespace shardfeed_py {
namespace {

using namespace shardfeed;

// Pack options that do not apply to a writer (it writes samples in write() order, one archive).
bool PackOnly(const std::string& name) {
  return name == "shuffle" || name == "seed" || name == "part";
}

class PyWriter {
  // Marks a call in progress. The native writer is used by one thread; calls that release the
  // GIL would otherwise let a second Python thread into it. Checked and set under the GIL.
  class Busy {
   public:
    explicit Busy(bool* busy) : busy_(busy) {
      if (*busy_) {
        throw std::runtime_error(
            "shardfeed.Writer used from two threads at once: one thread writes (and closes)");
      }
      *busy_ = true;
    }
    ~Busy() { *busy_ = false; }

   private:
    bool* busy_;
  };

 public:
  PyWriter(const std::string& out, const std::string& schema_json,
           std::optional<std::vector<std::string>> class_names, bool skip_bad, const py::kwargs& kw)
      : out_(out), class_names_(std::move(class_names)) {
    converter::PackOptions o;
    for (auto item : kw) {
      const std::string k = py::str(item.first);
      if (PackOnly(k)) {
        throw py::type_error("option '" + k +
                             "' is pack's: a Writer stores samples in the "
                             "order write() is called (shuffle the iterable instead)");
      }
      const converter::PackOption* option = converter::FindPackOption(k);
      if (!option || k.find('-') != std::string::npos) {
        throw py::type_error(converter::PackOptionTable().Unknown(k).message());
      }
      Check(option->set(&o, OptionText(item.second)));
    }
    o.skip_bad = skip_bad;
    skip_bad_ = skip_bad;
    Check(converter::ValidatePackOptions(o));
    o.writer.schema = Check(format::Schema::FromJson(schema_json));
    o.options_json = converter::PackOptionsJson(o, "python");
    schema_ = o.writer.schema;
    options_json_ = o.options_json;
    Result<std::unique_ptr<converter::SampleWriter>> w = Status::Internal("unset");
    {
      py::gil_scoped_release release;
      w = converter::SampleWriter::Create(out, o);
    }
    writer_ = Check(std::move(w));
  }

  // Queues sample `number`: `image` is a str (a file a worker reads), a uint8 [H, W, 3]
  // C-contiguous array (pixels) or any bytes-like object (an encoded image file); `values` one
  // entry per schema field (the image's and the class field's are not read).
  void Write(uint64_t number, const py::handle& image, int64_t label, const py::list& values) {
    Busy busy(&busy_);
    if (!writer_) throw py::value_error("this Writer is closed");
    converter::Sample s;
    s.name = "sample " + std::to_string(number);
    s.label = label;
    if (py::isinstance<py::str>(image)) {
      s.image_file = image.cast<std::string>();
      s.name += " (" + s.image_file + ")";  // errors and the skip list name the file too
    } else if (py::isinstance<py::array>(image)) {
      auto a = py::reinterpret_borrow<py::array>(image);
      if (a.ndim() != 3 || a.shape(2) != 3 || !py::isinstance<py::array_t<uint8_t>>(a) ||
          !(a.flags() & py::array::c_style) || a.shape(0) < 1 || a.shape(1) < 1 ||
          a.shape(0) > 65535 || a.shape(1) > 65535) {
        throw py::value_error(s.name + ": field '" + ImageName() +
                              "': pixels must be a uint8 array of shape (H, W, 3), H and W in "
                              "1..65535");
      }
      s.height = static_cast<uint32_t>(a.shape(0));
      s.width = static_cast<uint32_t>(a.shape(1));
      const auto* p = static_cast<const uint8_t*>(a.data());
      s.image.assign(p, p + a.nbytes());
    } else {
      py::buffer_info b = py::reinterpret_borrow<py::buffer>(image).request();
      const auto* p = static_cast<const uint8_t*>(b.ptr);
      s.image.assign(p, p + b.size * b.itemsize);
    }
    const auto& fields = schema_.fields();
    if (values.size() != fields.size()) throw py::value_error("one value per schema field");
    s.values.resize(fields.size());
    for (size_t f = 0; f < fields.size(); ++f) {
      if (static_cast<int>(f) == schema_.image_field() ||
          static_cast<int>(f) == schema_.label_field()) {
        continue;
      }
      s.values[f] = ValueOf(fields[f], values[f]);
      // Boxes now, not in the worker: a NaN or inverted box failed a later write() or close(),
      // which the docs promise of a mask's shape only (skip_bad: the worker skips and lists it).
      if (fields[f].kind == format::FieldKind::kBoxes && !skip_bad_) {
        const Status boxes = format::CheckValue(fields[f], s.values[f].view(), 0, 0, -1);
        if (!boxes.ok()) throw py::value_error(s.name + ": " + boxes.message());
      }
    }
    Status st;
    {
      py::gil_scoped_release release;  // blocks while the window of samples in flight is full
      st = writer_->Write(std::move(s));
    }
    Check(st);
  }

  // Writes the rest, the manifest, and renames the archive into place; the report dict.
  py::object Finish() {
    Busy busy(&busy_);
    if (!writer_) throw py::value_error("this Writer is closed");
    format::Manifest m;
    if (schema_.label_field() >= 0 && class_names_) m.class_names = *class_names_;
    m.options_json = options_json_;
    Status st;
    {
      py::gil_scoped_release release;
      // Without class_names: "0".."the largest label packed" (a skipped sample's named none).
      st = writer_->Finish(std::move(m), false, !class_names_.has_value());
    }
    result_ = writer_->result();
    writer_.reset();
    Check(st);
    return FromJson(converter::PackReportJson(result_, "python"));
  }

  // Drops everything (the partial output is removed; `out` stays as it was).
  void Abort() {
    Busy busy(&busy_);
    if (!writer_) return;
    result_ = writer_->result();
    py::gil_scoped_release release;
    writer_.reset();
  }

  // [(sample number, reason)] the writer skipped (bad images; bad values with skip_bad).
  py::list Skipped() {
    Busy busy(&busy_);
    const converter::PackResult& r = writer_ ? writer_->result() : result_;
    py::list out;
    for (const converter::SkippedFile& f : r.skipped) {
      // Our names: "sample N" or "sample N (file)".
      py::object n = py::str(f.path);
      std::string reason = f.reason;
      if (f.path.rfind("sample ", 0) == 0) {
        n = py::int_(std::stoull(f.path.substr(7)));
        if (size_t p = f.path.find(" ("); p != std::string::npos) {
          reason = f.path.substr(p + 2, f.path.size() - p - 3) + ": " + reason;
        }
      }
      out.append(py::make_tuple(n, reason));
    }
    return out;
  }

  bool open() const { return writer_ != nullptr; }
  std::string schema_json() const { return schema_.ToJson(); }

 private:
  std::string ImageName() const { return schema_.fields()[schema_.image_field()].name; }

  // One prepared Python value as the writer's owned value: numbers for scalars, bytes for
  // str/bytes/json, a C-contiguous array of the field's dtype for arrays, boxes and masks.
  static converter::OwnedValue ValueOf(const format::FieldSpec& spec, const py::handle& v) {
    using format::FieldKind;
    switch (spec.kind) {
      case FieldKind::kInt64:
        return converter::OwnedValue::Int64(v.cast<int64_t>());
      case FieldKind::kFloat32:
        return converter::OwnedValue::Float32(v.cast<float>());
      case FieldKind::kFloat64:
        return converter::OwnedValue::Float64(v.cast<double>());
      case FieldKind::kStr:
      case FieldKind::kBytes:
      case FieldKind::kJson: {
        char* data = nullptr;
        ssize_t size = 0;
        if (PyBytes_AsStringAndSize(v.ptr(), &data, &size) != 0) throw py::error_already_set();
        return converter::OwnedValue::Text(std::string_view(data, size));
      }
      default: {
        auto a = py::reinterpret_borrow<py::array>(v);
        if (a.ndim() > static_cast<ssize_t>(format::kMaxDims)) {
          throw py::value_error("field '" + spec.name + "': more than 4 dims");
        }
        std::vector<uint32_t> dims;
        for (ssize_t d = 0; d < a.ndim(); ++d) dims.push_back(static_cast<uint32_t>(a.shape(d)));
        return converter::OwnedValue::Array(a.data(), a.nbytes(), dims);
      }
    }
  }

  std::string out_, options_json_;
  format::Schema schema_;
  std::optional<std::vector<std::string>> class_names_;
  bool skip_bad_ = false;
  bool busy_ = false;
  std::unique_ptr<converter::SampleWriter> writer_;
  converter::PackResult result_;
};

}  // namespace

void BindWriter(py::module_& m) {
  py::class_<PyWriter>(m, "Writer")
      .def(py::init<const std::string&, const std::string&, std::optional<std::vector<std::string>>,
                    bool, const py::kwargs&>(),
           py::arg("out"), py::arg("schema"), py::arg("class_names") = py::none(),
           py::arg("skip_bad") = false)
      .def("write", &PyWriter::Write, py::arg("number"), py::arg("image"), py::arg("label"),
           py::arg("values"))
      .def("finish", &PyWriter::Finish)
      .def("abort", &PyWriter::Abort)
      .def_property_readonly("skipped", &PyWriter::Skipped)
      .def_property_readonly("open", &PyWriter::open)
      .def_property_readonly("schema_json", &PyWriter::schema_json);
  // A user's schema (JSON) checked and in the manifest's form: [{"name", "type"[, "per"]}].
  m.def("canonical_schema",
        [](const std::string& json) { return Check(format::Schema::FromJson(json)).ToJson(); });
  // A column's name as a field name, as the JSONL and CSV importers make it (the parquet one).
  m.def("field_name", &converter::SanitizeFieldName, py::arg("column"));
  // A json value's text as the importers take it (integers a 64-bit integer holds, nesting
  // depth): ValueError saying why. The Writer's json fields go through it.
  m.def("check_json_text", [](const py::bytes& utf8) {
    const std::string text = utf8;
    if (Status s = converter::CheckJsonText(text); !s.ok()) throw py::value_error(s.message());
  });
}

}  // namespace shardfeed_py
