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


class Loader:
    def __init__(self, archive, **options):
        self._loader = _sf.Loader(archive, **_distributed_defaults(dict(options)))
        self.device = options.get("device", "cpu")

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

    def close(self):
        self._loader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __iter__(self):
        bfloat16 = str(self._loader.options.get("dtype", "uint8")) in ("bfloat16", "torch.bfloat16")
        for batch in self._loader:
            if self.device == "cpu":
                images = batch.images
                if bfloat16:  # numpy has no bfloat16: reinterpret its bits (no copy)
                    images = torch.from_numpy(images.view("int16")).view(torch.bfloat16)
                else:
                    images = torch.from_numpy(images)
                yield images, torch.from_numpy(batch.labels)
            else:
                # Labels are the caller's own (a few bytes, cloned on the current stream, after
                # the batch's copy): keeping them holds no ring slot.
                yield (torch.utils.dlpack.from_dlpack(batch.images),
                       torch.utils.dlpack.from_dlpack(batch.labels).clone())


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
    """

    def __init__(self, iterable, every=100, log=None, clock=None):
        import time
        self.iterable, self.every = iterable, max(1, int(every))
        self.log = log or self._print
        self.clock = clock or time.perf_counter
        self.steps = 0
        self.wait_s = self.step_s = 0.0

    @staticmethod
    def _print(first, last, fraction, wait_s, step_s):
        print("steps %d-%d: waited %.1f%% of the time (%.1f ms/step waiting)"
              % (first, last, 100 * fraction, 1000 * wait_s / max(1, last - first + 1)))

    @property
    def wait_fraction(self):
        total = self.wait_s + self.step_s
        return self.wait_s / total if total > 0 else 0.0

    def __len__(self):
        return len(self.iterable)

    def __iter__(self):
        it = iter(self.iterable)
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
                total = window_wait + window_step
                self.log(first, self.steps, window_wait / total if total > 0 else 0.0,
                         window_wait, window_step)
                first, window_wait, window_step = self.steps + 1, 0.0, 0.0
            returned = self.clock()
            yield batch
