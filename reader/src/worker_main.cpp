// shardfeed-worker: the worker process of a Loader in WorkerMode::kProcesses. Started by the
// loader itself (posix_spawn) with its socket on fd 3 and the ring on fd 4; not for direct use.
#include "loader_internal.h"

int main() { return shardfeed::reader::RunWorkerProcess(); }
