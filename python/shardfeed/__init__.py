"""shardfeed: packed image archives, read zero-copy into training.

    import shardfeed
    shardfeed.pack("train/", "train.sf")                 # ImageFolder -> archive
    archive = shardfeed.Archive("train.sf")
    image, label = archive[0]                            # HWC uint8 numpy array, int
    loader = shardfeed.Loader("train.sf", batch_size=64, shuffle=True, crop="random", size=224)
    for epoch in range(10):
        loader.set_epoch(epoch)
        for images, labels in loader:                    # numpy views into the pinned ring
            ...

`shardfeed.torch` has the PyTorch-facing loader and a map-style Dataset.
"""
import os

from . import _native
from ._native import (DataError, Error, Timeout, WorkerError, cuda_available,
                      cuda_kernels_built, cuda_unavailable_reason)

__all__ = ["Archive", "Loader", "Batch", "pack", "merge", "convert", "verify", "inspect", "stats", "Error",
           "DataError",
           "WorkerError", "Timeout", "cuda_available", "cuda_unavailable_reason",
           "cuda_kernels_built"]

__version__ = "0.1.0"


class Archive:
    """An opened archive. Opens its file mapping lazily in each process that uses it, so an
    Archive created before fork() (or pickled into DataLoader workers) works in the child."""

    def __init__(self, path, index_check="auto"):
        """index_check: 'full' checks every shard and index entry at open (O(samples)); 'lazy'
        opens a shard when first read and checks each index entry as it is read, so open and the
        first batch cost the same whatever the archive's size (for ranks of large jobs; verify()
        still checks everything); 'auto' is full up to 4M samples, lazy above."""
        self.path = os.fspath(path)
        self.index_check = index_check
        self._native = None
        self._pid = None
        self._handle()  # fail early on a bad path

    def _handle(self):
        if self._native is None or self._pid != os.getpid():
            self._native = _native.Archive(self.path, self.index_check)
            self._pid = os.getpid()
        return self._native

    def __getstate__(self):
        return {"path": self.path, "index_check": self.index_check}

    def __setstate__(self, state):
        self.path = state["path"]
        self.index_check = state.get("index_check", "auto")
        self._native = None
        self._pid = None

    def __len__(self):
        return len(self._handle())

    def __getitem__(self, index):
        """(image, label): the sample decoded to an upright HWC uint8 RGB array."""
        return self._handle()[index]

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
        return self._handle().labels()

    def record(self, index):
        """The stored payload bytes of a sample (read-only, zero-copy view into the map)."""
        return self._handle().record(index)

    def __repr__(self):
        return "shardfeed.Archive(%r, samples=%d, encoding=%s)" % (self.path, len(self), self.encoding)


class Batch(tuple):
    """(images, labels) plus the archive indices of the samples. The arrays point into the
    loader's ring slot; the slot is reused only after every array (and tensor made from them)
    is gone."""

    def __new__(cls, images, labels, indices, epoch, number):
        b = super().__new__(cls, (images, labels))
        b.images, b.labels, b.indices, b.epoch, b.number = images, labels, indices, epoch, number
        return b


class Loader:
    """Shuffled, fixed-shape batches from an archive: uint8, or normalised floats.

    Options: batch_size=64, shuffle=False, seed=0, drop_last=False, shuffle_block=0 and
    shuffle_window=8 (a locality-friendly block shuffle for archives larger than RAM; 0 keeps
    the true global shuffle), workers='auto' (tuned online from the consumer's wait: see
    max_workers=0, i.e. the CPUs this process may use, wait_target=0.02, and stats()'s
    'workers' and 'tuning'; a number fixes it, 0 meaning those CPUs), prefetch='auto' (ring
    slots, tuned online from 2 up to max_prefetch=0, i.e. 16, within ring_mb=0, i.e. 1/8 of
    the memory this process may use, at most 4096; a number fixes it; stats() has 'prefetch',
    'ring_bytes' and 'ring_full_seconds'), run_ahead=True (workers begin the next epoch once
    this one's samples are all handed out; stats() has 'run_ahead_batches' and 'ahead_kept'),
    crop='center'|'random'|'none'|'squash' ('none': whole images at a fixed-shape archive's
    stored shape, never distorted; 'squash': whole images resized to size x size, aspect
    ratio not kept), size=0 (224 for center, random and squash; the stored shape for 'none'),
    flip=False, layout='nhwc'|'nchw',
    dtype='uint8'|'float32'|'float16'|'bfloat16' (or the torch dtype), mean=(0, 0, 0) and
    std=(1, 1, 1) per RGB channel in 0..1 units, as torchvision's Normalize after ToTensor: float
    outputs are (x / 255 - mean) / std, computed by the workers into the batch (numpy has no
    bfloat16: its bits come as uint16 here, as torch.bfloat16 from shardfeed.torch.Loader),
    normalize_on_device=False (with device='cuda' and a float dtype: copy uint8 and normalise
    with a CUDA kernel on the GPU; the host images stay uint8 NHWC),
    rank=0, world_size=1, mode='threads'|'processes', device='cpu'|'cuda'|'cuda:N',
    skip_errors=False, verify_checksums=False, timeout=120 (seconds with no sample completed
    before shardfeed.Timeout is raised; 0 or None waits forever).

    Lifecycle: leaving an iteration early (break, an exception) and starting another is always
    safe; Ctrl-C while waiting raises KeyboardInterrupt; `close()` stops the workers (bounded
    time) and any later use raises shardfeed.Error; after os.fork() the child's copy builds its
    own workers on first use and never touches the parent's.

    Iterating yields Batch objects ((images, labels) numpy arrays) that are views into the
    loader's ring: each one kept alive holds a slot. With prefetch='auto' the ring grows for
    them up to its budget; a fixed ring (or a spent budget) with every slot held raises
    shardfeed.Error rather than wait. Copy what you keep. Each iteration runs one
    epoch: `set_epoch(e)` chooses it (else epochs count up from 0). `state_dict()` /
    `load_state_dict()` resume mid-epoch on exactly the next batch.
    """

    def __init__(self, archive, **options):
        self.archive = archive if isinstance(archive, Archive) else Archive(archive)
        self.options = dict(options)
        self._epoch = 0             # the epoch the next iteration runs
        self._resume = None         # a state to resume from (load_state_dict), else None
        self._active = False        # an iteration is under way
        self._native = None
        self._pid = None
        self._closed = False
        self._handle()  # validate options now

    def _handle(self):
        if self._closed:
            raise Error("this Loader is closed")
        if self._native is None or self._pid != os.getpid():
            self._native = _native.Loader(self.archive._handle(), **self.options)
            self._pid = os.getpid()
        return self._native

    def __getstate__(self):
        return {"archive": self.archive, "options": self.options, "state": self.state_dict()}

    def __setstate__(self, state):
        self.__init__(state["archive"], **state["options"])
        self.load_state_dict(state["state"])

    def __len__(self):
        """Batches per epoch on this rank."""
        return len(self._handle())

    def set_epoch(self, epoch):
        self._epoch = int(epoch)
        self._resume = None

    @property
    def epoch(self):
        return self._epoch

    def __iter__(self):
        native = self._handle()
        epoch = self._epoch
        if self._resume is not None:
            native.resume(self._resume)
        else:
            native.start_epoch(epoch)
        self._resume = None
        self._active = True
        stream = 0
        if native.on_device:
            import torch

            stream = torch.cuda.current_stream().cuda_stream
        number = native.state()["position"]
        while True:
            out = native.next(stream)
            if out is None:
                break
            if native.on_device:
                batch = Batch(out[3], out[4], out[2], epoch, number)
            else:
                batch = Batch(out[0], out[1], out[2], epoch, number)
            number += 1
            # Hold no reference across the next native.next(): the consumer's is the only one,
            # so its slot can return to the ring as soon as the consumer lets go.
            del out
            yield batch
            del batch
        # Exhausted: the next iteration runs the next epoch unless set_epoch() says otherwise.
        self._active = False
        if self._epoch == epoch:
            self._epoch = epoch + 1

    def state_dict(self):
        """Where iteration stands: {'epoch', 'position', 'seed', 'plan_start', 'consumed',
        'world_size'}. load_state_dict() on a loader with the same options continues with
        exactly the next batch; on one with another world size (rank count), with exactly the
        rest of the epoch's global order spread over the new ranks (elastic resume: save the
        state when every rank has delivered the same number of batches, as a synchronous
        training step does)."""
        if self._active:
            return dict(self._handle().state())
        if self._resume is not None:
            return dict(self._resume)
        seed = int(self.options.get("seed", 0))
        world = int(self._handle().state()["world_size"])
        return {"epoch": self._epoch, "position": 0, "seed": seed, "plan_start": 0,
                "consumed": 0, "world_size": world}

    def load_state_dict(self, state):
        seed = int(self.options.get("seed", 0))
        if int(state.get("seed", seed)) != seed:
            raise ValueError("state was saved with seed %s, this loader has seed %s"
                             % (state.get("seed"), seed))
        self._epoch = int(state["epoch"])
        self._resume = {k: int(v) for k, v in state.items()}
        self._resume.setdefault("seed", seed)

    def stats(self):
        """The current epoch's timing: wait vs consumer time, per-stage worker seconds."""
        return self._handle().stats()

    @property
    def pinned(self):
        return self._handle().pinned

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
    return _native.pack(os.fspath(src), os.fspath(out), **options)


def merge(parts, out, overwrite=False):
    """Joins the parts of a split pack into one archive without copying records (hard links).
    `parts`: a directory of parts (OUT.parts) or a list of part archives. Returns counts."""
    if isinstance(parts, (str, os.PathLike)):
        parts = [parts]
    return _native.merge([os.fspath(p) for p in parts], os.fspath(out), overwrite)


def convert(path, out, backend, overwrite=False):
    """Rewrites an archive into another backend ('lmdb' or 'hdf5') without decoding; returns the
    number of records."""
    return _native.convert(os.fspath(path), os.fspath(out), backend, overwrite)


def verify(path, decode=False, workers=0, max_pixels=0):
    """Checks every record checksum and shard hash and the manifest's derived fields; returns the
    report dict (`ok`, `bad_samples`, `bad_shards`, `bad_manifest`, and `error` when the archive
    is too damaged to open or a shard file is missing). Damage of any kind is `ok: False`, never
    an exception; a path that is not there or not an archive at all raises. With decode, records
    declaring more than max_pixels pixels (0: the packer's limit) are reported instead of
    decoded."""
    return _native.verify(os.fspath(path), decode, workers, max_pixels)


def stats(path, against=(), size=0, workers=0, near_threshold=10, dark=25.0, bright=230.0,
          uniform=4.0, blurry=50.0, extreme_aspect=4.0, tiny=32):
    """One decoding pass over an archive: the dict `shardfeed stats --json` writes (docs/CLI.md,
    "stats"): per-channel `mean`/`std` (0-1 units; `mean_255`/`std_255`), `labels`, `sizes`,
    `flags`, `duplicates`, `near_duplicates`, `cross_label_duplicates` (lists of groups of
    sample indices) and `leaks` ({"index", "other", "other_index", "kind"}) into the archives
    in `against`. Thresholds as the command's options of the same names."""
    if isinstance(against, (str, os.PathLike)):
        against = [against]
    return _native.stats(os.fspath(path), [os.fspath(a) for a in against], size, workers,
                         near_threshold, dark, bright, uniform, blurry, extreme_aspect, tiny)


def inspect(path):
    """Samples, classes with counts, encoding, shapes and sizes, as a dict."""
    return _native.inspect(os.fspath(path))
