// shardfeed._native: the C++ library as Python sees it. Thin: public headers only. One file per
// part: common.{h,cpp} (errors, views, option text), bind_archive.cpp, bind_loader.cpp,
// bind_tools.cpp, bind_writer.cpp. Errors become exceptions (common.h says which).
#include "common.h"

PYBIND11_MODULE(_native, m) {
  m.doc() = "shardfeed native core (use the shardfeed package, not this module)";
  shardfeed_py::BindErrors(m);
  shardfeed_py::BindArchive(m);
  shardfeed_py::BindLoader(m);
  shardfeed_py::BindTools(m);
  shardfeed_py::BindWriter(m);
}
