// CSV manifests (RFC 4180: a header row, quoted cells with "" for a quote and line breaks
// inside quotes; *.tsv: tabs). Every cell is text; ImportRows types it by its field.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shardfeed/converter/importers.h"

namespace shardfeed::converter {
namespace {

using Json = nlohmann::ordered_json;

// Reads one record starting at `*line_no`; false at the end of the input. An unterminated quote
// is an error naming the line it opened on.
Status ReadRecord(std::istream& in, char sep, size_t* line_no, std::vector<std::string>* cells,
                  bool* got) {
  cells->clear();
  *got = false;
  std::string line;
  if (!std::getline(in, line)) return Status::OK();
  ++*line_no;
  *got = true;
  const size_t first_line = *line_no;
  std::string cell;
  bool quoted = false, was_quoted = false;
  for (size_t i = 0;; ++i) {
    if (i == line.size()) {
      if (!quoted) break;
      // A line break inside quotes belongs to the cell.
      if (!std::getline(in, line)) {
        return Status::Corrupt("unterminated quote opened on line ", first_line);
      }
      ++*line_no;
      cell += '\n';
      i = static_cast<size_t>(-1);
      continue;
    }
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cell += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cell += c;
      }
    } else if (c == '"' && cell.empty() && !was_quoted) {
      quoted = was_quoted = true;
    } else if (c == sep) {
      cells->push_back(std::move(cell));
      cell.clear();
      was_quoted = false;
    } else if (c == '\r' && i + 1 == line.size()) {
      // CRLF line ends
    } else {
      cell += c;
    }
  }
  cells->push_back(std::move(cell));
  return Status::OK();
}

}  // namespace

Result<SourceList> ImportCsv(const std::string& file, const ImportOptions& options) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::NotFound(file, ": cannot open: ", std::strerror(errno));
  const char sep = file.size() > 4 && file.compare(file.size() - 4, 4, ".tsv") == 0 ? '\t' : ',';
  size_t line_no = 0;
  std::vector<std::string> header, cells;
  bool got = false;
  do {
    Status s = ReadRecord(in, sep, &line_no, &header, &got);
    if (!s.ok()) return Status::Corrupt(file, ":", line_no, ": ", s.message());
  } while (got && header.size() == 1 && header[0].empty());
  if (!got) return Status::InvalidArgument(file, ": empty (expected a header row)");
  if (!header.empty() && header[0].rfind("\xEF\xBB\xBF", 0) == 0) header[0].erase(0, 3);  // BOM
  for (size_t i = 0; i < header.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (header[i] == header[j]) {
        return Status::Corrupt(file, ":", line_no, ": column '", header[i], "' given twice");
      }
    }
  }
  std::vector<Json> objects;
  std::vector<std::string> where;
  std::vector<SkippedFile> skipped;
  for (;;) {
    const size_t start = line_no + 1;
    Status s = ReadRecord(in, sep, &line_no, &cells, &got);
    const std::string at = file + ":" + std::to_string(start);
    if (!s.ok()) return Status::Corrupt(at, ": ", s.message());
    if (!got) break;
    if (cells.size() == 1 && cells[0].empty()) continue;  // a blank line
    if (cells.size() != header.size()) {
      // A file separated by ';' (spreadsheets in many locales) reads as one column.
      const bool semicolons = header.size() == 1 && header[0].find(';') != std::string::npos;
      const std::string why =
          std::to_string(cells.size()) + " cells, the header has " + std::to_string(header.size()) +
          (semicolons ? " (the header holds ';': only ',' separates cells, and tabs in *.tsv)"
                      : "");
      if (!options.skip_bad) return Status::Corrupt(at, ": ", why);
      skipped.push_back({at, why});
      continue;
    }
    Json object = Json::object();
    for (size_t i = 0; i < cells.size(); ++i) object[header[i]] = std::move(cells[i]);
    objects.push_back(std::move(object));
    where.push_back(at);
  }
  if (in.bad()) return Status::IOError(file, ": read failed");
  return ImportParsedRows(file, &objects, where, skipped, header, true, options, "csv");
}

}  // namespace shardfeed::converter
