#include "shardfeed/base/option_text.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace shardfeed {

bool ParseBoolText(std::string_view t, bool* out) {
  if (t == "true" || t == "1" || t == "yes" || t == "on" || t == "True") return *out = true, true;
  if (t == "false" || t == "0" || t == "no" || t == "off" || t == "False") {
    return *out = false, true;
  }
  return false;
}

bool ParseCountText(std::string_view t, uint64_t* out) {
  if (t.empty() || t.size() > 20) return false;
  uint64_t v = 0;
  for (char c : t) {
    if (c < '0' || c > '9') return false;
    const uint64_t digit = uint64_t(c - '0');
    if (v > (UINT64_MAX - digit) / 10) return false;  // past 2^64-1
    v = v * 10 + digit;
  }
  *out = v;
  return true;
}

namespace {

// Text strtod would read that is not a plain decimal: a leading space or '+', hex, inf/nan.
bool PlainDecimal(std::string_view t) {
  const std::string_view body = !t.empty() && t[0] == '-' ? t.substr(1) : t;
  if (body.empty() || !(std::isdigit(static_cast<unsigned char>(body[0])) || body[0] == '.')) {
    return false;
  }
  return body.find_first_of("xXpP") == std::string_view::npos;
}

}  // namespace

bool ParseNumberText(std::string_view t, double* out) {
  if (!PlainDecimal(t)) return false;
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
  if (text.empty() || text[0] == '-' || !PlainDecimal(text)) return false;
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(v) || v < 0) return false;
  std::string unit(end);
  if (unit.size() > 1 && unit[0] == ' ') unit.erase(0, 1);  // "2 GiB" (not "2 ")
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  // dd's rule: K M G T and KiB MiB GiB TiB are powers of 1024; KB MB GB TB powers of 1000.
  double mult = 1;
  if (!unit.empty() && unit != "B") {
    const char* letters = "KMGT";
    const char* at = std::strchr(letters, unit[0]);
    const std::string rest = unit.substr(1);
    if (!at || !*at || !(rest.empty() || rest == "I" || rest == "IB" || rest == "B")) return false;
    const double base = rest == "B" ? 1000 : 1024;
    for (const char* u = letters; u <= at; ++u) mult *= base;
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

std::string CountRange(uint64_t min, uint64_t max) {
  if (max == std::numeric_limits<uint64_t>::max()) {
    return "a whole number >= " + std::to_string(min);
  }
  return "a whole number in " + std::to_string(min) + ".." + std::to_string(max);
}

Status ParseCountOption(std::string_view name, std::string_view text, uint64_t min, uint64_t max,
                        uint64_t* out) {
  uint64_t v = 0;
  if (!ParseCountText(text, &v) || v < min || v > max) {
    return BadOption(name, CountRange(min, max), text);
  }
  *out = v;
  return Status::OK();
}

std::string NumberRangeText(const NumberRange& r) {
  return std::string("a number in ") + (r.min_open ? "(" : "[") + NumberText(r.min) + ", " +
         NumberText(r.max) + (r.max_open ? ")" : "]");
}

Status ParseNumberOption(std::string_view name, std::string_view text, const NumberRange& r,
                         double* out) {
  double v = 0;
  if (!ParseNumberText(text, &v) || (r.min_open ? v <= r.min : v < r.min) ||
      (r.max_open ? v >= r.max : v > r.max)) {
    return BadOption(name, NumberRangeText(r), text);
  }
  *out = v;
  return Status::OK();
}

namespace {

std::string Normalized(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    c = c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// Optimal string alignment distance: insertions, deletions, substitutions and transpositions
// of neighbours each cost 1.
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::string ClosestName(std::string_view name, const std::vector<std::string>& candidates) {
  const std::string n = Normalized(name);
  if (n.empty() || n.size() > 64) return "";
  // A one-letter slip first; then a name that contains the other ("num_workers" holds
  // "workers", "batch" is the start of "batch_size"); then any edit within a third of the name;
  // then a name with the same first word.
  std::string best;
  size_t best_rank = SIZE_MAX;
  for (const std::string& c : candidates) {
    const std::string m = Normalized(c);
    if (m.size() > 64) continue;
    const size_t d = EditDistance(n, m);
    const bool contains = std::min(n.size(), m.size()) >= 4 &&
                          (n.find(m) != std::string::npos || m.find(n) != std::string::npos);
    size_t rank = SIZE_MAX;
    if (d <= 1) {
      rank = d;
    } else if (contains) {
      rank = 100 + d;
    } else if (d <= std::max<size_t>(2, n.size() / 3)) {
      rank = 200 + d;
    } else if (const size_t w = n.find('_');
               w != std::string::npos && w >= 4 && m.compare(0, w + 1, n, 0, w + 1) == 0) {
      rank = 300 + d;  // the same first word: "chunk_bytes" -> "chunk_size"
    }
    if (rank < best_rank) best_rank = rank, best = c;
  }
  return best;
}

}  // namespace shardfeed
