// One mechanism for every option table: an option is declared once (name, kind, allowed values,
// help, how its text sets a field of an options struct T and how the field reads back as text),
// and the CLI (`--batch-size 64`), the Python bindings (`batch_size=64`) and C++ callers
// (OptionTable::Set) all read it through the same setter, so they accept and refuse the same
// values with the same messages. reader/options.h (LoaderOptions), converter/options.h
// (PackOptions) and the CLI's own flags (cli/cli_internal.h) are tables of this kind.
//
// Text forms: bools true|false (1|0, yes|no, on|off, True|False); whole numbers digits only;
// decimals plain (no leading space, no hex, no inf/nan); every numeric option states its range
// (Option::range), which help shows and every refusal names.
//
// Thread-safety: a table is immutable once built; Find/Set/Unknown touch only their arguments.
// Errors: kInvalidArgument starting with the option's name and flag ("batch_size (--batch-size)
// must be a whole number in 1..1048576, not 'x'"); an unknown name is refused naming it and the
// closest known name ("unexpected loader option 'batch_sise'; did you mean 'batch_size'?").
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardfeed/base/option_text.h"
#include "shardfeed/base/status.h"

namespace shardfeed {

enum class OptionKind {
  kBool = 0,  // true|false; a bare CLI flag means true
  kCount,     // a whole number in a stated range
  kNumber,    // a finite decimal number in a stated range
  kChoice,    // one of `choices`
  kList,      // comma-separated numbers ("R,G,B", "MIN,MAX")
  kBytes,     // a byte size with an optional unit (64K, 1M, 1G)
  kText,      // free-form, checked by the setter (device, "auto" or a number, I/N)
};

// "bool", "count", "number", "choice", "list", "bytes", "text".
inline const char* OptionKindName(OptionKind kind) {
  static const char* const kNames[] = {"bool", "count", "number", "choice",
                                       "list", "bytes", "text"};
  return kNames[static_cast<int>(kind)];
}

template <typename T>
struct Option {
  using Setter = std::function<Status(T* options, std::string_view text)>;
  using Getter = std::function<std::string(const T& options)>;
  Option(const char* name, OptionKind kind, const char* choices, const char* help, Setter set,
         Getter get, std::string range = {}, bool recorded = false)
      : name(name),
        kind(kind),
        choices(choices),
        help(help),
        set(std::move(set)),
        get(std::move(get)),
        range(std::move(range)),
        recorded(recorded) {}

  const char* name;  // snake_case: the Python keyword; the CLI flag is OptionFlag(name)
  OptionKind kind;
  const char* choices;  // kChoice: "a|b|c"; else nullptr
  const char* help;
  Setter set;
  Getter get;         // the current value as text
  std::string range;  // numeric kinds: the values allowed ("a whole number in 1..4096")
  bool recorded;      // pack: shapes the records (written to the manifest's "options")
};

template <typename T>
class OptionTable {
 public:
  // `what` names an entry in messages: "loader option", "pack option", "bench option".
  OptionTable(std::string what, std::vector<Option<T>> options)
      : what_(std::move(what)), options_(std::move(options)) {}

  typename std::vector<Option<T>>::const_iterator begin() const { return options_.begin(); }
  typename std::vector<Option<T>>::const_iterator end() const { return options_.end(); }
  size_t size() const { return options_.size(); }

  // "batch_size" or "batch-size" -> its entry; nullptr if there is none.
  const Option<T>* Find(std::string_view name) const {
    std::string snake(name);
    for (char& c : snake) c = c == '-' ? '_' : c;
    for (const Option<T>& o : options_) {
      if (snake == o.name) return &o;
    }
    return nullptr;
  }

  // Sets one option from its text form; an unknown name is Unknown(name).
  Status Set(T* options, std::string_view name, std::string_view text) const {
    const Option<T>* o = Find(name);
    return o ? o->set(options, text) : Unknown(name);
  }

  // kInvalidArgument: "unexpected <what> '<name>'", and "; did you mean '<closest>'?" when a
  // known name is close (ClosestName).
  Status Unknown(std::string_view name) const {
    const std::string close = ClosestName(name, names());
    return Status::InvalidArgument(
        "unexpected ", what_, " '", std::string(name), "'",
        close.empty() ? std::string() : "; did you mean '" + close + "'?");
  }

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const Option<T>& o : options_) out.push_back(o.name);
    return out;
  }

 private:
  std::string what_;
  std::vector<Option<T>> options_;
};

// Builders for the common kinds. `field` reaches the field from the options struct: a member
// pointer (&T::batch_size) or a callable taking T& or const T& ([](auto& o) -> auto& {...}).
template <typename T, typename Field>
Option<T> BoolOption(const char* name, const char* help, Field field) {
  return {name,
          OptionKind::kBool,
          nullptr,
          help,
          [name, field](T* o, std::string_view t) -> Status {
            bool v = false;
            if (!ParseBoolText(t, &v)) return BadOption(name, "true or false", t);
            std::invoke(field, *o) = v;
            return Status::OK();
          },
          [field](const T& o) { return std::string(std::invoke(field, o) ? "true" : "false"); }};
}

// A whole number in [min, max] (max clamped to what the field holds).
template <typename T, typename Field>
Option<T> CountOption(const char* name, uint64_t min, uint64_t max, const char* help, Field field) {
  using F = std::decay_t<decltype(std::invoke(field, std::declval<T&>()))>;
  if (uint64_t(std::numeric_limits<F>::max()) < max) max = uint64_t(std::numeric_limits<F>::max());
  return {name,
          OptionKind::kCount,
          nullptr,
          help,
          [name, min, max, field](T* o, std::string_view t) -> Status {
            uint64_t v = 0;
            SF_RETURN_IF_ERROR(ParseCountOption(name, t, min, max, &v));
            std::invoke(field, *o) = static_cast<F>(v);
            return Status::OK();
          },
          [field](const T& o) { return std::to_string(std::invoke(field, o)); },
          CountRange(min, max)};
}

// A finite decimal number inside `range`.
template <typename T, typename Field>
Option<T> NumberOption(const char* name, NumberRange range, const char* help, Field field) {
  return {name,
          OptionKind::kNumber,
          nullptr,
          help,
          [name, range, field](T* o, std::string_view t) -> Status {
            double v = 0;
            SF_RETURN_IF_ERROR(ParseNumberOption(name, t, range, &v));
            std::invoke(field, *o) = v;
            return Status::OK();
          },
          [field](const T& o) { return NumberText(std::invoke(field, o)); },
          NumberRangeText(range)};
}

}  // namespace shardfeed
