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

namespace {

// The rule ArchiveWriter::Create applies to OUT, checked before packing (Merge applies it again).
Status OutputReplaceable(const std::string& out, bool overwrite) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(out, ec))) return Status::OK();
  if (!overwrite) {
    return Status::InvalidArgument(out, ": already exists (pass --overwrite to replace it)");
  }
  if (!format::IsArchiveDirectory(out)) {
    return Status::InvalidArgument(out,
                                   ": exists and is not a shardfeed archive; --overwrite "
                                   "replaces only an archive, so it is left as it is");
  }
  return Status::OK();
}

}  // namespace

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

  // OUT is checked before any rank packs: a job that cannot write OUT fails in a second, not
  // after packing everything. Rank 0 decides, every rank exits with its code.
  int refused = 0;
  if (rank == 0) {
    Status free_out = OutputReplaceable(out, overwrite);
    if (!free_out.ok()) {
      std::fprintf(stderr, "shardfeed: error: %s\n", free_out.ToString().c_str());
      refused = ExitCodeFor(free_out);
    }
  }
  MPI_Bcast(&refused, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (refused) {
    MPI_Finalize();
    return refused;
  }

  Result<converter::SourceList> source =
      list.empty() ? converter::ScanImageFolder(src, converter::OutputPaths(out))
                   : converter::ReadListFile(list, src);
  converter::PackResult result;
  Status st = source.ok() ? converter::Pack(*source, mine, opt, &result) : source.status();
  if (!report.empty()) {
    const std::string file = report + ".rank" + std::to_string(rank);
    Status w = converter::CheckReportPath(file, opt.writer.overwrite);
    if (w.ok()) {
      w = converter::WriteReport(
          file, converter::PackReportJson(result, src, st.ok() ? "" : st.message()),
          opt.writer.overwrite);
    }
    if (!w.ok()) std::fprintf(stderr, "shardfeed: warning: %s\n", w.message().c_str());
  }
  if (!st.ok()) {
    std::fprintf(stderr, "shardfeed: rank %d of %d: error: %s\n", rank, size,
                 st.ToString().c_str());
  }
  // The job's code is the worst rank's, as a single process would give it: a --strict skip is 1
  // (bad data) on every rank, not 1 on the rank that met it and 3 on the others.
  const int mine_code = st.ok() ? 0 : opt.strict && !result.skipped.empty() ? 1 : ExitCodeFor(st);
  int job_code = 0;
  MPI_Allreduce(&mine_code, &job_code, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const bool all_ok = job_code == 0;

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
  return all_ok ? rank0_code : job_code;
}

}  // namespace shardfeed::cli
