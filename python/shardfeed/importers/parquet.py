"""Parquet files and Hugging Face datasets saved to disk -> a shardfeed archive (needs pyarrow).

    python -m shardfeed.importers.parquet SRC OUT [--schema FILE.json] [--overwrite] [pack options]

SRC is a .parquet file, a directory of them (read in sorted name order), or a directory written
by `datasets.Dataset.save_to_disk` (state.json names its *.arrow files in order,
dataset_info.json gives the features). One row is one sample, in the source's order.

The image column: --image-column, else the one the Hugging Face features call Image, else the
first struct {bytes, path} column (an Image feature), else a column named image/img/jpg/png/
webp, else the first binary column, else a string column named path/file/filename/image_path
(a path relative to SRC's directory unless absolute). A struct's `bytes` are used when present,
else its `path`. Every other column becomes a field, its type inferred from the Arrow type:
integers and bools int64 (a column named `label` is the class field; a ClassLabel feature's
names become the class names; a `label` column of strings is the class field too, its sorted
distinct strings the class names, as in the CSV importer), float16/float32 float32, float64 float64, strings str, binary
bytes, dates, times, timestamps and decimals str (ISO 8601, and the decimal's digits), lists
of numbers arrays (`int64[*]`, `float32[*,4]` when the inner lists have a fixed size; a list of
variable-length lists is json, as its rows may be ragged; a column named boxes, bbox or bboxes
of lists of numbers is `boxes`, x0,y0,x1,y1, as in the JSONL and CSV importers), anything else
json. A column whose name is not an identifier becomes the field of its name with every other
character `_` (as in JSONL and CSV: `Unnamed: 0` -> `Unnamed__0`). --schema FILE.json ({name:
type}, as shardfeed.Writer takes it) replaces the inference: its image field takes the image
column, every other field the column of its name (or whose name becomes it).

Exit status: 0 packed, 1 a bad row (without --skip-bad: no archive is written), 2 usage or I/O
error (pyarrow missing, SRC unreadable, OUT refused).
"""
import argparse
import bisect
import glob
import json
import os
import re
import sys

from .. import Writer, _native

_IMAGE_NAMES = ("image", "img", "jpg", "jpeg", "png", "webp")
_PATH_NAMES = ("path", "file", "filename", "file_name", "image_path", "image_file")
# Pack options a single ordered writer does not take, and skip_bad (--skip-bad, below).
_PACK_ONLY = ("shuffle", "seed", "part", "skip_bad")


def _pyarrow():
    try:
        import pyarrow  # noqa: F401
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise SystemExit2("the parquet importer needs pyarrow, which this Python (%s) cannot "
                          "import: install it (pip install pyarrow, or scripts/install-deps.sh)"
                          % sys.executable)
    return pyarrow


class SystemExit2(Exception):
    """A usage or I/O error: exit status 2."""


class Source:
    """The files of SRC in order, the Arrow schema, and the Hugging Face features if any."""

    def __init__(self, src):
        _pyarrow()
        self.src = os.fspath(src)
        self.root = self.src if os.path.isdir(self.src) else os.path.dirname(self.src)
        self.features = {}
        if os.path.isfile(self.src):
            self.files, self.kind = [self.src], "parquet"
        elif os.path.isfile(os.path.join(self.src, "state.json")):
            self.kind = "arrow"
            with open(os.path.join(self.src, "state.json"), encoding="utf-8") as f:
                state = json.load(f)
            self.files = [os.path.join(self.src, d["filename"])
                          for d in state.get("_data_files", [])]
            info = os.path.join(self.src, "dataset_info.json")
            if os.path.isfile(info):
                with open(info, encoding="utf-8") as f:
                    self.features = json.load(f).get("features") or {}
        elif os.path.isfile(os.path.join(self.src, "dataset_dict.json")):
            raise SystemExit2("%s holds several splits (a DatasetDict): give one split's "
                              "directory" % self.src)
        elif os.path.isdir(self.src):
            self.kind = "parquet"
            self.files = sorted(glob.glob(os.path.join(self.src, "**", "*.parquet"),
                                          recursive=True))
        else:
            raise SystemExit2("%s: no such file or directory" % self.src)
        if not self.files:
            raise SystemExit2("%s: no .parquet or .arrow files found" % self.src)
        first = self._open(self.files[0])
        self.schema = first.schema_arrow if self.kind == "parquet" else first.schema
        if not self.features and self.schema.metadata and b"huggingface" in self.schema.metadata:
            meta = json.loads(self.schema.metadata[b"huggingface"])
            self.features = (meta.get("info") or {}).get("features") or {}

    def _open(self, path):
        pa = _pyarrow()
        try:
            if self.kind == "parquet":
                return pa.parquet.ParquetFile(path)
            try:
                return pa.ipc.open_stream(pa.memory_map(path))  # what save_to_disk writes
            except pa.ArrowInvalid:
                return pa.ipc.open_file(pa.memory_map(path))
        except (pa.ArrowException, OSError) as e:
            raise SystemExit2("%s: %s" % (path, e)) from None

    def batches(self, columns=None):
        """Every record batch, in order (of `columns` only where the file allows reading fewer);
        self.starts gets (first row number, file) per file."""
        pa = _pyarrow()
        self.starts, first = [], 0
        for path in self.files:
            self.starts.append((first, path))
            reader = self._open(path)
            batches = reader.iter_batches(batch_size=256, columns=columns) \
                if self.kind == "parquet" else reader
            try:
                for batch in batches:
                    first += batch.num_rows
                    yield batch
            except (pa.ArrowException, OSError) as e:  # damage past the footer
                raise SystemExit2("%s: %s" % (path, e)) from None


def _is_image_struct(t, pa):
    return pa.types.is_struct(t) and {t.field(i).name for i in range(t.num_fields)} >= {
        "bytes", "path"}


def image_column(source, wanted=None):
    pa = _pyarrow()
    names = source.schema.names
    if wanted:
        if wanted not in names:
            raise SystemExit2("--image-column %s: no such column (columns: %s)"
                              % (wanted, ", ".join(names)))
        return wanted
    types = {n: source.schema.field(n).type for n in names}
    for n in names:
        if isinstance(source.features.get(n), dict) and source.features[n].get("_type") == "Image":
            return n
    for n in names:
        if _is_image_struct(types[n], pa):
            return n
    for n in names:
        if n.lower() in _IMAGE_NAMES:
            return n
    for n in names:
        if pa.types.is_binary(types[n]) or pa.types.is_large_binary(types[n]):
            return n
    for n in names:
        if n.lower() in _PATH_NAMES and (pa.types.is_string(types[n]) or
                                         pa.types.is_large_string(types[n])):
            return n
    raise SystemExit2("%s: no image column found (columns: %s); name it with --image-column"
                      % (source.src, ", ".join(names)))


def _elem(t, pa):
    """The array dtype for an Arrow number type, or None."""
    if pa.types.is_boolean(t) or pa.types.is_uint8(t):
        return "uint8"
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint16(t) or pa.types.is_int32(t):
        return "int32"
    if pa.types.is_integer(t):
        return "int64"
    if pa.types.is_float16(t):
        return "float16"
    if pa.types.is_float32(t):
        return "float32"
    if pa.types.is_float64(t):
        return "float64"
    return None


def _list_type(t, pa):
    """"float32[*,4]" for list<fixed_size_list<float, 4>>, ...; None when not numeric lists."""
    dims = []
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        dims.append(str(t.list_size) if pa.types.is_fixed_size_list(t) else "*")
        t = t.value_type
    elem = _elem(t, pa)
    if not dims or elem is None or len(dims) > 4:
        return None
    return "%s[%s]" % (elem, ",".join(dims))


def _temporal(t, pa):
    """Dates, times, timestamps, durations and decimals: stored as text (str)."""
    return (pa.types.is_temporal(t) or pa.types.is_decimal(t))


def _texts(column):
    """A temporal or decimal column as str, the same way for every batch and value, by Arrow's
    own cast: dates 2024-01-02, timestamps ISO 8601 (2024-01-02T03:04:05.000500, its unit's
    digits, Z for UTC), decimals in full (0.00000100), durations as a count with their unit
    (1000000123ns). Python's datetime cannot hold nanoseconds, and printed every batch its own way."""
    pa = _pyarrow()
    t = column.type
    if pa.types.is_decimal(t):  # Arrow writes 0 as 0E-8: Python's "f" format never
        return [None if v is None else format(v, "f") for v in column.to_pylist()]
    text = column.cast(pa.string()).to_pylist()
    if pa.types.is_timestamp(t):
        return [None if v is None else v.replace(" ", "T", 1) for v in text]
    if pa.types.is_duration(t):
        return [None if v is None else v + t.unit for v in text]
    return text


def field_type(t, pa):
    if pa.types.is_dictionary(t):  # pandas' category columns: their values' type
        return field_type(t.value_type, pa)
    if _temporal(t, pa):
        return "str"
    if pa.types.is_boolean(t) or pa.types.is_integer(t):
        return "int64"
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "float32"
    if pa.types.is_floating(t):
        return "float64"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytes"
    array = _list_type(t, pa)
    if array and "*" in array.partition("[")[2].rstrip("]").split(",")[1:]:
        return "json"  # variable-length inner lists: rows may be ragged (--schema says otherwise)
    return array or "json"


_BOX_NAMES = ("boxes", "bbox", "bboxes")


def field_names(source, image_col):
    """column -> field name: the column's own where it is an identifier, else with every other
    character `_` (_native.field_name, the JSONL and CSV importers' rule), `_2`, `_3`... added
    where two columns would share one. The image column keeps no field of its name (the image
    field is `image`): a non-image column called `image` is `image_column`."""
    out, taken = {}, {"image"}
    # A column whose name is a field name keeps it; a sanitised one yields (as JSONL and CSV).
    own = {n for n in source.schema.names
           if n != image_col and n != "image" and _native.field_name(n) == n}
    for n in source.schema.names:
        if n == image_col:
            continue
        base = "image_column" if n == "image" else _native.field_name(n)
        name, k = base, 2
        while name in taken or (name != n and name in own):
            name, k = "%s_%d" % (base, k), k + 1
        taken.add(name)
        out[n] = name
    return out


def _label_strings(source, column):
    """The sorted distinct values of a string `label` column: its class names."""
    seen = set()
    for batch in source.batches(columns=[column]):
        seen.update(v for v in batch.column(column).to_pylist() if v is not None)
    return sorted(seen)


def _is_text(t, pa):
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def infer(source, image_col):
    """(schema dict, class names or None) for the source's columns."""
    pa = _pyarrow()
    schema = {"image": "image"}
    class_names = None
    for n, out_name in field_names(source, image_col).items():
        t = source.schema.field(n).type
        schema[out_name] = field_type(t, pa)
        if n == "label" and _is_text(t, pa):
            # As the CSV and JSONL importers: labels as text are the class field, the sorted
            # distinct strings its class names (class_names= sets another order).
            schema[out_name] = "int64"
            class_names = _label_strings(source, n)
            continue
        list_of_lists = (pa.types.is_list(t) or pa.types.is_large_list(t)) and _list_type(t, pa)
        if n.lower() in _BOX_NAMES and (re.fullmatch(r"\w+\[\*,4\]", schema[out_name]) or (
                list_of_lists and re.fullmatch(r"\w+\[\*,\*\]", list_of_lists))):
            # As the JSONL and CSV importers: lists of 4 numbers under a box name are boxes
            # (x0, y0, x1, y1), which the loader moves with the image's resize, crop and flip.
            schema[out_name] = "boxes"
        feature = source.features.get(n)
        if n == "label" and isinstance(feature, dict) and feature.get("_type") == "ClassLabel":
            class_names = feature.get("names")
    return schema, class_names


def _columns_of(schema, image_field, image_col, source):
    """field name -> column name for every non-image field of `schema`: the column of that name,
    else the one whose name becomes it (field_names)."""
    column_of = {f: c for c, f in field_names(source, image_col).items()}
    out = {}
    for name in schema:
        if name == image_field:
            continue
        col = name if name in source.schema.names and name != "image_column" else \
            column_of.get(name, name)
        if col not in source.schema.names:
            raise SystemExit2("the schema's field %r has no column of that name (columns: %s)"
                              % (name, ", ".join(source.schema.names)))
        out[name] = col
    return out


def _image_value(v, root):
    if isinstance(v, dict):  # a struct {bytes, path}
        if v.get("bytes") is not None:
            return v["bytes"]
        v = v.get("path")
    if isinstance(v, str):
        return v if os.path.isabs(v) else os.path.join(root, v)
    return v


def rows(source, schema, image_col, image_field):
    """The source's samples as Writer dicts (a label given as text is looked up in the
    Writer's class_names, as any Writer label can be)."""
    columns = _columns_of(schema, image_field, image_col, source)
    pa = _pyarrow()
    texts = {c for c in columns.values() if _temporal(source.schema.field(c).type, pa)}
    # A null in a float field is NaN, as the JSONL and CSV importers keep it (pandas' NaN).
    floats = {c for name, c in columns.items()
              if (schema[name].get("type") if isinstance(schema[name], dict) else schema[name])
              in ("float32", "float64")}
    for batch in source.batches():
        data = {c: (_texts(batch.column(c)) if c in texts else batch.column(c).to_pylist())
                for c in set(columns.values()) | {image_col}}
        for c in floats:
            data[c] = [float("nan") if v is None else v for v in data[c]]
        for r in range(batch.num_rows):
            sample = {name: data[col][r] for name, col in columns.items()}
            sample[image_field] = _image_value(data[image_col][r], source.root)
            yield sample


def _located(text, starts):
    """'sample N: ...' (N counting rows over every file) with the file and its row added."""
    head, sep, rest = text.partition(": ")
    if not sep or not head.startswith("sample ") or not head[7:].isdigit() or not starts:
        return text
    n = int(head[7:])
    first, path = starts[bisect.bisect_right([f for f, _ in starts], n) - 1]
    return "sample %d (%s, row %d): %s" % (n, path, n - first, rest)


def _image_field(schema):
    for name, t in schema.items():
        if (t.get("type") if isinstance(t, dict) else t) == "image":
            return name
    raise SystemExit2("the schema has no image field")


def pack_parquet(src, out, schema=None, image_column_name=None, class_names=None, **writer_options):
    """Packs SRC (see the module doc) into OUT with a shardfeed.Writer; returns its report."""
    source = Source(src)
    image_col = image_column(source, image_column_name)
    inferred, names = infer(source, image_col)
    if schema is None:
        schema = inferred
    elif isinstance(schema, (str, os.PathLike)):
        with open(schema, encoding="utf-8") as f:
            schema = json.load(f)
    if class_names is None:
        class_names = names
    image_field = _image_field(schema)
    try:
        with Writer(out, schema=schema, class_names=class_names, **writer_options) as w:
            w.write_many(rows(source, schema, image_col, image_field))
    except ValueError as e:  # a bad row: say which file and row it is
        raise ValueError(_located(str(e), getattr(source, "starts", []))) from None
    report = w.report
    for s in report.get("skipped", []):  # "sample N (file, row R)"
        s["where"] = _located("sample %d: -" % s["sample"], source.starts).rsplit(": ", 1)[0]
    report["source"] = source.src
    report["schema"] = w.schema
    return report


def _options_parser():
    p = argparse.ArgumentParser(
        prog="python -m shardfeed.importers.parquet", allow_abbrev=False,  # --over is no flag
        description="Packs a parquet file or directory, or a Hugging Face dataset saved with "
                    "save_to_disk, into a shardfeed archive (one row per sample).")
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--schema", help="a JSON file {name: type} (shardfeed.Writer's schema)")
    p.add_argument("--image-column", help="the column holding the images")
    p.add_argument("--skip-bad", nargs="?", const="true", default="false",
                   help="skip (and report) rows that do not match the schema")
    p.add_argument("--report", help="write the JSON report to this file")
    # What `shardfeed pack SRC OUT --from parquet ...` passes on (it runs this module).
    p.add_argument("--from", dest="source_kind", default="parquet", help=argparse.SUPPRESS)
    p.add_argument("-q", "--quiet", action="store_true", help="no summary line")
    for flag in _OTHER_SOURCES:
        p.add_argument(flag, default=None, help=argparse.SUPPRESS)
    for o in _native.pack_options():  # pack's options, from its one table
        if o["name"] in _PACK_ONLY:
            if o["name"] != "skip_bad":  # refused below with a reason, not as unknown
                p.add_argument(o["flag"], dest=o["name"], nargs="?", const="true", default=None,
                               help=argparse.SUPPRESS)
            continue
        if o["kind"] == "bool":
            p.add_argument(o["flag"], dest=o["name"], nargs="?", const="true", default=None,
                           help=o["help"])
        else:
            p.add_argument(o["flag"], dest=o["name"], default=None, help=o["help"])
    return p


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
# pack's flags for other kinds of source: refused with a reason rather than as unknown.
_OTHER_SOURCES = ("--list", "--images", "--captions", "--parts-dir", "--class-names")


def _refuse(why):
    """A usage error in one line, as the CLI's (argparse's error() printed its usage block)."""
    print("shardfeed: error: %s" % why, file=sys.stderr)
    raise SystemExit(2)


def main(argv=None):
    parser = _options_parser()
    args = parser.parse_args(argv)
    for name in ("shuffle", "seed", "part"):
        if getattr(args, name, None) is not None:
            _refuse("--%s is not taken by this importer: rows are written in the source's "
                    "order, as one archive" % name)
    if args.source_kind != "parquet":
        _refuse("--from %s: this is the parquet importer" % args.source_kind)
    for flag in _OTHER_SOURCES:
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            _refuse("%s does not apply to a parquet source%s" % (flag, (
                " (a ClassLabel feature gives the class names; from Python, "
                "pack_parquet(..., class_names=[...]))") if flag == "--class-names" else ""))
    if args.skip_bad.lower() not in _TRUE + _FALSE:
        _refuse("--skip-bad takes true or false, not %r" % args.skip_bad)
    args.skip_bad = args.skip_bad.lower() in _TRUE
    overwrite = str(getattr(args, "overwrite", None) or "false").lower() in _TRUE
    if args.report:
        try:
            _native.check_report_path(args.report, overwrite)
        except ValueError as e:
            print("shardfeed: error: %s" % e, file=sys.stderr)
            return 2
    options = {o["name"]: getattr(args, o["name"]) for o in _native.pack_options()
               if o["name"] not in _PACK_ONLY and getattr(args, o["name"]) is not None}
    try:
        report = pack_parquet(args.src, args.out, schema=args.schema,
                              image_column_name=args.image_column, skip_bad=args.skip_bad,
                              **options)
    except SystemExit2 as e:
        print("shardfeed: %s" % e, file=sys.stderr)
        return 2
    except ValueError as e:  # a bad row (or a bad option: the message says which)
        print("shardfeed: %s" % e, file=sys.stderr)
        return 1 if str(e).startswith("sample ") else 2
    except (OSError, RuntimeError) as e:
        print("shardfeed: %s" % e, file=sys.stderr)
        return 2
    if args.report:
        try:
            _native.write_report(args.report, json.dumps(report, indent=2) + "\n", overwrite)
        except (ValueError, OSError, RuntimeError) as e:
            print("shardfeed: warning: %s" % e, file=sys.stderr)
    if args.quiet:
        return 0
    print("packed %d samples from %s into %s (%d skipped)" % (
        report["packed"], report["source"], args.out, report["skipped_count"]))
    for s in report["skipped"][:20]:
        print("  skipped %s: %s" % (s.get("where", "sample %s" % s["sample"]), s["reason"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
