#include "shardfeed/base/option_text.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace shardfeed {

bool ParseBoolText(std::string_view t, bool* out) {
  if (t == "true" || t == "1" || t == "yes" || t == "on" || t == "True") return *out = true, true;
  if (t == "false" || t == "0" || t == "no" || t == "off" || t == "False") {
    return *out = false, true;
  }
  return false;
}

bool ParseCountText(std::string_view t, uint64_t* out) {
  if (t.empty() || t.size() > 19) return false;
  uint64_t v = 0;
  for (char c : t) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + uint64_t(c - '0');
  }
  *out = v;
  return true;
}

bool ParseNumberText(std::string_view t, double* out) {
  const std::string s(t);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool ParseNumberList(std::string_view t, size_t n, bool broadcast, std::vector<double>* out) {
  out->clear();
  size_t start = 0;
  while (start <= t.size()) {
    size_t end = t.find(',', start);
    if (end == std::string_view::npos) end = t.size();
    double v = 0;
    if (!ParseNumberText(t.substr(start, end - start), &v)) return false;
    out->push_back(v);
    start = end + 1;
  }
  if (broadcast && out->size() == 1) out->assign(n, (*out)[0]);
  return out->size() == n;
}

bool ParseByteSize(std::string_view text, uint64_t* out) {
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(v) || v < 0) return false;
  std::string unit(end);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "B") {
    mult = 1;
  } else if (unit == "K" || unit == "KB" || unit == "KIB") {
    mult = 1024;
  } else if (unit == "M" || unit == "MB" || unit == "MIB") {
    mult = 1024.0 * 1024;
  } else if (unit == "G" || unit == "GB" || unit == "GIB") {
    mult = 1024.0 * 1024 * 1024;
  } else if (unit == "T" || unit == "TB" || unit == "TIB") {
    mult = 1024.0 * 1024 * 1024 * 1024;
  } else {
    return false;
  }
  if (v * mult >= 18446744073709551615.0) return false;
  *out = static_cast<uint64_t>(v * mult);
  return true;
}

std::string OptionFlag(std::string_view name) {
  std::string flag = "--" + std::string(name);
  for (char& c : flag) c = c == '_' ? '-' : c;
  return flag;
}

Status BadOption(std::string_view name, const std::string& what, std::string_view text) {
  return Status::InvalidArgument(std::string(name), " (", OptionFlag(name), ") must be ", what,
                                 ", not '", std::string(text), "'");
}

std::string NumberText(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

}  // namespace shardfeed
