"""Archives from Python samples: shardfeed.Writer and shardfeed.pack_iterable.

    schema = {"image": "image", "label": "int64", "boxes": "boxes",
              "labels": {"type": "int64[*]", "per": "boxes"}, "caption": "str"}
    with shardfeed.Writer("det.sf", schema=schema, class_names=names) as w:
        for image_bytes, label, boxes, box_labels, caption in source:
            w.write({"image": image_bytes, "label": label, "boxes": boxes,
                     "labels": box_labels, "caption": caption})

The native part is converter::SampleWriter (the pipeline `shardfeed pack` and every importer
use): images are encoded per `encoding` on worker threads and appended in write() order. This
module turns each Python value into the field's type first (_Converter), so a bad value is a
ValueError naming the sample and the field at the write() that gives it.
"""
import collections
import collections.abc
import concurrent.futures
import gc
import itertools
import json
import math
import multiprocessing
import numbers
import operator
import os
import re
import sys
import time

import numpy as np

from . import _native

_SCALARS = ("image", "mask", "boxes", "int64", "float32", "float64", "str", "bytes", "json")
_INT64 = (-(1 << 63), (1 << 63) - 1)


class _Bad(Exception):
    """A value that does not match its field: (field name, reason)."""


def _field_kind(type_name):
    """("array", dtype, dims) for "float32[*,4]"; (type_name, None, None) for the others."""
    if type_name in _SCALARS:
        return type_name, None, None
    dtype, _, rest = type_name.partition("[")
    dims = [-1 if d == "*" else int(d) for d in rest.rstrip("]").split(",")]
    return "array", np.dtype(dtype), dims


def _to_numpy(value):
    """(array, strict): numpy arrays and tensors keep their dtype (strict: only safe casts);
    anything else (lists, numbers) is read by numpy and may take any same-kind cast."""
    if isinstance(value, np.ndarray):
        return value, True
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        return value.detach().cpu().numpy(), True
    if type(value).__module__.startswith("PIL."):
        return np.asarray(value), True
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as e:  # ragged nested lists
        raise _Bad("not an array (%s)" % e) from None
    return arr, False


def _check_exact(ints, target):
    """Integers (an array) that a float dtype `target` holds exactly, else _Bad naming the
    first that it would round (as the JSONL importer refuses them): numpy calls int64 ->
    float64 a safe cast, and 2**53 + 1 came back 2**53."""
    limit = 2 ** (np.finfo(target).nmant + 1)  # every integer up to this is exact
    big = ints[(ints > limit) | (ints < -limit)]
    for v in big.flat:
        with np.errstate(over="ignore"):
            stored = target.type(v)
        if np.isfinite(stored) and int(stored) != int(v):  # inf: _check_finite says it
            raise _Bad("integer %d is not exact as %s (give the field an integer type, or "
                       "convert it first)" % (int(v), target.name))


def _cast(arr, strict, target):
    """`arr` as a C-contiguous array of `target`, refusing casts that may lose values."""
    if arr.dtype == target:
        return np.ascontiguousarray(arr)
    src = arr.dtype
    if src.kind in "iu" and target.kind == "f":
        _check_exact(arr, target)
    ok = np.can_cast(src, target, "safe")
    if not ok and arr.size == 0 and src.kind in "biuf":
        ok = True
    if not ok and not strict:  # Python numbers: ints that fit, floats into any float type
        if src.kind in "biu" and target.kind in "iu":
            info = np.iinfo(target)
            ok = bool(arr.min() >= info.min and arr.max() <= info.max)
            if not ok:
                raise _Bad("values outside %s's range" % target.name)
        elif src.kind in "biuf" and target.kind == "f":
            with np.errstate(over="ignore"):
                out = np.ascontiguousarray(arr, dtype=target)
            _check_finite(arr, out, target)
            return out
    if not ok:
        raise _Bad("dtype %s does not cast safely to %s (convert it first, e.g. "
                   ".astype('%s'))" % (src.name, target.name, target.name))
    return np.ascontiguousarray(arr, dtype=target)


def _infinite(value):
    """Whether `value` (a number of any type) is itself an infinity."""
    try:
        return bool(abs(value) == float("inf"))
    except (TypeError, ValueError, ArithmeticError):
        return False


def _check_finite(given, stored, target):
    """A finite number that became inf in `target` is refused (inf and nan given stay)."""
    lost = np.isinf(stored) & np.isfinite(given)
    if lost.any():
        raise _Bad("%r is outside %s's range (largest %g)"
                   % (given[lost].flat[0].item(), target.name, np.finfo(target).max))


def _integers_in(value, out):
    """Appends to `out` the integers nested lists (or tuples) `value` hold: numpy turns them into
    float64 beside a float ([0.5, 2**24 + 1]), so _cast can no longer tell they were integers."""
    if isinstance(value, (list, tuple)):
        for v in value:
            _integers_in(v, out)
    elif isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        out.append(int(value))
    elif getattr(getattr(value, "dtype", None), "kind", "") in ("i", "u"):
        out.extend(int(x) for x in np.asarray(value).reshape(-1))


def _array(value, target, dims):
    arr, strict = _to_numpy(value)
    if not strict and arr.dtype.kind == "f" and target.kind == "f":
        ints = []
        _integers_in(value, ints)
        if ints:
            big = any(abs(i) >= 2 ** 63 for i in ints)
            _check_exact(np.array(ints, dtype=object if big else np.int64), target)
    return _shaped(arr, strict, target, dims)


def _shaped(arr, strict, target, dims):
    """`arr` cast to `target` (see _cast) and checked against the type's dims (-1: any)."""
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise _Bad("not a numeric array (%s)" % arr.dtype)
    arr = _cast(arr, strict, target)
    if arr.size == 0 and arr.ndim == 1 and len(dims) > 1:
        # [] for an empty [*,4] (or [*,*]: [0, 0]), as the JSONL importer reads it
        arr = arr.reshape([0] + [max(d, 0) for d in dims[1:]])
    if arr.ndim != len(dims) or any(w >= 0 and d != w for d, w in zip(arr.shape, dims)):
        raise _Bad("shape %s does not match [%s]" % (
            tuple(arr.shape), ",".join("*" if d < 0 else str(d) for d in dims)))
    return arr


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError("%s is not JSON serializable" % type(value).__name__)


def _class_names(names):
    """class_names as given: a list of distinct names (str, or int taken as its text)."""
    if isinstance(names, (str, bytes)) or not isinstance(names, collections.abc.Iterable):
        raise TypeError("class_names is a list of names, not %s" % type(names).__name__)
    out = []
    for i, c in enumerate(names):
        if isinstance(c, (bool, np.bool_)) or not isinstance(c, (str, numbers.Integral)):
            raise TypeError("class_names[%d]: a name is a str, not %s" % (i, type(c).__name__))
        out.append(c if isinstance(c, str) else str(int(c)))  # numpy ints too
    if not out:
        raise ValueError("class_names is empty: no label could name a class (leave it out for "
                         "names '0'..'max label')")
    if len(out) > _native.max_class_id + 1:
        raise ValueError("class_names has %d names; an archive has at most %d classes"
                         % (len(out), _native.max_class_id + 1))
    seen = {}
    for i, c in enumerate(out):
        if c in seen:
            raise ValueError("class_names[%d]: %r is also class_names[%d]; each class needs its "
                             "own name (extract writes a folder per name)" % (i, c, seen[c]))
        seen[c] = i
    return out


def _local_out(out, command):
    """out as a local path; an s3:// or http(s):// OUT is the CLI's (docs/REMOTE.md, "Writing"):
    refused here rather than written to a local folder named 's3:'."""
    out = os.fspath(out)
    if isinstance(out, str) and re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", out):
        cli = ("write to s3:// with the CLI (shardfeed %s ... %s), or " % (command, out)
               if command in ("pack", "merge", "convert") else "")
        raise ValueError("%s: shardfeed.%s writes a local folder; %swrite locally and upload "
                         "(shardfeed convert LOCAL %s)" % (out, command, cli, out))
    return out


class _Converter:
    """Turns a sample (a dict of fields, or a tuple in schema order) into what the native writer
    takes: (image, label, values). Picklable: pack_iterable's worker processes use it."""

    def __init__(self, fields, class_names):
        self.fields = fields  # [{"name", "type"[, "per"]}] as canonical_schema gives them
        self.names = [f["name"] for f in fields]
        self.kinds = [_field_kind(f["type"]) for f in fields]
        self.image = next(i for i, k in enumerate(self.kinds) if k[0] == "image")
        self.label = next((i for i, f in enumerate(fields)
                           if f["name"] == "label" and f["type"] == "int64"), -1)
        self.classes = len(class_names) if class_names is not None else None
        # A label given as a class name: its index in class_names.
        self.ids = ({name: i for i, name in enumerate(class_names)}
                    if class_names is not None else None)
        self.known = frozenset(self.names)

    def __call__(self, sample):
        if not isinstance(sample, collections.abc.Mapping):
            if isinstance(sample, (tuple, list)) and len(sample) == len(self.names):
                sample = dict(zip(self.names, sample))
            elif isinstance(sample, (tuple, list)):
                raise _Bad(None, "a %s of %d values for a schema of %d fields (%s, in that order)"
                           % (type(sample).__name__, len(sample), len(self.names),
                              ", ".join(self.names)))
            else:
                raise _Bad(None, "a sample is a dict of the schema's fields (%s) or a tuple of "
                           "them in that order, not %s" % (", ".join(self.names),
                                                          type(sample).__name__))
        unknown = [k for k in sample if k not in self.known]
        if unknown:
            raise _Bad(str(unknown[0]), "not in the schema (fields: %s)" % ", ".join(self.names))
        values = [None] * len(self.names)
        for i, name in enumerate(self.names):
            if name not in sample:
                raise _Bad(name, "missing")
            try:
                values[i] = self._value(i, sample[name])
            except _Bad as e:
                raise _Bad(name, e.args[0]) from None
        for i, f in enumerate(self.fields):
            per = f.get("per")
            if per:
                rows = values[self.names.index(per)].shape[0]
                if values[i].shape[0] != rows:
                    raise _Bad(f["name"], "%d rows, its boxes field '%s' has %d" % (
                        values[i].shape[0], per, rows))
        label = values[self.label] if self.label >= 0 else 0
        return values[self.image], label, values

    def _class_id(self, name):
        if self.ids is None:
            raise _Bad("label %r is a class name, and the Writer has no class_names to look it "
                       "up in" % name)
        if name not in self.ids:
            raise _Bad("label %r is not one of the %d class_names" % (name, self.classes))
        return self.ids[name]

    def _value(self, i, v):
        kind, dtype, dims = self.kinds[i]
        if kind == "image":
            return self._image(v)
        if kind == "int64":
            if i == self.label and isinstance(v, str):
                return self._class_id(v)
            if isinstance(v, (float, str, bytes)) or v is None:
                raise _Bad("an int64 field takes a whole number, not %r" % (v,))
            try:
                x = operator.index(v)
            except TypeError:
                raise _Bad("an int64 field takes a whole number, not %s"
                           % type(v).__name__) from None
            if i == self.label:
                limit = _native.max_class_id + 1
                if self.classes is not None:
                    limit = min(limit, self.classes)
                if not 0 <= x < limit:
                    raise _Bad("label %d outside 0..%d%s" % (
                        x, limit - 1, " (class_names has %d names)" % self.classes
                        if self.classes is not None else " (an archive has at most %d classes)"
                        % limit))
            elif not _INT64[0] <= x <= _INT64[1]:
                raise _Bad("%d does not fit in int64" % x)
            return x
        if kind in ("float32", "float64"):
            if isinstance(v, (str, bytes)) or v is None:
                raise _Bad("a %s field takes a number, not %r" % (kind, v))
            if not isinstance(v, numbers.Number) and hasattr(v, "dtype"):
                # A 0-d (or one-element) array or tensor of integers, or of objects holding
                # one: checked as the int it holds (float() rounded 2**24 + 1 without a word).
                arr, _ = _to_numpy(v)
                held = arr.reshape(-1)[0] if arr.size == 1 else None
                if arr.size == 1 and (arr.dtype.kind in "biu" or (
                        arr.dtype == object and isinstance(held, numbers.Integral))):
                    v = int(held)
            try:
                x = float(v)
            except (TypeError, ValueError):
                raise _Bad("a %s field takes a number, not %s" % (kind, type(v).__name__)) from None
            except OverflowError:  # an int (or Fraction) above float64's range
                if isinstance(v, numbers.Integral):
                    raise _Bad("a whole number of %d bits is outside %s's range"
                               % (int(v).bit_length(), kind)) from None
                raise _Bad("%s is outside %s's range" % (type(v).__name__, kind)) from None
            if math.isinf(x) and not _infinite(v):  # np.longdouble, Decimal beyond float64
                raise _Bad("%s is outside float64's range" % (v,))
            if isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)):
                _check_exact(np.array([int(v)], dtype=object if abs(int(v)) >= 2 ** 63
                                      else np.int64), np.dtype(kind))
            if kind == "float32":
                with np.errstate(over="ignore"):
                    _check_finite(np.float64(x), np.float32(x), np.dtype(np.float32))
            return x
        if kind == "str":
            if not isinstance(v, str):
                raise _Bad("a str field takes str, not %s" % type(v).__name__)
            try:
                return v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise _Bad("not encodable as UTF-8 (%s)" % e.reason) from None
        if kind == "bytes":
            if isinstance(v, (bytes, bytearray, memoryview)):
                return bytes(v)
            if isinstance(v, np.ndarray) and v.dtype == np.uint8:
                return v.tobytes()
            raise _Bad("a bytes field takes bytes, not %s" % type(v).__name__)
        if kind == "json":
            try:  # UTF-8 first: a lone surrogate is a ValueError here (a bad value, skippable)
                text = json.dumps(v, ensure_ascii=False, allow_nan=False,
                                  default=_json_default).encode("utf-8")
            except (TypeError, ValueError) as e:
                raise _Bad("not JSON-serializable (%s)" % e) from None
            try:  # the importers' rule: integers no 64-bit integer holds, depth (one function)
                _native.check_json_text(text)
            except ValueError as e:
                raise _Bad(str(e)) from None
            return text
        if kind == "boxes":
            return _array(v, np.dtype(np.float32), [-1, 4])
        if kind == "mask":
            arr, strict = _to_numpy(v)
            if arr.ndim == 3 and arr.shape[2] == 1:
                arr = arr[:, :, 0]
            return _shaped(arr, strict, np.dtype(np.uint8), [-1, -1])
        return _array(v, dtype, dims)

    def _image(self, v):
        if isinstance(v, (bytes, bytearray, memoryview)):
            return v
        if isinstance(v, (str, os.PathLike)):
            # Read by a worker; one that cannot be read is skipped and listed, as pack's files.
            return os.path.abspath(os.fspath(v))
        if type(v).__module__.startswith("PIL."):
            v = v.convert("RGB")
        arr, strict = _to_numpy(v)
        if arr.ndim == 2:
            arr = np.repeat(arr[:, :, None], 3, axis=2)
        elif arr.ndim == 3 and arr.shape[2] == 1:
            arr = np.repeat(arr, 3, axis=2)
        if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
            raise _Bad("an image is encoded bytes, a file path, a PIL image or a uint8 array "
                       "of shape (H, W, 3), not %s %s" % (arr.dtype, tuple(arr.shape)))
        if not (0 < arr.shape[0] <= 65535 and 0 < arr.shape[1] <= 65535):
            raise _Bad("image shape %s: H and W must be in 1..65535" % (tuple(arr.shape),))
        return np.ascontiguousarray(arr)


def _canonical(schema):
    """The schema as a dict or a JSON file's path -> [{"name", "type"[, "per"]}] (checked)."""
    if schema is None:
        schema = {"image": "image", "label": "int64"}
    if isinstance(schema, (str, os.PathLike)):
        with open(schema, encoding="utf-8") as f:
            text = f.read()
    elif isinstance(schema, collections.abc.Mapping):
        text = json.dumps(dict(schema))
    else:
        raise ValueError("schema must be a dict {name: type} or a JSON file's path, not %s"
                         % type(schema).__name__)
    return json.loads(_native.canonical_schema(text))


class Writer:
    """Writes an archive from Python samples. A context manager:

        with shardfeed.Writer("out.sf", schema={"image": "image", "label": "int64",
                                                "caption": "str"}) as w:
            w.write({"image": jpeg_bytes, "label": 3, "caption": "a cat"})

    schema: {name: type} in field order (types of docs/FORMAT.md, "Fields": image, mask,
    boxes, int64, float32, float64, str, bytes, json, "<dtype>[<dims>]"; a per-box field as
    {"type": "int64[*]", "per": "boxes"}), or the path of such a JSON file. Default: image and
    label. A field named "label" of type int64 is the class field (0 <= label <= 4194303, and below
    len(class_names) when given; without class_names they are "0".."max label"). With
    class_names, a label may also be given as a class name (a str): its index in class_names.

    Values: the image as encoded bytes (JPEG, PNG, WebP...), a file path (str or pathlib; read
    by a worker thread), a PIL image, or a uint8 (H, W, 3) array / tensor; arrays, boxes and
    masks as numpy arrays or tensors of a dtype that casts safely to the field's (any
    C-contiguous-convertible layout), or nested lists (Python numbers: ints that fit, floats
    into float fields); masks (H, W) in the stored image's pixels (an (H, W, 1) array too);
    boxes (n, 4) x0, y0, x1, y1 in the stored image's pixels; str as str, bytes as bytes; json
    any JSON-serializable object (numpy values included: a str is stored as a JSON string).
    A sample is a dict of every field (or a tuple in schema order); a missing or unknown field,
    a value of the wrong type or shape, a per-box field whose rows differ from its boxes' or a
    mask whose shape is not the image's raises ValueError "sample N: field 'name': reason"
    (N counts write() calls from 0); with skip_bad=True the sample is skipped and listed in
    `writer.skipped` ({"sample": N, "reason"}), as are images that do not decode (always).

    Options as `shardfeed pack` (the same names and checks): encoding ('auto': JPEG bytes kept,
    other images lossless zstd pixels; 'jpeg', 'raw', 'zstd'), quality, level, size, max_side,
    crop, validate, jpeg_layout, workers (encoding threads; 0: all cores), backend ('lmdb',
    'hdf5'), shard_size, chunk_size, max_pixels, strict, overwrite (replace an existing archive
    at `out`, never anything else).

    Atomic: nothing is at `out` until the with-block exits cleanly (close()); an exception in
    the block (or abort(), or a Writer dropped unclosed) leaves `out` as it was. Samples are
    stored in write() order. Not thread-safe: write from one thread (a second thread calling
    in while another is inside raises RuntimeError).
    """

    def __init__(self, out, schema=None, encoding="auto", workers=0, overwrite=False,
                 skip_bad=False, class_names=None, **options):
        self.out = _local_out(out, "Writer")
        fields = _canonical(schema)
        if class_names is not None:
            class_names = _class_names(class_names)
            if not any(f["name"] == "label" and f["type"] == "int64" for f in fields):
                raise ValueError("class_names name the values of the class field, a field "
                                 "'label' of type int64, and the schema has none")
        self._convert = _Converter(fields, class_names)
        self._skip_bad = bool(skip_bad)
        self._skipped = []   # bad samples found here (the native writer keeps its own)
        self._count = 0      # write() calls so far: the next sample's number
        self.report = None   # close()'s report
        self._open = False
        self._native = _native.Writer(self.out, json.dumps(fields), class_names,
                                      self._skip_bad, encoding=encoding, workers=workers,
                                      overwrite=overwrite, **options)
        self._open = True

    @property
    def schema(self):
        """{name: type} (per-box fields {"type", "per"}), as Archive.schema gives it."""
        return _fields_dict(self._convert.fields)

    @property
    def written(self):
        """Samples given to write() so far (skipped ones included)."""
        return self._count

    @property
    def skipped(self):
        """[{"sample": N, "reason"}] of the samples skipped so far, in sample order."""
        out = list(self._skipped)
        out += [{"sample": n, "reason": r} for n, r in self._native.skipped]
        out.sort(key=lambda s: s["sample"] if isinstance(s["sample"], int) else -1)
        return out

    def write(self, sample):
        """Queues one sample (see the class doc). Raises ValueError for a bad sample (unless
        skip_bad) and any failure the writer found in an earlier sample (the message names
        it); after such a failure the writer writes nothing more."""
        if not self._open:
            raise ValueError("this Writer is closed")
        n = self._count
        self._count += 1
        try:
            image, label, values = self._convert(sample)
        except _Bad as e:
            self._bad(n, *e.args)
            return
        self._native.write(n, image, label, values)

    def _write_prepared(self, n, prepared):
        # pack_iterable: a sample a worker process converted (or the _Bad it raised).
        if not self._open:
            raise ValueError("this Writer is closed")
        self._count = n + 1
        if isinstance(prepared, _Bad):
            self._bad(n, *prepared.args)
        else:
            self._native.write(n, *prepared)

    def _bad(self, n, field, reason):
        what = "field '%s': %s" % (field, reason) if field is not None else reason
        if not self._skip_bad:  # nothing of it was queued: the writer goes on if the caller does
            raise ValueError("sample %d: %s" % (n, what))
        self._skipped.append({"sample": n, "reason": what})

    def write_many(self, samples):
        """write() for each sample of an iterable, or of a map-style Dataset without __iter__
        (len() and [i]: samples[0] .. samples[len - 1], in index order); returns how many were
        given."""
        start = self._count
        if _map_style(samples) and not hasattr(type(samples), "__iter__"):
            # Not `for s in samples`: a torch Dataset has no __iter__, and Python's fallback
            # calls [0], [1], ... until IndexError, which most Datasets never raise: the pack
            # ran until the disk was full.
            source = samples
            samples = (source[i] for i in range(len(source)))
        for s in samples:
            self.write(s)
        return self._count - start

    def close(self):
        """Writes what is queued and the manifest, then moves the archive into place; returns
        the report ({"output", "packed", "skipped", "payload_bytes", "seconds", ...}). A failure
        raises and leaves `out` as it was. Idempotent once it succeeded."""
        if not self._open:
            if self.report is None:
                raise ValueError("this Writer was aborted or failed: no archive written")
            return self.report
        self._open = False
        report = self._native.finish()
        report["skipped"] = self.skipped
        report["skipped_count"] = len(report["skipped"])
        report["total"] = self._count
        self.report = report
        return report

    def abort(self):
        """Drops everything written so far; `out` stays as it was. Idempotent."""
        self._open = False
        self._native.abort()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __repr__(self):
        return "shardfeed.Writer(%r, written=%d)" % (self.out, self._count)


# pack_iterable's worker processes: the source and the converter, set by the pool's initializer.
_SOURCE = None


def _init_worker(source, convert):
    global _SOURCE
    _SOURCE = (source, convert)


def _produce(span):
    """Samples [start, stop) of the source, each converted (or the _Bad it raised)."""
    source, convert = _SOURCE
    out = []
    for i in range(*span):
        try:
            out.append(convert(source[i]))
        except _Bad as e:
            out.append(e)
    return out


def _map_style(source):
    if isinstance(source, (str, bytes, collections.abc.Mapping)):
        return False
    torch_data = sys.modules.get("torch.utils.data")
    if torch_data is not None and isinstance(source, torch_data.IterableDataset):
        return False
    return hasattr(source, "__len__") and hasattr(source, "__getitem__")


def pack_iterable(iterable, out, schema=None, workers=0, chunk=64, timeout=None,
                  **writer_options):
    """Writes every sample of `iterable` to an archive at `out` through one Writer (its
    options: encoding, class_names, skip_bad, overwrite, backend, ...; `encode_workers` is the
    Writer's `workers`, its encoding threads) and returns the report (Writer.close()'s, plus
    "samples_per_second").

    A sequence or map-style torch.utils.data.Dataset (len() and [i]) with workers > 1 is read
    by that many processes (forked, so the dataset is not pickled), each producing and
    converting `chunk` consecutive samples at a time, at most 2 x workers chunks ahead of the
    writer (memory stays bounded); the archive holds them in index order whatever `workers`
    is. A worker process that dies raises concurrent.futures.process.BrokenProcessPool;
    `timeout` (seconds, None: no limit) bounds the wait for one chunk (TimeoutError). Any
    other iterable (a generator, an IterableDataset) is read in this process, in its order.
    Samples: dicts of the schema's fields, or tuples in schema order (a Dataset's (image,
    label)). Any exception stops the pack and leaves `out` as it was."""
    out = _local_out(out, "pack_iterable")
    if "workers" in writer_options:
        raise TypeError("pack_iterable: workers is the number of producing processes; the "
                        "Writer's encoding threads are encode_workers")
    encode_workers = writer_options.pop("encode_workers", 0)
    t0 = time.monotonic()
    workers = int(workers)
    if workers > 1 and _map_style(iterable):
        report = _pack_in_processes(iterable, out, schema, workers, max(1, int(chunk)), timeout,
                                    encode_workers, writer_options)
    else:
        with Writer(out, schema=schema, workers=encode_workers, **writer_options) as w:
            w.write_many(iterable)
        report = w.report
    seconds = time.monotonic() - t0
    report["seconds"] = seconds
    report["samples_per_second"] = report["packed"] / seconds if seconds > 0 else 0.0
    return report


def _pack_in_processes(source, out, schema, workers, chunk, timeout, encode_workers, options):
    fields = _canonical(schema)
    names = options.get("class_names")
    convert = _Converter(fields, None if names is None else _class_names(names))
    n = len(source)
    spans = iter([(s, min(s + chunk, n)) for s in range(0, n, chunk)])
    # Fork: the children inherit the source (nothing pickled). With fork, the executor starts
    # every process at the first submit, so they are forked before the Writer starts threads.
    ctx = multiprocessing.get_context("fork")
    # Collect the garbage before forking: an earlier executor left in a reference cycle (one that
    # an earlier failed pack shut down without waiting) would otherwise be collected in a child,
    # and its weakref callback takes that executor's lock, which its manager thread may have held
    # at the fork: the child then waits for ever (seen 1 run in 20 of the writer tests).
    gc.collect()
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx,
                                                  initializer=_init_worker,
                                                  initargs=(source, convert))
    pending = collections.deque()
    ok = False
    try:
        for span in itertools.islice(spans, 2 * workers):
            pending.append((span, pool.submit(_produce, span)))
        with Writer(out, schema=_fields_dict(fields), workers=encode_workers, **options) as w:
            while pending:
                span, future = pending.popleft()
                batch = future.result(timeout)
                nxt = next(spans, None)
                if nxt is not None:
                    pending.append((nxt, pool.submit(_produce, nxt)))
                for k, prepared in enumerate(batch):
                    w._write_prepared(span[0] + k, prepared)
        ok = True
    finally:
        if not ok:
            # Stop at once: a chunk still running (a stuck dataset, a timeout) is not waited
            # for; its process is ended (the executor keeps its processes privately).
            procs = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
        else:
            pool.shutdown(wait=True)
    return w.report


def _fields_dict(fields):
    """[{"name", "type"[, "per"]}] -> {name: type or {"type", "per"}} (a Writer's schema)."""
    return {f["name"]: ({"type": f["type"], "per": f["per"]} if f.get("per") else f["type"])
            for f in fields}
