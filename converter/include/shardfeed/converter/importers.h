// Importers: sources other than an image folder or a list file (scan.cpp), each a small module
// that turns its source into a SourceList with a schema and per-item field values, which Pack
// writes like a folder. `shardfeed pack SRC OUT` recognises the kind (DetectSourceKind);
// `--from KIND` forces it.
//
//   jsonl      one JSON object per line; csv: a header row, then one row per sample (RFC 4180)
//   coco       a COCO instances file (--images DIR; --captions FILE)
//   webdataset a .tar shard, or a directory of them: members grouped by key, extensions as fields
//
// Image paths are taken relative to the manifest file's directory (COCO: to --images). Every
// error names the source file and line (or tar member) and the field. A bad row (a value that
// does not convert to its field's type) is an error (kCorrupt: bad data), or with `skip_bad`
// skipped and listed in SourceList::skipped like a bad image.
//
// Schemas: given (`--schema FILE.json`, Schema::FromJson's user form) or inferred from the data:
// int -> int64, float -> float64, str -> str, bool -> int64, list of ints -> int64[*], list of
// numbers -> float32[*], list of k-number lists -> float32[*,k] (named boxes/bbox with k = 4:
// boxes), anything else (objects, lists of strings) -> json. The image column is the one named
// image, image_path, file_name, path or filename, else the first whose values name image files;
// it becomes the `image` field and its text the `path` field. A column named `label` of whole
// numbers is the class field (class names "0".."max"); of strings, the class field with the
// sorted distinct strings as class names. Column names that are not identifiers are sanitised
// ([^A-Za-z0-9_] -> '_', a leading digit gets '_'). A mask field's value may be the path of a
// grey 8-bit PNG, relative to the manifest file (what `extract` writes). Integers stay exact:
// one its field cannot hold exactly (beyond int64; beyond 2^53 for float64, 2^24 for float32)
// is a bad row, never rounded.
//
// Thread-safety: pure functions of their arguments and the files they read.
#pragma once

#include <string>
#include <vector>

#include "nlohmann/json_fwd.hpp"
#include "shardfeed/base/status.h"
#include "shardfeed/converter/pack.h"

namespace shardfeed::converter {

struct ImportOptions {
  std::string kind;         // "" (DetectSourceKind) or folder, list, jsonl, csv, coco, webdataset
  std::string schema_json;  // the --schema file's text; "" to infer
  std::string images;       // coco: the image directory (--images)
  std::string captions;     // coco: a COCO captions file (--captions), optional
  std::string list;         // list: the list file (--list); SRC is the root of its paths
  // list/jsonl/csv/webdataset: the class names (--class-names FILE: a JSON list of strings, or
  // one name per line), in class id order. Integer labels must be below their count; string
  // labels are looked up in it (one not listed is a bad row); a source without a class field
  // keeps them as the archive's class names (COCO's: names of per-box labels). "": the
  // importer's own (sorted strings, or "0".."max").
  std::string class_names;
  bool skip_bad = false;             // PackOptions::skip_bad
  std::vector<std::string> exclude;  // folder: paths never to pack (the output's, OutputPaths)
};

// The kinds `--from` takes, "folder|list|jsonl|csv|coco|webdataset|parquet".
const char* SourceKinds();

// What `src` is: a directory of tar files -> webdataset, another directory -> folder, *.jsonl
// (*.ndjson) -> jsonl, *.csv (*.tsv) -> csv, *.json with "images" and "annotations" -> coco,
// *.tar -> webdataset, *.parquet or a directory of them -> parquet. kInvalidArgument naming the
// path and the --from choices otherwise.
Result<std::string> DetectSourceKind(const std::string& src);

// Reads `src` as options.kind (detected when empty). parquet is the Python package's (the CLI
// runs it), refused here.
Result<SourceList> ImportSource(const std::string& src, const ImportOptions& options);

Result<SourceList> ImportJsonl(const std::string& file, const ImportOptions& options);
Result<SourceList> ImportCsv(const std::string& file, const ImportOptions& options);
Result<SourceList> ImportCoco(const std::string& file, const ImportOptions& options);
Result<SourceList> ImportWebDataset(const std::string& src, const ImportOptions& options);

// Shared by the row importers (jsonl, csv), exposed for tests.
//
// Rows: one JSON object per sample, `where` naming it ("a.jsonl:12"). With `text_cells` (CSV)
// every value is a string cell, converted by the field's type (numbers parsed, arrays and json
// parsed as JSON text). Builds the schema (given or inferred), the image column, class names,
// and one SourceItem per row; bad rows as ImportOptions says. `base` is the directory image
// paths are relative to.
struct Row {
  std::string where;
  nlohmann::ordered_json* object;  // owned by the caller
};
Result<SourceList> ImportRows(const std::vector<Row>& rows, const std::vector<std::string>& columns,
                              bool text_cells, const std::string& base,
                              const ImportOptions& options);
// The rows' common end: `objects` parsed from `file` (named by `where`), rows already skipped,
// imported with ImportRows (image paths relative to the file's directory) and tagged `kind`.
// kInvalidArgument when the file holds no row at all.
Result<SourceList> ImportParsedRows(const std::string& file,
                                    std::vector<nlohmann::ordered_json>* objects,
                                    const std::vector<std::string>& where,
                                    const std::vector<SkippedFile>& skipped,
                                    const std::vector<std::string>& columns, bool text_cells,
                                    const ImportOptions& options, const char* kind);

// The value of field `spec` from text (a CSV cell, a WebDataset member): str/bytes as they are,
// numbers parsed, arrays and boxes parsed from JSON text, json checked (plain text becomes a JSON
// string). kInvalidArgument saying what is wrong (callers add where and the field).
// A mask field's value given as PNG bytes (a WebDataset member) is decoded as MaskFromPngBytes.
Status ValueFromText(const format::FieldSpec& spec, const std::string& text, OwnedValue* out);
// A mask (uint8 class ids, HxW) from the bytes of a PNG file, exactly as stored: a grey PNG's
// values (1 to 16 bits; 16-bit ones must all be below 256), a palette PNG's indices (as Pillow's
// "P" mode and VOC's SegmentationClass use them), a colour PNG whose pixels are all grey. Alpha is
// ignored. Refused (kInvalidArgument saying why; the caller names the file): colours, ids above
// 255, data that is not a PNG.
Status MaskFromPngBytes(const std::string& data, OwnedValue* out);

// A field called `name` of type `type` (a type name fields.h parses, e.g. "int64[*]").
format::FieldSpec MakeField(const std::string& name, const std::string& type);

// A field name made of `text`: [^A-Za-z0-9_] -> '_', '_' before a leading digit, at most
// format::kMaxFieldName bytes, "_" for an empty text.
std::string SanitizeFieldName(const std::string& text);

// Checks JSON text an importer reads before anything parses or writes it: kInvalidArgument
// when it nests deeper than format::kMaxJsonDepth + 8 (a value at the limit and the document
// holding it; every JSON library recurses once a level),
// or naming the first integer literal that no 64-bit integer holds (below INT64_MIN or above
// UINT64_MAX), with its line in `text`: nlohmann would keep it as a rounded double, and an
// importer must refuse a value rather than change it. OK otherwise.
Status CheckJsonText(const std::string& text);

// Why `text` is not JSON: nlohmann's reason with its line and column ("syntax error while
// parsing value - invalid literal; last read: 'N'" at line 3, column 20), plus a hint for NaN
// and Infinity (Python's json.dump writes them by default). Empty when it parses.
std::string JsonSyntaxError(const std::string& text);

}  // namespace shardfeed::converter
