"""PyTorch integration.

- `Loader`: use in place of torch.utils.data.DataLoader. Yields (images, labels) as torch
  tensors (uint8, or float32/float16/bfloat16 normalised with `mean`/`std`: see
  shardfeed.Loader) that share memory with the loader's pinned ring (zero-copy); with device='cuda' the
  batches arrive on the GPU through shardfeed's own pinned ring and CUDA stream. Picks up
  torch.distributed's rank and world size when a process group is initialised; every rank gets
  the same number of batches, and len() is that number.
- `Dataset`: a map-style dataset (image HWC uint8 tensor, label) for a plain DataLoader with
  num_workers > 0; the archive is opened lazily in each worker process.
"""
import torch
import torch.distributed as dist

import shardfeed as _sf


def _distributed_defaults(options):
    if "rank" not in options and "world_size" not in options:
        if dist.is_available() and dist.is_initialized():
            options["rank"] = dist.get_rank()
            options["world_size"] = dist.get_world_size()
    return options


def _tensors(value):
    """A field as shardfeed.Batch gives it, with its arrays as tensors sharing their memory."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, tuple):  # ragged="offsets": (values, offsets)
        return tuple(torch.from_numpy(v) for v in value)
    if value and isinstance(value[0], np.ndarray):
        return [torch.from_numpy(v) for v in value]
    return value  # str, bytes, json: Python lists


class Batch(tuple):
    """(images, labels) torch tensors, plus `indices` (int64 tensor: each sample's index in the
    archive, for per-sample losses and checks across ranks), `epoch` and `number` (the batch's
    position in its epoch). Unpacks as `images, labels` (`labels` None when the schema has no
    class field). batch["name"] gives a field as shardfeed.Batch does, with tensors for arrays
    (sharing the batch's memory): stacked fields and masks one tensor, variable-length ones a
    list of tensors or, with ragged="offsets", (values, offsets) tensors; str/bytes/json lists.
    Fields stay on the host with device='cuda'."""

    def __new__(cls, images, labels, indices, epoch, number, source=None):
        b = super().__new__(cls, (images, labels))
        b.images, b.labels, b.indices, b.epoch, b.number = images, labels, indices, epoch, number
        b._source, b._cache = source, {}
        return b

    def keys(self):
        return self._source.keys() if self._source is not None else ["image", "label"]

    def __getitem__(self, key):
        if not isinstance(key, str):
            return tuple.__getitem__(self, key)
        source = self._source._fields if self._source is not None else None
        if key in ("image", "images") and (source is None or key not in source.names()):
            return self.images
        if key == "label" and self.labels is not None:
            return self.labels
        if key not in self._cache:
            if self._source is None:
                raise KeyError(key)
            self._cache[key] = _tensors(self._source[key])
        return self._cache[key]

    def __reduce__(self):
        # Pickled: tensors as torch pickles them, the fields through the source batch's values.
        return (Batch, (self.images, self.labels, self.indices, self.epoch, self.number,
                        self._source))


# DataLoader's keywords that have no counterpart: why, and what to do instead.
_UNSUPPORTED = {
    "collate_fn": "batches are collated by the workers straight into the pinned ring; apply your "
                  "function to each batch inside the loop",
    "sampler": "the order is shardfeed's own (shuffle, seed, shuffle_block; rank and world_size "
               "for distributed runs, picked up from torch.distributed)",
    "batch_sampler": "batches are batch_size consecutive samples of the epoch's order (drop_last "
                     "for the short one)",
    "worker_init_fn": "workers are C++ threads or shardfeed-worker processes, not Python",
    "generator": "the order and augmentation draws come from seed=",
    "multiprocessing_context": "mode='processes' runs the workers as separate programs",
}


def _dataloader_options(options):
    """DataLoader's keyword names where the meaning matches, as shardfeed's; see Loader."""
    o = dict(options)
    for name, why in _UNSUPPORTED.items():
        if name in o:
            if o.pop(name) is not None:
                raise TypeError("shardfeed.torch.Loader does not take %s: %s" % (name, why))
    o.pop("pin_memory", None)          # the ring is page-locked whenever the system allows
    o.pop("persistent_workers", None)  # workers always live as long as the loader
    o.pop("pin_memory_device", None)
    if "shuffle" in o and o["shuffle"] is None:  # DataLoader's own default: no shuffle
        o["shuffle"] = False
    if not o.pop("in_order", True):
        raise TypeError("shardfeed.torch.Loader does not take in_order=False: batches always "
                        "come in the epoch's order (that is what makes a resume exact)")
    if "num_workers" in o:
        if "workers" in o:
            raise TypeError("give num_workers or workers, not both")
        n = _sf._whole(o.pop("num_workers"), "num_workers")
        o["workers"] = n if n > 0 else 1  # DataLoader's 0 (no worker process): one thread
    factor = o.pop("prefetch_factor", None)
    if factor is not None:
        if "prefetch" in o:
            raise TypeError("give prefetch_factor or prefetch, not both")
        factor = _sf._whole(factor, "prefetch_factor", 1)
        workers = o.get("workers", "auto")
        if isinstance(workers, str):
            raise ValueError("prefetch_factor needs a number of workers (num_workers=N): with "
                             "workers='auto' the ring depth is tuned (prefetch='auto'); or give "
                             "prefetch=N ring slots")
        o["prefetch"] = max(2, factor * int(workers))
    return o


class _Sampler:
    def __init__(self, loader):
        self._loader = loader

    def set_epoch(self, epoch):
        self._loader.set_epoch(epoch)

    def __len__(self):
        return self._loader.samples_per_epoch


class Loader:
    """In place of torch.utils.data.DataLoader over a shardfeed archive.

    Takes shardfeed.Loader's options, and DataLoader's names where the meaning matches:
    batch_size, shuffle, drop_last and timeout are the same options; num_workers=N is workers=N
    (num_workers=0, DataLoader's "no worker process", is one worker thread); prefetch_factor=k
    is prefetch=k*num_workers ring slots (at least 2); pin_memory and persistent_workers are
    accepted and change nothing (the ring is page-locked whenever the system allows, see
    `pinned`; workers live as long as the loader). collate_fn, sampler, batch_sampler,
    worker_init_fn, generator and multiprocessing_context raise TypeError saying what to use
    instead. An unknown name raises TypeError with the closest one.

    Yields Batch tuples (images, labels) with `.indices`, `.epoch` and `.number`. Attributes as
    DataLoader users reach for them: `dataset` (the Archive), `batch_size`, `drop_last`, `epoch`,
    `sampler.set_epoch()`, and `pinned`, `worker_pids`, `samples_per_epoch`, `out_size`, `stats()`.
    """

    def __init__(self, archive, **options):
        options = _distributed_defaults(_dataloader_options(options))
        self._loader = _sf.Loader(archive, **options)
        self.device = options.get("device", "cpu")
        self._bfloat16 = str(options.get("dtype", "uint8")) in ("bfloat16", "torch.bfloat16")

    def __len__(self):
        return len(self._loader)

    def set_epoch(self, epoch):
        self._loader.set_epoch(epoch)

    def state_dict(self):
        return self._loader.state_dict()

    def load_state_dict(self, state):
        self._loader.load_state_dict(state)

    def stats(self):
        return self._loader.stats()

    @property
    def archive(self):
        return self._loader.archive

    @property
    def dataset(self):
        """The Archive read (len() is its sample count, class_names its classes)."""
        return self._loader.archive

    @property
    def batch_size(self):
        return self._loader.batch_size

    @property
    def sampler(self):
        """For DDP code that calls `loader.sampler.set_epoch(epoch)`: set_epoch() and len()
        (samples per epoch on this rank) of this loader's own order."""
        return _Sampler(self)

    @property
    def drop_last(self):
        return self._loader.drop_last  # as the loader read it ("false" is False)

    @property
    def epoch(self):
        """The epoch the next batch comes from."""
        return self._loader.epoch

    @property
    def pinned(self):
        """What memory the ring is in: 'cudaHostRegister' or 'mlock' (page-locked), else
        'pageable (mlock refused)'."""
        return self._loader.pinned

    @property
    def worker_pids(self):
        return self._loader.worker_pids

    @property
    def samples_per_epoch(self):
        return self._loader.samples_per_epoch

    @property
    def out_size(self):
        """(height, width) of every image in a batch."""
        return self._loader.out_size

    def close(self):
        self._loader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __iter__(self):
        return _TorchPass(self, iter(self._loader))  # a second live pass raises here, not later

    def _convert(self, batch):
        indices = torch.from_numpy(batch.indices.astype("int64"))
        if self.device == "cpu":
            images = batch.images
            if self._bfloat16:  # numpy has no bfloat16: reinterpret its bits (no copy)
                images = torch.from_numpy(images.view("int16")).view(torch.bfloat16)
            else:
                images = torch.from_numpy(images)
            labels = torch.from_numpy(batch.labels) if batch.labels is not None else None
        else:
            # Labels are the caller's own (a few bytes, cloned on the current stream, after the
            # batch's copy): keeping them holds no ring slot.
            images = torch.utils.dlpack.from_dlpack(batch.images)
            labels = (torch.utils.dlpack.from_dlpack(batch.labels).clone()
                      if batch.labels is not None else None)
        return Batch(images, labels, indices, batch.epoch, batch.number, batch)


class _TorchPass:
    """One pass of a shardfeed.torch.Loader: shardfeed's pass, its batches as tensors. Marks a
    batch handed out once converted (see shardfeed._Pass), unless a wrapper that hands it on
    later (WaitMeter) sets marks_handed_out to False and marks it itself."""

    def __init__(self, loader, passes):
        self._loader, self._passes, self._native = loader, passes, passes._native
        passes.marks_handed_out = False
        self.marks_handed_out = True

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self._passes)  # an interrupt after it: the batch is still held
        try:
            out = self._loader._convert(batch)
        except KeyboardInterrupt:
            self._passes.done = True  # as a generator that raised; held: the next pass has it
            raise
        except BaseException:
            self._passes.done = True
            self._native.held = None  # a batch that cannot be converted is not offered again
            raise
        if self.marks_handed_out:
            self._native.held = None  # handed out: a store, not a call (no signal check)
        return out


class Dataset(torch.utils.data.Dataset):
    """archive[i] as (uint8 HWC tensor, int label), optionally through `transform`."""

    def __init__(self, archive, transform=None):
        self.archive = archive if isinstance(archive, _sf.Archive) else _sf.Archive(archive)
        self.transform = transform

    def __len__(self):
        return len(self.archive)

    def __getitem__(self, index):
        image, label = self.archive[index]
        image = torch.from_numpy(image)
        if self.transform is not None:
            image = self.transform(image)
        return image, label

    @property
    def classes(self):
        return self.archive.class_names


class WaitMeter:
    """How much of each training step is spent waiting for data, for any iterable of batches
    (a shardfeed Loader, a torch DataLoader):

        for images, labels in shardfeed.torch.WaitMeter(loader, every=100):
            ...   # every 100 steps: "steps 1-100: waited 3.1% of the time (0.8 ms/step)"

    Time inside the iterator's next() is waiting; time between batches is the step. Every
    `every` steps, `log(first, last, wait_fraction, wait_s, step_s)` is called (default: print
    a line); `wait_fraction` is also kept for the whole run. `clock` is for tests.

    Over a remote archive (a loader whose stats() has 'fetch_wait_seconds'), `fetch_wait_s`
    is the workers' time spent waiting for shard downloads in the last window, and the printed
    line says when the wait was fetch wait (the network, not decoding, is short).
    """

    def __init__(self, iterable, every=100, log=None, clock=None):
        import time
        self.iterable, self.every = iterable, max(1, int(every))
        self.log = log or self._print
        self.clock = clock or time.perf_counter
        self.steps = 0
        self.wait_s = self.step_s = 0.0
        self.fetch_wait_s = 0.0
        self._fetch_seen = 0.0

    def _fetch_wait(self):
        """The source's fetch wait so far this epoch (0 when it reports none)."""
        stats = getattr(self.iterable, "stats", None)
        try:
            return float(stats().get("fetch_wait_seconds", 0.0)) if stats else 0.0
        except Exception:  # a source without loader stats
            return 0.0

    def _print(self, first, last, fraction, wait_s, step_s):
        line = ("steps %d-%d: waited %.1f%% of the time (%.1f ms/step waiting)"
                % (first, last, 100 * fraction, 1000 * wait_s / max(1, last - first + 1)))
        if wait_s > 0 and self.fetch_wait_s > 0:
            line += ("; fetch wait: workers waited %.2f s for shard downloads"
                     % self.fetch_wait_s)
        print(line)

    @property
    def wait_fraction(self):
        total = self.wait_s + self.step_s
        return self.wait_s / total if total > 0 else 0.0

    def __len__(self):
        return len(self.iterable)

    def __iter__(self):
        it = iter(self.iterable)
        # A shardfeed pass marks each batch handed out as it returns it; here that is at the
        # yield below, so a Ctrl-C in this meter's own bookkeeping leaves the batch to the next
        # pass (_Pass.__next__).
        native = getattr(it, "_native", None) if hasattr(it, "marks_handed_out") else None
        if native is not None:
            it.marks_handed_out = False
        window_wait = window_step = 0.0
        first = self.steps + 1
        returned = None
        while True:
            asked = self.clock()
            if returned is not None:
                step = asked - returned
                window_step += step
                self.step_s += step
            try:
                batch = next(it)
            except StopIteration:
                break
            got = self.clock()
            window_wait += got - asked
            self.wait_s += got - asked
            self.steps += 1
            if self.steps - first + 1 == self.every:
                fetched = self._fetch_wait()
                if fetched < self._fetch_seen:  # a new epoch restarted the loader's counters
                    self._fetch_seen = 0.0
                self.fetch_wait_s, self._fetch_seen = fetched - self._fetch_seen, fetched
                total = window_wait + window_step
                self.log(first, self.steps, window_wait / total if total > 0 else 0.0,
                         window_wait, window_step)
                first, window_wait, window_step = self.steps + 1, 0.0, 0.0
            returned = self.clock()
            if native is not None:
                native.held = None  # a store, not a call: nothing runs before the yield
            yield batch
