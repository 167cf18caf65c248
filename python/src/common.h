// What the binding files share: Status -> Python exceptions, numpy views over memory a
// shared_ptr keeps alive, keyword arguments in the option tables' text form.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every file: type casters must agree across them

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardfeed/base/cancel.h"
#include "shardfeed/base/option_table.h"
#include "shardfeed/base/status.h"
#include "shardfeed/storage/remote.h"

namespace shardfeed::format {
class Archive;
}

namespace shardfeed_py {

namespace py = pybind11;

// Creates shardfeed.Error and its subclasses DataError (corrupt data, checksum mismatch),
// StorageError (a disk or network failure; also an OSError), WorkerError (a worker process
// died) and Timeout (no batch within the loader's timeout).
void BindErrors(py::module_& m);

// Raises the Python exception for a failed Status: kInvalidArgument -> ValueError, kNotFound ->
// FileNotFoundError, kCorrupt/kChecksumMismatch/kChanged -> DataError, kTimeout -> Timeout,
// kIOError -> StorageError, a dead worker process -> WorkerError, anything else -> Error. Call with
// the GIL held.
[[noreturn]] void Raise(const shardfeed::Status& s);
[[noreturn]] void RaiseError(const std::string& message);  // shardfeed.Error(message)

template <typename T>
T Check(shardfeed::Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(*r);
}
inline void Check(const shardfeed::Status& s) {
  if (!s.ok()) Raise(s);
}

// Runs `work` with the GIL released and Python's signal handlers live: `work` runs on a thread
// of its own while the calling thread takes the GIL every kSignalPollSeconds to run them
// (PyErr_CheckSignals: only the main thread runs them, and it is blocked in this call). A handler
// that raises (Ctrl-C: KeyboardInterrupt) cancels the token `work` was given; RunInterruptible
// then waits for `work` to return (as soon as it honours the token: about a second for a
// download, base/cancel.h) and raises that exception, whatever `work` returned. `work` must not
// touch Python objects; an exception it throws is thrown here. For calls that block on the
// network and honour a token: opening an archive (format::OpenOptions::cancel), verify.
inline constexpr double kSignalPollSeconds = 0.1;
void RunInterruptible(const std::function<void(const shardfeed::CancelToken& cancel)>& work);

// A remote archive's cache_dir= and cache_limit= keyword values (None: the default) through
// storage::CacheOptionTable, its checks and messages (ValueError).
shardfeed::storage::CacheOptions CacheFrom(const py::object& dir, const py::object& limit);

// json.loads(text).
py::object FromJson(const std::string& text);

// A capsule holding a copy of `owner`: the base object of arrays over memory it keeps alive.
py::capsule Keeper(std::shared_ptr<void> owner);
// A numpy array over memory kept alive by `owner`.
inline py::array ViewOf(const py::dtype& dtype, void* data, std::vector<ssize_t> shape,
                        std::shared_ptr<void> owner) {
  return py::array(dtype, shape, data, Keeper(std::move(owner)));
}
template <typename T>
py::array_t<T> View(T* data, std::vector<ssize_t> shape, std::shared_ptr<void> owner) {
  return py::array_t<T>(shape, data, Keeper(std::move(owner)));
}

// A keyword argument's text form, as the CLI would receive it (the option tables parse both):
// bools true/false, numbers as Python prints them, sequences comma-separated, None "None" (as
// Python spells it, so a refusal quotes what the caller wrote; timeout takes it),
// torch dtypes and devices by name.
std::string OptionText(const py::handle& v);

// Each of `options` set on `*o` through `table`, the one the CLI reads: an unknown name is
// raised naming the closest, a value the table refuses with its message (Raise/Check).
template <typename T>
void SetOptions(const shardfeed::OptionTable<T>& table, const py::dict& options, T* o) {
  for (const auto& item : options) {
    const std::string name = py::str(item.first);
    const auto* option = table.Find(name);
    if (!option) Raise(table.Unknown(name));
    Check(option->set(o, OptionText(item.second)));
  }
}

void BindArchive(py::module_& m);  // bind_archive.cpp: shardfeed._native.Archive
// The archive a shardfeed._native.Archive holds (bind_archive.cpp).
std::shared_ptr<shardfeed::format::Archive> ArchiveOf(const py::handle& archive);
void BindLoader(py::module_& m);  // bind_loader.cpp: shardfeed._native.Loader
void BindTools(py::module_& m);   // bind_tools.cpp: pack, verify, convert, merge, inspect, ...
void BindWriter(py::module_& m);  // bind_writer.cpp: shardfeed._native.Writer, canonical_schema

}  // namespace shardfeed_py
