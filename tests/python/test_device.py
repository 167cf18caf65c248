"""The CUDA path against the CPU reference: device batches equal the host batches byte for
byte, a slot is never refilled while a kernel the consumer queued still reads it, and 'cuda:N'
lands on device N. Runs where a GPU is present (bench/gpu_check.sh runs it there); skipped with
the reason everywhere else."""
import os

import numpy as np
import pytest
import torch

import shardfeed
import shardfeed.torch as sft

DATA = os.environ.get("SHARDFEED_TEST_DATA", "")
GOOD = os.path.join(DATA, "good")

pytestmark = pytest.mark.skipif(
    not shardfeed.cuda_available() or not torch.cuda.is_available(),
    reason="no usable CUDA device: %s" % (shardfeed.cuda_unavailable_reason() or
                                         "torch.cuda.is_available() is False"))


def test_device_batches_equal_host_batches(archive_path):
    opts = dict(batch_size=8, size=32, shuffle=True, seed=5, crop="random", flip=True)
    host = [(b.images.copy(), b.labels.copy()) for b in shardfeed.Loader(archive_path, **opts)]
    dev = [(i.cpu().numpy(), l.cpu().numpy()) for i, l in sft.Loader(archive_path, device="cuda",
                                                                     **opts)]
    assert len(dev) == len(host)
    for (hi, hl), (di, dl) in zip(host, dev):
        assert np.array_equal(hi, di) and np.array_equal(hl, dl)


def test_a_slot_is_not_refilled_while_the_consumer_still_reads_it(archive_path):
    # Each batch is summed by a kernel queued behind a long sleep on the consumer's stream, then
    # the batch is dropped at once. With one-way ordering the next copy into the slot would land
    # before the sum ran.
    opts = dict(batch_size=4, size=16, shuffle=True, seed=9, prefetch=2)
    want = [int(b.images.astype(np.int64).sum()) for b in shardfeed.Loader(archive_path, **opts)]
    sums = []
    for images, _ in sft.Loader(archive_path, device="cuda", **opts):
        torch.cuda._sleep(20_000_000)  # ~10 ms of GPU time before the read
        sums.append(images.to(torch.int64).sum())
        del images
    torch.cuda.synchronize()
    assert [int(s) for s in sums] == want


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_cuda_n_lands_on_device_n(archive_path):
    images, labels = next(iter(sft.Loader(archive_path, batch_size=4, size=16, device="cuda:1")))
    assert images.device.index == 1 and labels.device.index == 1


IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_float_batches_on_the_device_equal_the_host_path(archive_path, dtype, layout):
    opts = dict(batch_size=8, size=32, shuffle=True, seed=5, crop="random", flip=True,
                dtype=dtype, layout=layout, **IMAGENET)
    host = [i.clone().float() for i, _ in sft.Loader(archive_path, **opts)]
    dev = [i.float().cpu() for i, _ in sft.Loader(archive_path, device="cuda", **opts)]
    assert len(dev) == len(host)
    for h, d in zip(host, dev):
        assert torch.equal(h, d)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_normalize_on_device_matches_the_cpu_path(archive_path, dtype, layout):
    # The kernel (uint8 copied, normalised on the GPU) against the CPU reference: both round a
    # multiply and an add separately, then to the output type, so the bits are the same.
    opts = dict(batch_size=8, size=32, shuffle=True, seed=5, crop="random", flip=True,
                dtype=dtype, layout=layout, **IMAGENET)
    cpu = [i.clone() for i, _ in sft.Loader(archive_path, **opts)]
    gpu = [i.cpu() for i, _ in sft.Loader(archive_path, device="cuda", normalize_on_device=True,
                                          **opts)]
    assert len(gpu) == len(cpu)
    for c, g in zip(cpu, gpu):
        assert g.dtype == c.dtype and g.shape == c.shape
        assert torch.equal(c.view(torch.int16) if c.element_size() == 2 else c.view(torch.int32),
                           g.view(torch.int16) if g.element_size() == 2 else g.view(torch.int32))
