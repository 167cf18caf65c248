#!/usr/bin/env python3
"""HDF5 reading: shardfeed on an HDF5 archive, shardfeed on an LMDB archive of the same images,
and an h5py-based torch Dataset (the way people do it today: one h5py handle per DataLoader
worker, JPEG bytes decoded by Pillow), in one run, on the same cores and batch size.

    hdf5_bench.py CORPUS [--build build] [--workers N] [--batch-size 64] [--epochs 2]
"""
import io
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch
from common import arguments, dataloader_ips, shardfeed_ips
from PIL import Image
from torchvision import transforms


class H5JpegDataset(torch.utils.data.Dataset):
    """JPEG bytes in an HDF5 file, opened lazily in each worker (h5py handles do not survive fork)."""

    def __init__(self, path):
        self.path = path
        with h5py.File(path, "r") as f:
            self.offsets = f["record_offsets"][:]
            self.sizes = f["record_sizes"][:]
            self.labels = f["labels"][:]
        self.file = None
        self.tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224),
                                      transforms.PILToTensor()])

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        o, s = int(self.offsets[i]), int(self.sizes[i])
        data = self.file["records"][o:o + s].tobytes()
        img = Image.open(io.BytesIO(data)).convert("RGB")
        return self.tf(img), int(self.labels[i])


def h5py_ips(path, workers, batch, epochs):
    dl = torch.utils.data.DataLoader(H5JpegDataset(path), batch_size=batch, shuffle=True,
                                     num_workers=workers, persistent_workers=True)
    return dataloader_ips(dl, epochs)


def main():
    args = arguments(__doc__, repeats=(int, 3, "alternating runs of each shardfeed reader"))
    sf = os.path.join(args.build, "shardfeed")
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="shardfeed-h5bench-", dir=os.path.dirname(os.path.abspath(args.corpus)))
    lmdb, h5 = os.path.join(tmp, "lmdb"), os.path.join(tmp, "h5")
    subprocess.run([sf, "pack", args.corpus, lmdb, "-q"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sf, "convert", lmdb, h5, "--backend", "hdf5"], check=True, stdout=subprocess.DEVNULL)

    def bench(archive):
        return shardfeed_ips(sf, archive, args)

    # Alternate the two shardfeed runs so drift on a shared machine hits both alike.
    runs = {"lmdb": [], "hdf5": []}
    for _ in range(args.repeats):
        runs["lmdb"].append(bench(lmdb))
        runs["hdf5"].append(bench(h5))
    sf_lmdb, sf_h5 = float(np.median(runs["lmdb"])), float(np.median(runs["hdf5"]))
    py = h5py_ips(os.path.join(h5, "shard-00000.h5"), args.workers, args.batch_size, args.epochs)
    shutil.rmtree(tmp, ignore_errors=True)
    print("corpus %s; %d CPU(s); batch %d, %d workers, centre crop 224, uint8; median of %d runs"
          % (args.corpus, os.cpu_count(), args.batch_size, args.workers, args.repeats))
    print("%-58s %10s  %s" % ("reader", "images/s", "ratio"))
    print("%-58s %10.0f" % ("shardfeed, LMDB archive", sf_lmdb))
    print("%-58s %10.0f  %.2f of LMDB, %.1fx h5py Dataset" % ("shardfeed, HDF5 archive (same records)", sf_h5, sf_h5 / sf_lmdb, sf_h5 / py))
    print("%-58s %10.0f" % ("h5py Dataset + DataLoader (handle per worker, Pillow)", py))


if __name__ == "__main__":
    sys.exit(main())
