// Internal: one prefix per message.
#pragma once

#include <string>

#include "shardfeed/base/status.h"

namespace shardfeed::validate {

// `status` with "<archive>: sample <index>: " in front, unless its message starts with it
// already (format/'s VerifyRecord names both itself): a reason is named once.
inline Status ForSample(const std::string& archive, uint64_t index, const Status& status) {
  if (status.ok()) return status;
  const std::string prefix = archive + ": sample " + std::to_string(index) + ": ";
  if (status.message().compare(0, prefix.size(), prefix) == 0) return status;
  return Status(status.code(), prefix + status.message());
}

}  // namespace shardfeed::validate
