"""The Python module and shardfeed.torch, as training code uses them."""
import multiprocessing as mp
import os
import subprocess
import time

import numpy as np
import pytest
import torch

import shardfeed
import shardfeed.torch as sft

DATA = os.environ.get("SHARDFEED_TEST_DATA", "")
GOOD = os.path.join(DATA, "good")
DUMP = os.environ.get("SHARDFEED_DUMP_BATCHES", "dump_batches")


def epoch(loader):
    """Copies of every batch of one epoch: [(images, labels, indices)]."""
    return [(b.images.copy(), b.labels.copy(), b.indices.copy()) for b in loader]


def test_archive_access(archive_path):
    a = shardfeed.Archive(archive_path)
    assert len(a) == 36
    assert a.class_names == ["cat", "dog", "zebra"]
    assert a.encoding == "auto"  # pack's default: JPEGs kept, other images lossless
    image, label = a[13]
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert label == 1
    assert list(a.labels()) == [i // 12 for i in range(36)]
    with open(os.path.join(GOOD, "cat", "cat_000.jpg"), "rb") as f:
        assert bytes(a.record(0)) == f.read()
    with pytest.raises(IndexError):
        a[36]


def test_batches_equal_the_cpp_reader(archive_path, tmp_path):
    out = tmp_path / "cpp.bin"
    subprocess.run([DUMP, archive_path, str(out), "2", "8", "99", "random", "48", "1"], check=True)
    loader = shardfeed.Loader(archive_path, batch_size=8, shuffle=True, seed=99, crop="random",
                              size=48, flip=True, workers=2)
    loader.set_epoch(2)
    parts = []
    for b in loader:
        parts.append(b.images.tobytes())
        parts.append(b.labels.astype(np.int64).tobytes())
    assert b"".join(parts) == out.read_bytes()


def test_batches_are_views_into_the_ring(archive_path):
    loader = shardfeed.Loader(archive_path, batch_size=4, prefetch=3, size=32, workers=2)
    pointers = set()
    for b in loader:
        images, labels = b
        t = torch.from_numpy(images)
        assert t.data_ptr() == images.ctypes.data  # torch shares numpy's memory
        assert np.shares_memory(t.numpy(), images)
        assert images.base is not None and not images.flags.owndata  # not a copy
        pointers.add(images.ctypes.data)
        del images, labels, t, b
    # 9 batches went through 3 slots: the same memory, reused, never copied out.
    assert 1 <= len(pointers) <= 3


def test_a_held_batch_is_not_overwritten(archive_path):
    # 3 slots: the held batch, the loop variable's batch, and one being filled.
    loader = shardfeed.Loader(archive_path, batch_size=4, prefetch=3, size=32, workers=2,
                              shuffle=True, crop="random")
    it = iter(loader)
    held = next(it)
    snapshot = held.images.copy(), held.labels.copy()
    others = [b.images.ctypes.data for b in it]
    assert held.images.ctypes.data not in others
    assert np.array_equal(held.images, snapshot[0])
    assert np.array_equal(held.labels, snapshot[1])


@pytest.mark.parametrize("world", [2, 4])
def test_distributed_split_is_disjoint_complete_and_equal(archive_path, world):
    per_rank = []
    for rank in range(world):
        loader = sft.Loader(archive_path, batch_size=4, shuffle=True, seed=5, size=16,
                            rank=rank, world_size=world)
        batches = [(x.clone(), y.clone()) for x, y in loader]  # copies: views would hold the ring
        assert len(batches) == len(loader)
        per_rank.append(batches)
    assert len({len(b) for b in per_rank}) == 1  # equal batch counts
    labels = [int(y) for batches in per_rank for _, ys in batches for y in ys]
    assert len(labels) == 36  # 36 divides by 2 and 4: nothing padded
    indices = []
    for rank in range(world):
        loader = shardfeed.Loader(archive_path, batch_size=4, shuffle=True, seed=5, size=16,
                                  rank=rank, world_size=world)
        indices += [int(i) for b in loader for i in b.indices]
    assert sorted(indices) == list(range(36))  # disjoint and complete


def test_state_dict_resume_reproduces_the_batches(archive_path):
    opts = dict(batch_size=5, shuffle=True, seed=11, crop="random", size=24, flip=True)
    full = shardfeed.Loader(archive_path, **opts)
    full.set_epoch(1)
    want = epoch(full)

    first = shardfeed.Loader(archive_path, **opts)
    first.set_epoch(1)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    assert state["epoch"] == 1 and state["position"] == 3

    resumed = shardfeed.Loader(archive_path, **opts)
    resumed.load_state_dict(state)
    got = epoch(resumed)
    assert len(got) == len(want) - 3
    for (gi, gl, gx), (wi, wl, wx) in zip(got, want[3:]):
        assert np.array_equal(gi, wi) and np.array_equal(gl, wl) and np.array_equal(gx, wx)
    # The loader moves on to the next epoch by itself.
    s = resumed.state_dict()
    assert (s["epoch"], s["position"], s["seed"], s["consumed"]) == (2, 0, 11, 0)


def test_epochs_run_into_each_other_without_changing_a_batch(archive_path):
    # run_ahead (the default): once an epoch's samples are all handed out, the workers begin
    # the next one; the next iteration keeps those batches. What is delivered is exactly what
    # run_ahead=False delivers, epoch after epoch.
    opts = dict(batch_size=4, size=32, crop="random", flip=True, shuffle=True, seed=11,
                prefetch=3)
    on = shardfeed.Loader(archive_path, **opts)
    off = shardfeed.Loader(archive_path, run_ahead=False, **opts)
    for e in range(3):
        got, want = epoch(on), epoch(off)
        assert len(got) == len(want) == 9
        for (gi, gl, gx), (wi, wl, wx) in zip(got, want):
            assert np.array_equal(gi, wi) and np.array_equal(gl, wl) and np.array_equal(gx, wx)
        assert on.stats()["ahead_kept"] == (3 if e else 0), on.stats()
        deadline = time.monotonic() + 60  # the workers fill the ring with the next epoch
        while on.stats()["run_ahead_batches"] < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert on.stats()["run_ahead_batches"] == 3, on.stats()
    assert off.stats()["run_ahead_batches"] == 0 and off.stats()["ahead_kept"] == 0


def _child_reads(archive, conn):
    try:
        loader = shardfeed.Loader(archive, batch_size=6, shuffle=True, seed=3, size=20)
        conn.send([(b.images.copy(), b.labels.copy()) for b in loader])
    except Exception as e:  # report instead of hanging the parent
        conn.send(repr(e))
    conn.close()


def test_archive_opened_in_parent_is_read_in_forked_child(archive_path):
    archive = shardfeed.Archive(archive_path)
    len(archive)  # opened (mapped) here, before the fork
    want = [(b.images.copy(), b.labels.copy())
            for b in shardfeed.Loader(archive, batch_size=6, shuffle=True, seed=3, size=20)]
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_child_reads, args=(archive, child))
    p.start()
    got = parent.recv()
    p.join(60)
    assert not isinstance(got, str), got
    assert len(got) == len(want)
    for (gi, gl), (wi, wl) in zip(got, want):
        assert np.array_equal(gi, wi) and np.array_equal(gl, wl)


def test_map_style_dataset_in_a_dataloader_with_workers(archive_path):
    ds = sft.Dataset(archive_path)
    reference = shardfeed.Archive(archive_path)
    dl = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=2, shuffle=False)
    n = 0
    for i, (image, label) in enumerate(dl):
        want_image, want_label = reference[i]
        assert int(label[0]) == want_label
        assert np.array_equal(image[0].numpy(), want_image)
        n += 1
    assert n == 36
    assert ds.classes == ["cat", "dog", "zebra"]


def test_worker_processes_mode(archive_path):
    threads = epoch(shardfeed.Loader(archive_path, batch_size=6, shuffle=True, seed=1, size=20))
    procs = shardfeed.Loader(archive_path, batch_size=6, shuffle=True, seed=1, size=20,
                             mode="processes", workers=2)
    assert len(procs.worker_pids) == 2
    got = epoch(procs)
    for (a, b, c), (x, y, z) in zip(threads, got):
        assert np.array_equal(a, x) and np.array_equal(b, y)


def test_decode_errors_are_exceptions_naming_the_sample(archive_path, tmp_path):
    bad = tmp_path / "bad"
    shardfeed.pack(GOOD, str(bad))
    record = bytes(shardfeed.Archive(str(bad)).record(5))
    shard = bad / "shard-00000.mdb"
    data = bytearray(shard.read_bytes())
    at = data.find(record)
    data[at:at + 2] = b"XY"
    shard.write_bytes(bytes(data))
    loader = shardfeed.Loader(str(bad), batch_size=4, size=16)
    with pytest.raises(shardfeed.DataError, match="sample 5"):
        for _ in loader:
            pass
    with pytest.raises(shardfeed.DataError, match="sample 5"):
        shardfeed.Archive(str(bad))[5]
    report = shardfeed.verify(str(bad))
    assert not report["ok"] and report["bad_samples"][0]["index"] == 5


def test_bad_arguments_raise(archive_path, tmp_path):
    with pytest.raises(FileNotFoundError):
        shardfeed.Archive(str(tmp_path / "missing"))
    with pytest.raises(ValueError):
        shardfeed.Loader(archive_path, crop="diagonal")
    with pytest.raises(TypeError):
        shardfeed.Loader(archive_path, batch=3)
    with pytest.raises(ValueError):
        shardfeed.Loader(archive_path, rank=2, world_size=2)
    if not shardfeed.cuda_available():
        with pytest.raises(shardfeed.Error, match="CUDA"):
            shardfeed.Loader(archive_path, device="cuda")


def test_pack_inspect_verify_functions(tmp_path):
    out = tmp_path / "z"
    report = shardfeed.pack(GOOD, out, encoding="zstd", size=24, crop="center")
    assert report["packed"] == 36 and report["skipped"] == []
    info = shardfeed.inspect(out)
    assert info["encoding"] == "zstd" and info["shape"] == [24, 24, 3]
    assert shardfeed.verify(out, decode=True)["ok"]
    a = shardfeed.Archive(out)
    assert a.shape == (24, 24, 3)
    image, _ = a[0]
    loader = shardfeed.Loader(a, batch_size=36, crop="none", size=0)
    batch = next(iter(loader))
    assert np.array_equal(batch.images[0], image)  # raw copy path gives the record's pixels


def _distributed_rank(rank, world, init_file, archive_path, queue):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    loader = sft.Loader(archive_path, batch_size=4, shuffle=True, seed=8, size=16)
    indices = [int(i) for b in loader._loader for i in b.indices]
    queue.put((rank, len(loader), indices))
    dist.barrier()
    dist.destroy_process_group()


def test_torch_distributed_rank_and_world_are_picked_up(archive_path, tmp_path):
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    world = 2
    procs = [ctx.Process(target=_distributed_rank,
                         args=(r, world, str(tmp_path / "init"), archive_path, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=60) for _ in range(world))
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert [r for r, _, _ in results] == [0, 1]
    assert results[0][1] == results[1][1]  # equal len() on every rank
    a, b = set(results[0][2]), set(results[1][2])
    assert not (a & b) and a | b == set(range(36))


def test_archive_item_is_decoded_as_extract_and_verify_do(tmp_path):
    # archive[i] is the reader's own DecodeSample (converter/archive_tools.h): the record's
    # checksum is checked, so one flipped pixel byte of a raw record is an error naming the
    # sample, not a silently different image.
    out = tmp_path / "raw"
    shardfeed.pack(GOOD, out, encoding="raw", size=16, crop="center")
    a = shardfeed.Archive(out)
    good_image, _ = a[3]
    record = bytes(a.record(3))
    shard = out / "shard-00000.mdb"
    data = bytearray(shard.read_bytes())
    at = data.find(record) + len(record) // 2
    data[at] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(shardfeed.DataError, match="sample 3"):
        shardfeed.Archive(out)[3]
    assert np.array_equal(shardfeed.Archive(out)[2][0].shape, good_image.shape)
