"""shardfeed: packed image archives, read zero-copy into training.

    import shardfeed
    shardfeed.pack("train/", "train.sf")                 # ImageFolder -> archive
    archive = shardfeed.Archive("train.sf")
    image, label = archive[0]                            # HWC uint8 numpy array, int
    archive.schema, archive.sample(0)                    # every field: {"image": ..., ...}
    with shardfeed.Writer("mine.sf", schema={"image": "image", "caption": "str"}) as w:
        w.write({"image": jpeg_bytes, "caption": "a cat"})   # from any Python source
    loader = shardfeed.Loader("train.sf", batch_size=64, shuffle=True, crop="random", size=224)
    for epoch in range(10):
        loader.set_epoch(epoch)
        for images, labels in loader:                    # numpy views into the pinned ring
            ...

`shardfeed.torch` has the PyTorch-facing loader and a map-style Dataset.
"""
import collections.abc
import operator
import os
import weakref

from . import _native
from .writer import Writer, _local_out, pack_iterable
from ._native import (DataError, Error, LoaderBusy, StorageError, Timeout, WorkerError,
                      cuda_available, cuda_kernels_built, cuda_unavailable_reason, fetch_stats)

__all__ = ["Archive", "Loader", "Batch", "Writer", "pack_iterable", "pack", "merge", "convert", "verify", "inspect", "stats", "Error",
           "DataError", "StorageError", "LoaderBusy",
           "WorkerError", "Timeout", "cuda_available", "cuda_unavailable_reason",
           "cuda_kernels_built", "fetch_stats"]

__version__ = "0.1.0"


class Archive:
    """An opened archive. Opens its file mapping lazily in each process that uses it, so an
    Archive created before fork() (or pickled into DataLoader workers) works in the child.
    Opening it and reading from it release the GIL while they wait (a remote shard's download):
    other Python threads run meanwhile, and several threads may read one Archive at once. Ctrl-C
    while a remote archive opens raises KeyboardInterrupt within about a second (its downloads
    are cancelled)."""

    def __init__(self, path, index_check="auto", cache_dir=None, cache_limit=None):
        """index_check: 'full' checks every shard and index entry at open (O(samples)); 'lazy'
        opens a shard when first read and checks each index entry as it is read, so open and the
        first batch cost the same whatever the archive's size (for ranks of large jobs; verify()
        still checks everything); 'auto' is full up to 4M samples, lazy above (and lazy for a
        remote archive whose cache_limit is below its shard bytes).

        Remote archives (s3://bucket/prefix, http(s)://host/path, docs/REMOTE.md): cache_dir is
        the local cache folder (default $SHARDFEED_CACHE_DIR, else $XDG_CACHE_HOME/shardfeed),
        cache_limit its size in bytes or as '20GB' / '512MiB' (default $SHARDFEED_CACHE_LIMIT,
        else unlimited)."""
        self.path = os.fspath(path)
        self.index_check = index_check
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.cache_limit = cache_limit
        self._native = None
        self._pid = None
        self._handle()  # fail early on a bad path

    def _handle(self):
        if self._native is None or self._pid != os.getpid():
            self._native = _native.Archive(self.path, self.index_check, self.cache_dir,
                                           self.cache_limit)
            self._pid = os.getpid()
        return self._native

    def __getstate__(self):
        return {"path": self.path, "index_check": self.index_check,
                "cache_dir": self.cache_dir, "cache_limit": self.cache_limit}

    def __setstate__(self, state):
        self.path = state["path"]
        self.index_check = state.get("index_check", "auto")
        self.cache_dir = state.get("cache_dir")
        self.cache_limit = state.get("cache_limit")
        self._native = None
        self._pid = None

    def __len__(self):
        return len(self._handle())

    def _index(self, index):
        """A sample index as an int in [0, len): negative ones count from the end; anything but
        an integer is a TypeError, out of range an IndexError (never pybind's raw message)."""
        try:
            if isinstance(index, bool):  # an int subclass: archive[True] read sample 1
                raise TypeError
            i = operator.index(index)
        except TypeError:
            raise TypeError("archive indices must be integers, not %s" %
                            type(index).__name__) from None
        n = len(self._handle())
        if not -n <= i < n:
            raise IndexError("sample %d out of range: the archive has %d samples" % (i, n))
        return i + n if i < 0 else i

    def __getitem__(self, index):
        """(image, label): the sample decoded to an upright HWC uint8 RGB array, and its class id
        (None when the samples have no class field, as a COCO pack's per-box labels). Reads
        the image record alone: damage in other fields is sample()'s error, not this one's."""
        return self._handle()[self._index(index)]

    @property
    def schema(self):
        """The fields every sample has, in order: {name: type} (type names of docs/FORMAT.md,
        "Fields"), a per-box field as {"type": ..., "per": "boxes"}. Archives written before
        format version 4: {"image": "image", "label": "int64"}."""
        return self._handle().schema

    def sample(self, index):
        """Every field of a sample as a dict, checksums checked: the image decoded upright (HWC
        uint8 RGB, as archive[i]), the label and other int64 and float64 fields as Python
        numbers, float32 fields as numpy float32 scalars (the stored value and type),
        arrays and boxes as numpy arrays (read-only views into the archive's mapping when
        aligned, which keep it open; copies otherwise), a mask as an (H, W) uint8 array, str
        as str, bytes as bytes, json parsed. Boxes and masks are stored in the stored image's
        pixels; for a JPEG with an EXIF orientation they are turned with the image, so they
        always match the upright image returned here."""
        return self._handle().sample(self._index(index))

    @property
    def class_names(self):
        return self._handle().class_names

    @property
    def encoding(self):
        return self._handle().encoding

    @property
    def shape(self):
        """(H, W, 3) when every record has that shape, else None."""
        return self._handle().shape

    def labels(self):
        """Every sample's class id (int64 array); None when the samples have no class field."""
        return self._handle().labels()

    def record(self, index):
        """The stored payload bytes of a sample (read-only, zero-copy view into the map)."""
        return self._handle().record(self._index(index))

    def __repr__(self):
        return "shardfeed.Archive(%r, samples=%d, encoding=%s)" % (self.path, len(self), self.encoding)


class Batch(tuple):
    """(images, labels) plus the archive indices of the samples, the epoch and the batch's
    number in it. `images` points into the loader's ring slot; the slot is reused only after
    every view of it (and tensor made from it) is gone. `labels` and `indices` are arrays of
    their own: keeping them holds nothing. `labels` is the schema's class field ("label"), None
    when it has none.

    Fields (the loader's `fields` option, every field of the schema by default): batch["name"]
    gives a field, built on first access. Fixed-size fields (int64, float32, float64, fixed
    arrays) and masks come stacked in one array (N, ...) (masks (N, H, W) uint8, cropped,
    flipped and resized with their images); variable-length fields (boxes, arrays with a "*"
    dim) as a list of per-sample arrays, or with ragged="offsets" as one (values, offsets) pair
    (sample i is values[offsets[i]:offsets[i + 1]]); str, bytes and json as Python lists (json
    parsed). Boxes are in the output image's pixels (x0, y0, x1, y1), clipped to it; boxes left
    narrower or lower than 1 pixel are dropped together with the rows of every field declared per
    them. batch["image"] (or "images") and batch["label"] are `images` and `labels`. Every array is a view of
    the batch (it holds the ring slot like `images`)."""

    def __new__(cls, images, labels, indices, epoch, number, fields=None):
        b = super().__new__(cls, (images, labels))
        b.images, b.labels, b.indices, b.epoch, b.number = images, labels, indices, epoch, number
        b._fields, b._cache = fields, {}
        return b

    def keys(self):
        """The names batch[name] takes: "image", "label" (when the schema has one) and every
        field carried."""
        names = ["image"] + (["label"] if self.labels is not None else [])
        return names + (list(self._fields.names()) if self._fields is not None else [])

    def __getitem__(self, key):
        if not isinstance(key, str):
            return tuple.__getitem__(self, key)
        carried = self._fields is not None and key in self._fields.names()
        if key in ("image", "images") and not carried:
            return self.images
        if key == "label" and self.labels is not None:
            return self.labels
        if key not in self._cache:
            try:
                if self._fields is None:
                    raise KeyError(key)
                self._cache[key] = self._fields.get(key)
            except KeyError:
                raise KeyError("%r: this batch carries %s (the loader's fields option chooses "
                               "them)" % (key, ", ".join(self.keys()))) from None
        return self._cache[key]

    def __reduce__(self):
        # Pickled (an mp.Queue, a spawn child, copy.deepcopy, torch.save): the arrays as copies
        # and every field carried as its value; the copy holds no ring slot.
        fields = None
        if self._fields is not None:
            fields = _FieldValues({n: self._fields.get(n) for n in self._fields.names()},
                                  self._fields.has_label)
        return (Batch, (self.images, self.labels, self.indices, self.epoch, self.number, fields))


class _FieldValues:
    """A batch's fields as plain values: what an unpickled Batch carries (no ring slot)."""

    def __init__(self, values, has_label):
        self._values, self.has_label = values, has_label

    def names(self):
        return list(self._values)

    def get(self, name):
        if name not in self._values:
            raise KeyError(name)
        return self._values[name]


_STATE_KEYS = ("epoch", "position", "seed", "plan_start", "consumed", "world_size", "batch_size")


def _whole(value, what, minimum=0, maximum=(1 << 63) - 1):
    """A whole number in minimum..maximum (ints, numpy ints, 0-d tensors), else ValueError naming
    `what` (the native side takes 64-bit numbers: 2**64 was a pybind TypeError at the next
    iter())."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise ValueError("%s must be a whole number, not %r" % (what, value)) from None
    if v < minimum:
        raise ValueError("%s must be at least %d, not %d" % (what, minimum, v))
    if v > maximum:
        raise ValueError("%s must be at most %d, not %d" % (what, maximum, v))
    return v


def _checked_state(state):
    if not isinstance(state, collections.abc.Mapping):
        raise ValueError("load_state_dict takes the dict Loader.state_dict() returned, not %s"
                         % type(state).__name__)
    unknown = sorted(str(k) for k in state if k not in _STATE_KEYS)
    if unknown:
        raise ValueError("load_state_dict: unexpected key(s) %s: it takes the dict "
                         "Loader.state_dict() returned (keys %s)"
                         % (", ".join(map(repr, unknown)), ", ".join(_STATE_KEYS)))
    missing = [k for k in ("epoch", "position") if k not in state]
    if missing:
        raise ValueError("load_state_dict: the state has no %s" % " or ".join(map(repr, missing)))
    return {k: _whole(v, "load_state_dict: %r" % k,
                      1 if k in ("world_size", "batch_size") else 0) for k, v in state.items()}


# DataLoader's names, for a hint when one is given to shardfeed.Loader.
_DATALOADER_NAMES = {"num_workers": "workers", "prefetch_factor": "prefetch",
                     "pin_memory": None, "persistent_workers": None, "collate_fn": None,
                     "sampler": None, "batch_sampler": None, "worker_init_fn": None,
                     "generator": None, "multiprocessing_context": None}




def _channels(value, name):
    """mean/std as a list of 1 or 3 floats, from a number or any sequence (numpy arrays and
    tensors included)."""
    if isinstance(value, (str, bytes)):
        return value  # the option's own text form ("0.5,0.5,0.5"), parsed natively
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, collections.abc.Iterable):
        value = [value]
    try:
        out = [float(v) for v in value]
    except (TypeError, ValueError):
        raise ValueError("%s must be one number or three (R, G, B), not %r" % (name, value)) from None
    return out


def _checked_options(options):
    """The keyword options as the native loader takes them: DataLoader's names raise TypeError
    saying so (any other unknown name: the native loader's TypeError with the closest name, the
    CLI's own suggestion); workers=0 is refused (DataLoader's num_workers=0 means something
    else); mean/std may be any sequence, in 0..1 units or, when some mean is above 1, 0..255."""
    for name in options:
        if name in _DATALOADER_NAMES:
            same = _DATALOADER_NAMES[name]
            raise TypeError("unexpected loader option %r (that is DataLoader's name%s; "
                            "shardfeed.torch.Loader takes it)"
                            % (name, ": here it is %r" % same if same else ""))
    options = dict(options)
    workers = options.get("workers")
    if not isinstance(workers, (str, bool)) and workers is not None and workers == 0:
        raise ValueError(
            "workers=0 is ambiguous: DataLoader's num_workers=0 loads in the main process, "
            "shardfeed's --workers 0 means every CPU. Say workers='auto' (tuned, the default), "
            "a number of workers, or workers=os.cpu_count()")
    for name in ("mean", "std"):
        if options.get(name) is not None:
            options[name] = _channels(options[name], name)
    mean = options.get("mean")
    if isinstance(mean, list) and any(m > 1 for m in mean):
        # 0..255 units (mmcv/timm configs): a mean of 0..1 data is never above 1.
        if not isinstance(options.get("std"), list):
            raise ValueError("mean=%r is in 0..255 units: give std in the same units too "
                             "(e.g. std=(58.4, 57.1, 57.4))" % (mean,))
        options["mean"] = [m / 255 for m in mean]
        options["std"] = [v / 255 for v in options["std"]]
    return options


class _Pass:
    """The iterator of one pass over a Loader (see Loader.__iter__)."""

    def __init__(self, loader, native, epoch, number, stream):
        self._loader, self._native, self._epoch = loader, native, epoch
        self._number, self._stream = number, stream
        self.done = False
        # Whether __next__ marks each batch handed out; a layer that converts batches further
        # (shardfeed.torch) sets it False and marks them itself (`native.held = None`).
        self.marks_handed_out = True
        # Whether the next native call may take a batch held back by an interrupted pass (the
        # pass's first call): later, a held batch is another thread's.
        self._again = True

    def __iter__(self):
        return self

    def __next__(self):
        if self.done:
            raise StopIteration
        try:
            if self._loader._closed:
                raise Error("this Loader is closed")
            out = self._native.next(self._stream, self._again)
        except LoaderBusy:
            raise  # another thread's next(): that thread's pass goes on
        except BaseException:
            self.done = True  # as a generator that raised: a new iter() continues the epoch
            raise
        self._again = False
        if out is None:
            self.done = True
            self._loader._finished(self._native, self._epoch)
            raise StopIteration
        try:
            fields = out[-1]
            images, labels = (out[3], out[4]) if self._native.on_device else (out[0], out[1])
            if fields is not None and not fields.has_label:
                labels = None
            batch = Batch(images, labels, out[2], self._epoch, self._number, fields)
        except KeyboardInterrupt:
            # The native side still holds the batch: the next pass (a new iter()) delivers it
            # first. Done, as a generator that raised.
            self.done = True
            raise
        except BaseException:
            self.done = True
            self._native.held = None  # a batch that cannot be made is not offered again
            raise
        self._number += 1
        # Handed out: until here (Ctrl-C raised after the native call returned) the native side
        # kept the batch and delivers it again first. An attribute store, not a call: Python
        # runs a pending signal handler after calls, never between this store and the return.
        if self.marks_handed_out:
            self._native.held = None
        return batch


class Loader:
    """Shuffled, fixed-shape batches from an archive: uint8, or normalised floats.

    Options: batch_size=64, shuffle=False (or True, or 'block': shards in a seeded order,
    samples mixed within windows of shuffle_window shards, for remote archives read through a
    small cache), seed=0, drop_last=False, shuffle_block=0 and shuffle_window='auto' (8; with
    shuffle='block' over a remote archive, the most up to 8 that cache_limit allows) (a
    locality-friendly block shuffle for archives larger than RAM; 0 keeps the true global
    shuffle), workers='auto' (tuned online from the consumer's wait: see
    max_workers=0, i.e. the CPUs this process may use, wait_target=0.02, and stats()'s
    'workers' and 'tuning'; a number fixes it; workers=0 is refused: DataLoader's
    num_workers=0 means something else, see shardfeed.torch.Loader), prefetch='auto' (ring
    slots, tuned online from 2 up to max_prefetch=0, i.e. 16, within ring_mb=0, i.e. 1/8 of
    the memory this process may use, at most 4096; a number fixes it; stats() has 'prefetch',
    'ring_bytes' and 'ring_full_seconds'), run_ahead=True (workers begin the next epoch once
    this one's samples are all handed out; stats() has 'run_ahead_batches' and 'ahead_kept'),
    crop='center'|'random'|'none'|'squash' ('none': whole images at a fixed-shape archive's
    stored shape, never distorted; 'squash': whole images resized to size x size, aspect
    ratio not kept), size=0 (224 for center, random and squash; the stored shape for 'none'),
    flip=False, layout='nhwc'|'nchw',
    dtype='uint8'|'float32'|'float16'|'bfloat16' (or the torch dtype), mean=(0, 0, 0) and
    std=(1, 1, 1) per RGB channel (numbers, or any sequence such as a numpy array) in 0..1
    units, as torchvision's Normalize after ToTensor; a mean above 1 means both are in 0..255
    units (mmcv/timm configs: mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375)) and
    they are divided by 255; std below 0.001 (0..1 units) is refused: float
    outputs are (x / 255 - mean) / std, computed by the workers into the batch (numpy has no
    bfloat16: its bits come as uint16 here, as torch.bfloat16 from shardfeed.torch.Loader),
    normalize_on_device=False (with device='cuda' and a float dtype: copy uint8 and normalise
    with a CUDA kernel on the GPU; the host images stay uint8 NHWC),
    rank=0, world_size=1, mode='threads'|'processes', device='cpu'|'cuda'|'cuda:N',
    skip_errors=False (True: a sample that cannot be decoded becomes a zero image labelled -1,
    so train with F.cross_entropy(..., ignore_index=-1); a shard changed on disk while read
    still raises DataError), verify_checksums=True (False skips the
    records' XXH3 check: unsafe), timeout=120
    (seconds with no sample completed, nor for a remote archive read by threads any byte
    arriving from its location, before shardfeed.Timeout is raised; 0 or None waits
    forever), fields=None (every field of the archive's schema but a str field named `path`,
    the source path a pack records (a JSONL column of that name too), which fields='*' or a
    list naming it adds; or a list of names: what each batch
    carries beside images and labels, see Batch; an unknown name raises ValueError naming the
    closest; fields=[] carries none), ragged='list'|'offsets' (variable-length fields as
    lists of per-sample arrays, or as (values, offsets)), and for a remote archive given by its
    location (s3://, http(s)://) cache_dir and cache_limit as shardfeed.Archive takes them. An
    unknown option raises TypeError naming the closest one. Over a remote archive, stats() also
    has 'bytes_fetched', 'cache_hits', 'cache_misses' and 'fetch_wait_seconds'.

    Lifecycle: leaving an iteration early (break, an exception) and starting another is always
    safe: the next pass continues that epoch (README, "The training loop"); Ctrl-C while
    waiting raises KeyboardInterrupt (a batch made but not yet handed out comes first in the
    next pass); `close()` stops the workers (bounded time; a next() waiting in another thread
    raises shardfeed.Error) and any later use raises shardfeed.Error; one thread iterates (a
    second thread's next() meanwhile raises shardfeed.LoaderBusy, a RuntimeError); after
    os.fork() the child's copy builds its own workers on first use and never touches the
    parent's.

    Iterating yields Batch objects ((images, labels) numpy arrays): images are views into the
    loader's ring, and each image array kept alive holds a slot (labels and indices are copies).
    With prefetch='auto' the ring grows for them up to its budget; past that (or with a fixed
    ring) kept batches get slots beyond the ring, up to kept_mb (stats()'s 'kept_slots'; one
    warning), and only past that cap does iteration raise shardfeed.Error naming it. Copy the
    images you keep. Each iteration runs (the rest of)
    one epoch: `set_epoch(e)` chooses it (else epochs count up from 0); one iteration at a
    time (a second live iterator raises RuntimeError). `state_dict()` / `load_state_dict()`
    resume mid-epoch on exactly the next batch.
    """

    def __init__(self, archive, **options):
        cache = {k: options.pop(k) for k in ("cache_dir", "cache_limit") if k in options}
        if isinstance(archive, Archive):
            if cache:
                raise TypeError("cache_dir and cache_limit go to shardfeed.Archive(...) when "
                                "the Loader is given an Archive")
            self.archive = archive
        else:
            self.archive = Archive(archive, **cache)
        self.options = _checked_options(options)
        self._epoch = 0             # the epoch the next pass runs (or the one in progress)
        self._resume = None         # a state to resume from (load_state_dict), else None
        self._in_epoch = False      # the native loader is inside self._epoch (a pass broke off)
        self._live = None           # weak reference to the pass that may still be iterated
        self._native = None
        self._pid = None
        self._closed = False
        self._handle()  # validate options now

    def _handle(self):
        if self._closed:
            raise Error("this Loader is closed")
        if self._native is None or self._pid != os.getpid():
            # After fork() the child's copy builds its own workers; its passes start afresh.
            self._native = _native.Loader(self.archive._handle(), **self.options)
            self._pid = os.getpid()
            self._in_epoch, self._live = False, None
        return self._native

    def __getstate__(self):
        return {"archive": self.archive, "options": self.options, "state": self.state_dict()}

    def __setstate__(self, state):
        self.__init__(state["archive"], **state["options"])
        self.load_state_dict(state["state"])

    def __len__(self):
        """Batches per epoch on this rank."""
        return len(self._handle())

    @property
    def batch_size(self):
        return self._handle().batch_size

    @property
    def drop_last(self):
        """Whether the epoch's last short batch is left out, as the loader read the option."""
        return self._handle().drop_last

    @property
    def epoch(self):
        """The epoch the next batch comes from."""
        return self._epoch

    def set_epoch(self, epoch):
        """Chooses the epoch the next pass reads, from its first batch. The epoch already in
        progress (a pass left early) or restored by load_state_dict() keeps its position: calling
        set_epoch(e) at the top of every epoch, as with DistributedSampler, never throws a
        resumed position away."""
        self._handle()  # a closed loader raises
        epoch = _whole(epoch, "set_epoch: epoch")
        pending = self._resume["epoch"] if self._resume is not None else None
        if epoch == pending or (self._in_epoch and epoch == self._epoch):
            return
        self._epoch, self._resume, self._in_epoch = epoch, None, False

    def __iter__(self):
        """One pass: the rest of the epoch in progress (after a break, an exception or
        load_state_dict()), else the epoch set_epoch() chose, else the one after the last
        finished. One pass at a time: a second iter() while an earlier iterator is still
        referenced and unfinished raises RuntimeError."""
        native = self._handle()
        live = self._live() if self._live is not None else None
        if live is not None and not live.done:
            raise RuntimeError(
                "another iteration over this Loader is still going (an iterator from an earlier "
                "iter() is unfinished and still referenced): a Loader delivers one stream of "
                "batches; finish that iterator or drop it (del) first, or make a second Loader "
                "for an independent pass")
        self._note_epoch_end(native)
        if self._resume is not None:
            self._start_resume(native, self._resume)
        elif not self._in_epoch:
            native.start_epoch(self._epoch)
        self._resume, self._in_epoch = None, True
        stream = 0
        if native.on_device:
            import torch

            stream = torch.cuda.current_stream().cuda_stream
        p = _Pass(self, native, self._epoch, native.state()["position"], stream)
        self._live = weakref.ref(p)
        return p

    def _finished(self, native, epoch):
        # A pass reached the end of its epoch: the next one runs the next epoch unless
        # set_epoch() already chose another.
        if native is self._native and self._in_epoch and self._epoch == epoch:
            self._in_epoch, self._epoch = False, epoch + 1

    def _note_epoch_end(self, native):
        # A pass left right after the epoch's last batch: that epoch is over (no empty pass).
        if self._in_epoch and self._resume is None:
            st = native.state()
            if st["plan_start"] == 0 and st["position"] >= len(native):
                self._finished(native, self._epoch)

    def _start_resume(self, native, state):
        if state.get("batch_size", self.batch_size) != self.batch_size:
            # Another batch size: the rest of the epoch's global order from the samples consumed
            # (as a resume at another world size does).
            native.start_epoch(state["epoch"], 0, state["consumed"])
        else:
            native.resume(state)

    def state_dict(self):
        """Where iteration stands: {'epoch', 'position', 'seed', 'plan_start', 'consumed',
        'world_size', 'batch_size'}; the next pass (or a loader given it by load_state_dict())
        starts exactly there. load_state_dict() on a loader with the same options continues with
        exactly the next batch; with another world size (rank count) or batch size, with exactly
        the rest of the epoch's global order from the samples consumed (elastic resume: save the
        state when every rank has delivered the same number of batches, as a synchronous
        training step does)."""
        native = self._handle()
        if self._resume is not None:
            return dict(self._resume)
        self._note_epoch_end(native)
        s = dict(native.state())
        if not self._in_epoch:
            s.update(epoch=self._epoch, position=0, plan_start=0, consumed=0)
        s["batch_size"] = native.batch_size
        return s

    def load_state_dict(self, state):
        """Makes the next pass start where `state` (from state_dict()) stood. A malformed state
        raises ValueError naming the problem; so does one saved with another seed."""
        native = self._handle()
        state = _checked_state(state)
        seed = native.state()["seed"]
        if state.setdefault("seed", seed) != seed:
            raise ValueError("load_state_dict: the state was saved with seed %d, this loader has "
                             "seed %d" % (state["seed"], seed))
        same_geometry = (state.get("batch_size", native.batch_size) == native.batch_size and
                         state.get("world_size", native.state()["world_size"]) ==
                         native.state()["world_size"])
        if same_geometry and state["position"] > len(native):
            raise ValueError("load_state_dict: position %d is past the end of the epoch (%d "
                             "batches)" % (state["position"], len(native)))
        if not same_geometry and "consumed" not in state:
            raise ValueError("load_state_dict: the state has another batch or world size and no "
                             "'consumed' to resume from")
        self._epoch = state["epoch"]
        self._resume = state
        self._in_epoch = False

    def stats(self):
        """The current epoch's timing: wait vs consumer time, per-stage worker seconds."""
        return self._handle().stats()

    @property
    def pinned(self):
        """What memory the ring is in: 'cudaHostRegister' or 'mlock' (page-locked), else
        'pageable (mlock refused)'."""
        return self._handle().pinned

    @property
    def samples_per_epoch(self):
        """Samples this rank reads per epoch (padding included, drop_last applied)."""
        return self._handle().samples_per_epoch

    @property
    def out_size(self):
        """(height, width) of every image in a batch."""
        return tuple(self._handle().out_size)

    @property
    def worker_pids(self):
        return self._handle().worker_pids

    def close(self):
        """Stops the workers (bounded: processes are killed after a grace period) and frees the
        ring once no batch is held. Any later use raises shardfeed.Error. Idempotent."""
        self._closed = True
        if self._native is not None:
            if self._pid == os.getpid():
                self._native.close()
            self._native = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def pack(src, out, **options):
    """Packs an image folder (or list=FILE with paths relative to src) into an archive; returns
    the report dict (packed, skipped with reasons, ignored). Options as `shardfeed pack`:
    encoding, backend, size, crop, quality, level, workers, shuffle, seed, validate, strict,
    overwrite, shard_size, chunk_size, max_pixels; part='I/N' (and parts_dir) packs one part of
    a split pack into OUT.parts/part-I-of-N, to be joined by merge()."""
    return _native.pack(os.fspath(src), _local_out(out, "pack"), **options)


def merge(parts, out, overwrite=False):
    """Joins the parts of a split pack into one archive without copying records (hard links).
    `parts`: a directory of parts (OUT.parts) or a list of part archives. Returns counts."""
    if isinstance(parts, (str, os.PathLike)):
        parts = [parts]
    return _native.merge([os.fspath(p) for p in parts], _local_out(out, "merge"), overwrite)


def convert(path, out, backend=None, jpeg_layout="original", overwrite=False):
    """Rewrites an archive into another backend ('lmdb' or 'hdf5'; None: the one `path` does not
    use, or with jpeg_layout='indexed' its own) without decoding; jpeg_layout='indexed' re-lays
    its JPEG records as pack's does. Returns the number of records (`shardfeed convert`)."""
    return _native.convert(os.fspath(path), _local_out(out, "convert"), backend or "",
                           jpeg_layout, overwrite)


def verify(path, decode=False, workers=0, max_pixels=0, cache_dir=None, cache_limit=None):
    """Checks every record checksum and shard hash and the manifest's derived fields; returns the
    report dict (`ok`, `bad_samples`, `bad_shards`, `bad_manifest`, `repaired`: a remote archive's
    cached copies found damaged and downloaded again before a second pass, and `error` when the
    archive is too damaged to open or a shard file is missing). Damage of any kind is `ok: False`, never
    an exception; a path that is not there or not an archive at all raises, and so does a remote
    one that could not be read (StorageError: the network, the cache; Timeout). With decode, records
    declaring more than max_pixels pixels (0: the packer's limit) are reported instead of
    decoded. A remote location is read through cache_dir/cache_limit as shardfeed.Archive's."""
    options = {"workers": workers}
    if max_pixels != 0:  # 0: the packer's limit (the table's default)
        options["max_pixels"] = max_pixels
    return _native.verify(os.fspath(path), decode, options, _path_or_none(cache_dir),
                          cache_limit)


def _path_or_none(value):
    return None if value is None else os.fspath(value)


def stats(path, against=(), cache_dir=None, cache_limit=None, **options):
    """One decoding pass over an archive: the dict `shardfeed stats --json` writes (docs/CLI.md,
    "stats"): per-channel `mean`/`std` (0-1 units; `mean_255`/`std_255`), `labels`, `sizes`,
    `flags`, `duplicates`, `near_duplicates`, `cross_label_duplicates` (lists of groups of
    sample indices) and `leaks` ({"index", "other", "other_index", "kind"}) into the archives
    in `against`. Options (size, workers, near_threshold, dark, bright, uniform, blurry,
    extreme_aspect, tiny, max_pixels) are the command's of the same names, read through the same
    table: the same ranges and messages; an unknown name is refused with the closest one.
    Remote locations are read through cache_dir/cache_limit as shardfeed.Archive's."""
    if isinstance(against, (str, os.PathLike)):
        against = [against]
    return _native.stats(os.fspath(path), [os.fspath(a) for a in against], options,
                         _path_or_none(cache_dir), cache_limit)


def inspect(path, cache_dir=None, cache_limit=None):
    """Samples, classes with counts, encoding, shapes and sizes, as a dict. Remote locations are
    read through cache_dir/cache_limit as shardfeed.Archive's."""
    return _native.inspect(os.fspath(path), _path_or_none(cache_dir), cache_limit)
