// `mpirun -n N shardfeed pack SRC OUT`: each rank packs part <rank> of N (the same split as
// `pack --part`), all ranks agree on the outcome (MPI_Allreduce), then rank 0 merges the parts
// into OUT and removes them (the archive keeps hard links to their shard files). If any rank
// fails, every rank exits non-zero, the failing one with its error, and the parts are removed:
// no archive appears at OUT.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cli_internal.h"
#include "shardfeed/converter/pack.h"
#include "shardfeed/format/archive.h"

namespace shardfeed::cli {

namespace fs = std::filesystem;

int MpiWorldSize() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return 1;
}

int MpiPack(const std::string& src, const std::string& list, const std::string& out,
            converter::PackOptions opt, const std::string& report) {
  MPI_Init(nullptr, nullptr);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  opt.part = static_cast<uint32_t>(rank);
  opt.parts = static_cast<uint32_t>(size);
  opt.part_record = true;
  const bool overwrite = opt.writer.overwrite;
  opt.writer.overwrite = true;  // a part left by an earlier, killed job is ours to replace
  const std::string mine = converter::DefaultPartPath(out, opt.part, opt.parts);

  Result<converter::SourceList> source =
      list.empty() ? converter::ScanImageFolder(src, converter::OutputPaths(out))
                   : converter::ReadListFile(list, src);
  converter::PackResult result;
  Status st = source.ok() ? converter::Pack(*source, mine, opt, &result) : source.status();
  if (!report.empty()) {
    std::ofstream r(report + ".rank" + std::to_string(rank));
    r << converter::PackReportJson(result, src);
  }
  if (!st.ok()) {
    std::fprintf(stderr, "shardfeed: rank %d of %d: error: %s\n", rank, size,
                 st.ToString().c_str());
  }
  int ok = st.ok() ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);

  int code = 0;
  if (rank == 0) {
    std::vector<std::string> parts;
    for (int r = 0; r < size; ++r) {
      parts.push_back(converter::DefaultPartPath(out, static_cast<uint32_t>(r), opt.parts));
    }
    Status merged = Status::Cancelled("another rank failed");
    converter::MergeResult mr;
    if (all_ok) merged = converter::Merge(parts, out, overwrite, &mr);
    // The parts are this job's own: remove them (after a merge the archive holds links).
    for (const std::string& p : parts) {
      std::error_code ec;
      if (format::IsArchiveDirectory(p)) fs::remove_all(p, ec);
    }
    std::error_code ec;
    fs::remove(fs::path(parts[0]).parent_path(), ec);  // only if empty
    if (all_ok && merged.ok()) {
      std::printf("packed %llu samples on %d ranks into %s (%llu shards)\n",
                  static_cast<unsigned long long>(mr.samples), size, out.c_str(),
                  static_cast<unsigned long long>(mr.shards));
    } else if (all_ok) {
      std::fprintf(stderr, "shardfeed: merge: error: %s\n", merged.ToString().c_str());
      code = ExitCodeFor(merged);
    } else {
      std::fprintf(stderr, "shardfeed: a rank failed: no archive written at %s\n", out.c_str());
    }
  }
  int rank0_code = code;
  MPI_Bcast(&rank0_code, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  if (!st.ok()) return opt.strict && !result.skipped.empty() ? 1 : ExitCodeFor(st);
  if (!all_ok) return 3;
  return rank0_code;
}

}  // namespace shardfeed::cli
