#include <cstdio>

#include "cli_internal.h"

namespace shardfeed::cli {

int CmdBench(int, char**) {
  return Fail(Status::Unsupported("bench: the reader is not built yet"));
}

}  // namespace shardfeed::cli
