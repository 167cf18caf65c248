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
                yield (torch.utils.dlpack.from_dlpack(batch.images),
                       torch.utils.dlpack.from_dlpack(batch.labels))


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
