#!/usr/bin/env python3
"""One peer for bench/remote_bench.py, run with the peers' interpreter (bench/install-peers.sh):
converts CORPUS to the peer's format, uploads it to the S3 server (AWS_ENDPOINT_URL, moto on
loopback), then reads epoch 1 (fresh local cache, dataset construction included) and epoch 2
through a torch DataLoader with --workers workers, each sample decoded by PIL with Resize 256 +
CenterCrop 224 (torchvision's centre crop 224; the peers store JPEG bytes and leave decoding to
the user). Prints one JSON line: {"version", "epoch1", "epoch2"} in images/s (median of
--repeat), or {"error": "..."}.

    /tmp/peers/bin/python bench/peers_remote.py streaming|litdata CORPUS --work DIR
        [--workers 2] [--batch-size 64] [--repeat 3]
"""
import argparse
import io
import json
import os
import shutil
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import consume, scan_folder  # noqa: E402

BUCKET = "peers"


def transform():
    from torchvision import transforms
    return transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224),
                               transforms.PILToTensor()])


def decode(data, tf):
    from PIL import Image
    return tf(Image.open(io.BytesIO(data)).convert("RGB"))


def upload(folder, prefix):
    import boto3
    c = boto3.client("s3")
    try:
        c.create_bucket(Bucket=BUCKET)
    except c.exceptions.BucketAlreadyOwnedByYou:
        pass
    for d, _, files in os.walk(folder):
        for f in files:
            path = os.path.join(d, f)
            c.upload_file(path, BUCKET, prefix + "/" + os.path.relpath(path, folder))
    return "s3://%s/%s" % (BUCKET, prefix)


# ---- MosaicML Streaming ----

def streaming_write(items, out):
    from streaming import MDSWriter
    with MDSWriter(out=out, columns={"image": "bytes", "label": "int"},
                   size_limit=1 << 23) as w:
        for path, label in items:
            with open(path, "rb") as f:
                w.write({"image": f.read(), "label": label})


def streaming_loader(remote, cache, args):
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader
    tf = transform()

    class Decoded(StreamingDataset):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            return decode(s["image"], tf), s["label"]

    ds = Decoded(remote=remote, local=cache, shuffle=True, shuffle_seed=0,
                 batch_size=args.batch_size)
    return DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers)


def streaming_cleanup():
    try:
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()
    except Exception:
        pass


# ---- LitData ----

def litdata_read(item):  # module level: litdata.optimize pickles it into its workers
    path, label = item
    with open(path, "rb") as f:
        return {"image": f.read(), "label": label}


def litdata_write(items, out):
    import litdata
    litdata.optimize(fn=litdata_read, inputs=items, output_dir=out, chunk_bytes="8MB",
                     num_workers=1)


# At module level: LitData's loader spawns its workers, which find the class by name.
if "litdata" in sys.argv[1:2]:
    import litdata

    class LitDecoded(litdata.StreamingDataset):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            if not hasattr(self, "_tf"):
                self._tf = transform()
            return decode(s["image"], self._tf), s["label"]


def litdata_loader(remote, cache, args):
    import litdata
    ds = LitDecoded(remote, cache_dir=cache, shuffle=True, seed=0)
    return litdata.StreamingDataLoader(ds, batch_size=args.batch_size, num_workers=args.workers)


PEERS = {"streaming": ("mosaicml-streaming", streaming_write, streaming_loader, streaming_cleanup),
         "litdata": ("litdata", litdata_write, litdata_loader, lambda: None)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("peer", choices=sorted(PEERS))
    ap.add_argument("corpus")
    ap.add_argument("--work", required=True)
    ap.add_argument("--endpoint", default="")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    dist, write, loader, cleanup = PEERS[args.peer]
    try:
        from importlib.metadata import version
        ver = "%s %s" % (dist, version(dist))
        import torch
        torch.set_num_threads(1)
        local = os.path.join(args.work, "local")
        write(scan_folder(args.corpus), local)
        remote = upload(local, args.peer)
        e1, e2 = [], []
        for r in range(args.repeat):
            cache = os.path.join(args.work, "cache%d" % r)
            t0 = time.perf_counter()
            dl = loader(remote, cache, args)
            c1 = consume(dl)
            t1 = time.perf_counter()
            c2 = consume(dl)
            t2 = time.perf_counter()
            e1.append(c1.images / (t1 - t0))
            e2.append(c2.images / (t2 - t1))
            del dl
            cleanup()
            shutil.rmtree(cache, ignore_errors=True)
        print(json.dumps({"version": ver, "epoch1": statistics.median(e1),
                          "epoch2": statistics.median(e2), "images": c1.images}))
    except Exception as e:
        traceback.print_exc()
        print(json.dumps({"error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e)
                                                else "")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
