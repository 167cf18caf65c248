#!/usr/bin/env python3
"""The batches training consumes (issue 13), side by side in one run: normalised float output
against uint8 (shardfeed and FFCV, and torch doing it after the loader), DCT-scaled decoding
against a 2-thread full-decode loop on ~460x400 photos and on camera-size photos, and a
resolution cap at pack time (`pack --encoding jpeg --size 512`) against the original bytes.

    output_bench.py CORPUS [--camera CAMERA] [--build build] [--peers /tmp/peers/bin/python]
                    [--workers 2] [--batch-size 64] [--epochs 2] [--rounds 3]

CORPUS: bench/make_corpus.py OUT; CAMERA: bench/make_corpus.py OUT --camera --count 400.
FFCV runs through bench/ffcv_bench.py with the peers' interpreter (bench/install-peers.sh);
without it its rows say so. Every figure is images/s over the epochs after a warm-up epoch;
shardfeed's and the decode loop's are the median of --rounds runs.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from common import arguments, shardfeed_ips

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGENET = ["--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225"]


def run_json(cmd):
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def python_loader_ips(build, archive, args, **options):
    """shardfeed.torch.Loader as a training loop sees it (tensors in hand), in a fresh process."""
    code = """
import json, sys, torch
sys.path[:0] = [%r, %r]
import shardfeed.torch as sft
from common import consume
torch.set_num_threads(1)
loader = sft.Loader(%r, batch_size=%d, workers=%d, shuffle=True, **json.loads(%r))
consume(loader)  # warm-up epoch
n, s, dtype = 0, 0.0, []
for _ in range(%d):
    c = consume(loader, step=lambda i, item: dtype.append(str(item[0].dtype)) if i == 1 else None)
    n, s = n + c.images, s + c.seconds
print(json.dumps({"ips": n / s, "dtype": dtype[0]}))
""" % (os.path.join(build, "python"), os.path.dirname(os.path.abspath(__file__)), archive,
       args.batch_size, args.workers, json.dumps(options), args.epochs)
    out = subprocess.run(["/usr/bin/python3", "-c", code], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)["ips"]


def torch_normalise_ms(batch):
    """What `images.float().div(255).sub(mean).div(std).permute(0, 3, 1, 2)` costs per batch
    of 224x224 uint8 NHWC in this torch, on the CPU (the line every user writes)."""
    import torch
    torch.set_num_threads(1)
    x = torch.randint(0, 256, (batch, 224, 224, 3), dtype=torch.uint8)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 1, 1, 3)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 1, 1, 3)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        y = x.float().div(255).sub(mean).div(std).permute(0, 3, 1, 2).contiguous()
        best = min(best, time.perf_counter() - t)
    del y
    return best * 1000


def ffcv_ips(args, corpus, beton, *extra):
    if not args.peers or not os.path.exists(args.peers):
        return None
    cmd = [args.peers, os.path.join(HERE, "ffcv_bench.py"), corpus, "--beton", beton,
           "--workers", str(args.workers), "--batch-size", str(args.batch_size),
           "--epochs", str(args.epochs), *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write("FFCV failed: %s\n" % p.stderr[-2000:])
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])["images_per_second"]


def fmt(v):
    return "%10.0f" % v if v is not None else "       n/a"


def main():
    args = arguments(__doc__, camera=(str, "", "camera-size corpus (make_corpus.py --camera)"),
                     peers=(str, "/tmp/peers/bin/python", "interpreter with FFCV installed"),
                     rounds=(int, 3, "each shardfeed figure is the median of this many runs"))
    sf = os.path.join(args.build, "shardfeed")
    ceiling = os.path.join(args.build, "shardfeed_ceiling")
    tmp = tempfile.mkdtemp(prefix="shardfeed-outbench-",
                           dir=os.path.dirname(os.path.abspath(args.corpus)))
    try:
        def median(f):
            values = sorted(f() for _ in range(args.rounds))
            return values[len(values) // 2]

        def bench(archive, *extra):
            return median(lambda: shardfeed_ips(sf, archive, args, *extra))

        def ceil(archive):
            return median(lambda: run_json([ceiling, archive, "--threads", str(args.workers),
                                            "--repeat", "2"])["images_per_second"])

        small = os.path.join(tmp, "small")
        subprocess.run([sf, "pack", args.corpus, small, "-q"], check=True,
                       stdout=subprocess.DEVNULL)

        # 1. Normalised float output, centre crop 224.
        u8 = bench(small)
        f32 = bench(small, "--dtype", "float32", "--layout", "nchw", *IMAGENET)
        f16 = bench(small, "--dtype", "float16", "--layout", "nchw", *IMAGENET)
        bf16 = bench(small, "--dtype", "bfloat16", "--layout", "nchw", *IMAGENET)
        py_u8 = python_loader_ips(args.build, small, args)
        py_f32 = python_loader_ips(args.build, small, args, dtype="float32", layout="nchw",
                                   mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        torch_ms = torch_normalise_ms(args.batch_size)
        beton = os.path.join(tmp, "small.beton")
        ff_u8 = ffcv_ips(args, args.corpus, beton)
        ff_f32 = ffcv_ips(args, args.corpus, beton, "--normalize")
        print("== normalised output: %s, centre crop 224, batch %d, %d workers"
              % (args.corpus, args.batch_size, args.workers))
        print("%-64s %10s  %s" % ("reader", "images/s", "vs its own uint8"))
        for name, v, base in [
                ("shardfeed CLI, uint8 NHWC", u8, u8),
                ("shardfeed CLI, float32 NCHW, ImageNet mean/std", f32, u8),
                ("shardfeed CLI, float16 NCHW, ImageNet mean/std", f16, u8),
                ("shardfeed CLI, bfloat16 NCHW, ImageNet mean/std", bf16, u8),
                ("shardfeed.torch.Loader, uint8 NHWC", py_u8, py_u8),
                ("shardfeed.torch.Loader, float32 NCHW, ImageNet mean/std", py_f32, py_u8),
                ("FFCV 1.0.2, uint8 NCHW (ToTorchImage)", ff_u8, ff_u8),
                ("FFCV 1.0.2, NormalizeImage float32 NCHW", ff_f32, ff_u8)]:
            ratio = "%.0f%%" % (100 * v / base) if v is not None and base else ""
            print("%-64s %s  %s" % (name, fmt(v), ratio))
        print("torch on the CPU after a uint8 loader: float().div().sub().div().permute() of "
              "a %dx224x224x3 batch: %.1f ms (= %.0f images/s on one core)"
              % (args.batch_size, torch_ms, args.batch_size / torch_ms * 1000))
        if ff_f32 and f32:
            print("shardfeed float32 NCHW / FFCV float32 NCHW: %.2fx" % (f32 / ff_f32))

        # 2. Decode exactly what is needed: DCT scales against a 2-thread full-decode loop.
        corpora = [("~460x400 photos", args.corpus, small)]
        if args.camera:
            cam = os.path.join(tmp, "camera")
            subprocess.run([sf, "pack", args.camera, cam, "-q"], check=True,
                           stdout=subprocess.DEVNULL)
            corpora.append(("camera-size photos", args.camera, cam))
        for label, corpus, archive in corpora:
            c = ceil(archive)
            print("\n== decoding, %s (%s): 2-thread full-decode loop %.0f images/s"
                  % (label, corpus, c))
            print("%-64s %10s  %s" % ("shardfeed bench, 224 output", "images/s", "vs full decode"))
            for name, extra in [
                    ("centre crop, scaled (1/8, 2/8, 4/8), cropped", ["--crop", "center"]),
                    ("centre crop, any n/8, cropped", ["--crop", "center", "--decode",
                                                      "scaled-any"]),
                    ("centre crop, full scale, cropped", ["--crop", "center", "--decode",
                                                         "cropped"]),
                    ("RRC + flip, scaled (1/8, 2/8, 4/8), cropped", ["--crop", "random",
                                                                     "--flip"]),
                    ("RRC + flip, any n/8, cropped", ["--crop", "random", "--flip", "--decode",
                                                      "scaled-any"]),
                    ("RRC + flip, full decode then crop", ["--crop", "random", "--flip",
                                                           "--decode", "full"])]:
                v = bench(archive, *extra)
                print("%-64s %s  %.2fx" % (name, fmt(v), v / c))
            if corpus == args.camera:
                for scale in (1, 2, 4, 8):
                    v = run_json([ceiling, archive, "--threads", str(args.workers), "--repeat",
                                  "1", "--scale", str(scale)])["images_per_second"]
                    print("%-64s %s  %.2fx" % ("2-thread whole-image decode loop at %d/8" % scale,
                                               fmt(v), v / c))

        # 3. A resolution cap at pack time.
        if args.camera:
            capped = os.path.join(tmp, "camera512")
            t = time.perf_counter()
            subprocess.run([sf, "pack", args.camera, capped, "-q", "--size", "512"], check=True,
                           stdout=subprocess.DEVNULL)
            pack_s = time.perf_counter() - t
            info = run_json([sf, "inspect", capped, "--json"])
            orig = run_json([sf, "inspect", cam, "--json"])
            print("\n== resolution cap, camera-size photos: pack --size 512 took %.1f s; %d of %d "
                  "records re-encoded; %.0f MB -> %.0f MB"
                  % (pack_s, info["resized_records"], info["samples"],
                     orig["payload_bytes"] / 1e6, info["payload_bytes"] / 1e6))
            print("%-64s %10s %10s  %s" % ("224 output", "original", "--size 512", "ratio"))
            for name, extra in [("centre crop", ["--crop", "center"]),
                                ("RRC + flip", ["--crop", "random", "--flip"])]:
                a, b = bench(cam, *extra), bench(capped, *extra)
                print("%-64s %s %s  %.2fx" % ("shardfeed, " + name, fmt(a), fmt(b), b / a))
            ff = ffcv_ips(args, args.camera, os.path.join(tmp, "camera.beton"))
            print("%-64s %s %s" % ("FFCV 1.0.2, centre crop (its writer, max_resolution=512)",
                                   "", fmt(ff)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
