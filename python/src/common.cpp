#include "common.h"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>

namespace shardfeed_py {
namespace {

PyObject* g_error = nullptr;          // shardfeed.Error
PyObject* g_data_error = nullptr;     // shardfeed.DataError
PyObject* g_worker_error = nullptr;   // shardfeed.WorkerError
PyObject* g_timeout = nullptr;        // shardfeed.Timeout
PyObject* g_storage_error = nullptr;  // shardfeed.StorageError, also an OSError

// A name from a str or a torch.dtype / torch.device ("torch.float32" -> "float32").
std::string OptionName(const py::handle& v) {
  std::string s = py::str(v);
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  return s;
}

}  // namespace

void BindErrors(py::module_& m) {
  static py::exception<std::runtime_error> error(m, "Error", PyExc_RuntimeError);
  g_error = error.ptr();
  static py::exception<std::runtime_error> data_error(m, "DataError", g_error);
  g_data_error = data_error.ptr();
  static py::exception<std::runtime_error> worker_error(m, "WorkerError", g_error);
  g_worker_error = worker_error.ptr();
  static py::exception<std::runtime_error> timeout(m, "Timeout", g_error);
  g_timeout = timeout.ptr();
  // Disk and network failures (kIOError): `except OSError` catches them, as it catches the
  // standard library's, and `except shardfeed.Error` still does.
  PyObject* bases = PyTuple_Pack(2, g_error, PyExc_OSError);
  g_storage_error = PyErr_NewExceptionWithDoc(
      "shardfeed._native.StorageError",
      "A file or network operation failed (read, write, download): shardfeed.Error and OSError.",
      bases, nullptr);
  Py_XDECREF(bases);
  if (!g_storage_error) throw py::error_already_set();
  m.add_object("StorageError", py::reinterpret_borrow<py::object>(g_storage_error));
}

void Raise(const shardfeed::Status& s) {
  using shardfeed::StatusCode;
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
      throw py::value_error(s.message());
    case StatusCode::kNotFound:
      PyErr_SetString(PyExc_FileNotFoundError, s.message().c_str());
      break;
    case StatusCode::kCorrupt:
    case StatusCode::kChecksumMismatch:
    case StatusCode::kChanged:
      PyErr_SetString(g_data_error, s.ToString().c_str());
      break;
    case StatusCode::kTimeout:
      PyErr_SetString(g_timeout, s.message().c_str());
      break;
    case StatusCode::kIOError:
      if (s.message().find("worker process") == std::string::npos) {
        PyErr_SetString(g_storage_error, s.ToString().c_str());
        break;
      }
      [[fallthrough]];
    default:
      if (s.message().find("worker process") != std::string::npos) {
        PyErr_SetString(g_worker_error, s.message().c_str());
      } else {
        PyErr_SetString(g_error, s.ToString().c_str());
      }
  }
  throw py::error_already_set();
}

void RunInterruptible(const std::function<void(const shardfeed::CancelToken& cancel)>& work) {
  shardfeed::CancelToken cancel;
  bool interrupted = false;
  std::exception_ptr thrown;
  {
    py::gil_scoped_release release;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    auto run = [&] {
      try {
        work(cancel);
      } catch (...) {
        thrown = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      cv.notify_all();
    };
    std::thread worker;
    try {
      worker = std::thread(run);
    } catch (const std::system_error&) {
      run();  // no thread to spare: uninterruptible, as before
    }
    std::unique_lock<std::mutex> lock(mu);
    const auto poll = std::chrono::duration<double>(kSignalPollSeconds);
    while (!cv.wait_for(lock, poll, [&] { return done; })) {
      if (interrupted) continue;  // cancelled: waiting for `work` to stop
      lock.unlock();
      {
        py::gil_scoped_acquire acquire;
        interrupted = PyErr_CheckSignals() != 0;  // the handler's exception stays set
      }
      if (interrupted) cancel.Cancel();
      lock.lock();
    }
    lock.unlock();
    if (worker.joinable()) worker.join();
  }
  if (interrupted) throw py::error_already_set();
  if (thrown) std::rethrow_exception(thrown);
}

shardfeed::storage::CacheOptions CacheFrom(const py::object& dir, const py::object& limit) {
  shardfeed::storage::CacheOptions cache;
  const auto& table = shardfeed::storage::CacheOptionTable();
  if (!dir.is_none()) Check(table.Set(&cache, "cache_dir", OptionText(dir)));
  if (!limit.is_none()) Check(table.Set(&cache, "cache_limit", OptionText(limit)));
  return cache;
}

void RaiseError(const std::string& message) {
  PyErr_SetString(g_error, message.c_str());
  throw py::error_already_set();
}

py::object FromJson(const std::string& text) {
  return py::module_::import("json").attr("loads")(text);
}

py::capsule Keeper(std::shared_ptr<void> owner) {
  auto* holder = new std::shared_ptr<void>(std::move(owner));
  return py::capsule(holder, [](void* p) { delete static_cast<std::shared_ptr<void>*>(p); });
}

std::string OptionText(const py::handle& v) {
  if (v.is_none()) return "None";
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "true" : "false";
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    std::string out;
    for (py::handle item : v) out += (out.empty() ? "" : ",") + OptionText(item);
    return out;
  }
  return OptionName(v);
}

}  // namespace shardfeed_py
