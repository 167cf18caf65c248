"""Normalised float output (issue 13): float32/float16/bfloat16 batches equal a numpy
normalisation of the uint8 batch; NCHW is the transpose of NHWC; torch gets the dtype asked for,
zero-copy; bad options raise ValueError; process mode gives the same bytes."""
import os

import numpy as np
import pytest
import torch

import shardfeed
import shardfeed.torch as sft

DATA = os.environ.get("SHARDFEED_TEST_DATA", "")
GOOD = os.path.join(DATA, "good")
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)
OPTS = dict(batch_size=7, size=40, shuffle=True, seed=4, crop="random", flip=True, workers=2)


@pytest.fixture(scope="module")
def reference(archive_path):
    """The uint8 batches, normalised by numpy in float32: (x / 255 - mean) / std, NHWC."""
    out = []
    for b in shardfeed.Loader(archive_path, **OPTS):
        out.append((b.images.astype(np.float32) / 255 - MEAN) / STD)
    return out


def floats(archive_path, dtype, layout, **extra):
    loader = sft.Loader(archive_path, dtype=dtype, layout=layout, mean=tuple(MEAN),
                        std=tuple(STD), **OPTS, **extra)
    got = []
    for images, _ in loader:
        assert images.dtype == getattr(torch, dtype)
        x = images.float().numpy().copy()  # float() of float32 is the view itself
        got.append(x.transpose(0, 2, 3, 1) if layout == "nchw" else x)
    return got


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("dtype,ulp", [("float32", 2 ** -20), ("float16", 2 ** -10),
                                       ("bfloat16", 2 ** -7)])
def test_float_batches_equal_numpy_normalisation(archive_path, reference, dtype, layout, ulp):
    got = floats(archive_path, dtype, layout)
    assert len(got) == len(reference)
    for g, r in zip(got, reference):
        assert g.shape == r.shape
        # float16/bfloat16: one unit in the last place of the output type, relative to
        # max(|value|, 1). float32: a few units, since numpy's reference rounds three times
        # (x / 255, - mean, / std) where the loader rounds once (x * scale + bias).
        tol = ulp * np.maximum(np.abs(r), 1)
        assert np.all(np.abs(g - r) <= tol), np.abs(g - r).max()


def test_nchw_is_the_transpose_of_nhwc(archive_path):
    a = [b.images.copy() for b in shardfeed.Loader(archive_path, dtype="float32", **OPTS)]
    b = [b.images.copy() for b in shardfeed.Loader(archive_path, dtype="float32",
                                                    layout="nchw", **OPTS)]
    for x, y in zip(a, b):
        assert np.array_equal(x.transpose(0, 3, 1, 2), y)
    u = [b.images.copy() for b in shardfeed.Loader(archive_path, layout="nchw", **OPTS)]
    v = [b.images.copy() for b in shardfeed.Loader(archive_path, **OPTS)]
    for x, y in zip(v, u):
        assert np.array_equal(x.transpose(0, 3, 1, 2), y)


def test_default_float_is_x_over_255_and_torch_dtypes_are_accepted(archive_path):
    u8 = next(iter(shardfeed.Loader(archive_path, **OPTS))).images.astype(np.float32)
    f, _ = next(iter(sft.Loader(archive_path, dtype=torch.float32, **OPTS)))
    assert np.allclose(f.numpy(), u8 / 255, atol=1e-7, rtol=0)


def test_float_batches_are_zero_copy_views(archive_path):
    loader = shardfeed.Loader(archive_path, dtype="float16", **OPTS)
    batch = next(iter(loader))
    assert batch.images.dtype == np.float16 and not batch.images.flags["OWNDATA"]
    t = torch.from_numpy(batch.images)
    assert t.data_ptr() == batch.images.ctypes.data


def test_processes_mode_gives_the_same_floats(archive_path):
    a = floats(archive_path, "bfloat16", "nchw")
    b = floats(archive_path, "bfloat16", "nchw", mode="processes")
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("options,needle", [
    (dict(dtype="float64"), "dtype"),
    (dict(mean=(0.5, 0.5, 0.5)), "float dtype"),
    (dict(dtype="float32", std=(1, 0, 1)), "std"),
    (dict(dtype="float32", mean=(1, 2)), "mean"),
    (dict(dtype="float32", normalize_on_device=True), "normalize_on_device"),
])
def test_bad_normalisation_options_raise(archive_path, options, needle):
    with pytest.raises(ValueError, match=needle):
        shardfeed.Loader(archive_path, **options)


@pytest.mark.skipif(os.environ.get("SHARDFEED_CUDA_RUNTIME") != "ON",
                    reason="this build does not use the CUDA Toolkit")
def test_the_cuda_kernel_is_built_wherever_the_toolkit_is_used():
    # CMake found the toolkit for this build (the runtime is linked): nvcc must then have
    # compiled the normalisation kernel into the module too.
    assert shardfeed.cuda_kernels_built()
