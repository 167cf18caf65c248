"""A real S3-compatible server (moto_server, from `moto[server]` in the test virtual environment
that scripts/install-deps.sh makes) and Python's http.server on loopback, plus a fault proxy
(fault_proxy.py) in front of moto: resets, stalled bodies, corrupt bodies, a count of GETs.
Servers run in their own processes: the reader holds the GIL while it fetches."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import shardfeed

GOOD = os.path.join(os.environ.get("SHARDFEED_TEST_DATA", ""), "good")
BUCKET = "data"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc=None, bound_s=60):
    """Polls (bounded) until something accepts connections on `port`."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {bound_s} s")


@pytest.fixture(scope="session")
def moto_url():
    """http://127.0.0.1:PORT of a moto_server started for this session."""
    server = os.path.join(os.path.dirname(sys.executable), "moto_server")
    if not os.path.exists(server):
        server = shutil.which("moto_server")
    assert server, "moto_server not found: run scripts/install-deps.sh (moto[server] venv)"
    port = free_port()
    proc = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def moto_signed():
    """A second moto_server that checks every request's SigV4 signature (as S3, MinIO and R2 do;
    the one above accepts any): (url, key id, secret) of a user allowed s3:*, bucket made."""
    import boto3
    server = os.path.join(os.path.dirname(sys.executable), "moto_server")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The first 3 requests (making the user, its policy and its key) go unchecked; then auth is on.
    proc = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(port)],
                            env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, proc)
        iam = boto3.client("iam", endpoint_url=url, aws_access_key_id="admin",
                           aws_secret_access_key="admin", region_name="us-east-1")
        iam.create_user(UserName="packer")
        iam.put_user_policy(UserName="packer", PolicyName="s3", PolicyDocument=(
            '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:*",'
            '"Resource":"*"}]}'))
        key = iam.create_access_key(UserName="packer")["AccessKey"]
        key_id, secret = key["AccessKeyId"], key["SecretAccessKey"]
        boto3.client("s3", endpoint_url=url, aws_access_key_id=key_id,
                     aws_secret_access_key=secret,
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)
        yield url, key_id, secret
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def local_archive(tmp_path_factory):
    """36 JPEGs in shards of about 30 KB of records (LMDB): 8 to 22 shards."""
    out = str(tmp_path_factory.mktemp("remote") / "a")
    assert shardfeed.pack(GOOD, out, shard_size="30K")["packed"] == 36
    return out


def s3_client(url):
    import boto3
    return boto3.client("s3", endpoint_url=url, aws_access_key_id="test",
                        aws_secret_access_key="test", region_name="us-east-1")


def upload(url, folder, prefix):
    client = s3_client(url)
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    for name in sorted(os.listdir(folder)):
        client.upload_file(os.path.join(folder, name), BUCKET, f"{prefix}/{name}")
    return f"s3://{BUCKET}/{prefix}"


@pytest.fixture(scope="session")
def s3_archive(moto_url, local_archive):
    return upload(moto_url, local_archive, "good")


@pytest.fixture
def env(monkeypatch, tmp_path, moto_url):
    """AWS variables pointing at moto, a fresh cache, quick retries."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret-never-shown")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.delenv("SHARDFEED_CACHE_LIMIT", raising=False)
    monkeypatch.setenv("SHARDFEED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SHARDFEED_FETCH_MAX_DELAY", "0.2")
    return monkeypatch


class FaultProxy:
    """fault_proxy.py in its own process in front of `upstream`; see that file for the actions."""

    def __init__(self, upstream, tmp_path):
        port_file = tmp_path / "proxy-port"
        script = os.path.join(os.path.dirname(__file__), "fault_proxy.py")
        self.proc = subprocess.Popen([sys.executable, script, upstream, str(port_file)])
        for _ in range(3000):  # bounded: 30 s
            if port_file.exists() or self.proc.poll() is not None:
                break
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{port_file.read_text()}"

    def post(self, what, body):
        urllib.request.urlopen(urllib.request.Request(self.url + what, data=body), timeout=30)

    def rules(self, rules):
        self.post("/__rules", json.dumps(rules).encode())

    def all_reset(self, on):
        self.post("/__all_reset", b"1" if on else b"0")

    def release(self):
        self.post("/__release", b"")

    def state(self):
        with urllib.request.urlopen(self.url + "/__state", timeout=30) as r:
            return json.loads(r.read())

    def shard_gets(self):
        return {p: n for p, n in self.state()["gets"].items() if "shard-" in p}

    def wait_stalled(self, bound_s=60):
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            if self.state()["stalled"]:
                return True
            time.sleep(0.01)
        return False

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def proxy(moto_url, env, tmp_path):
    """A FaultProxy in front of moto, with AWS_ENDPOINT_URL pointing at it."""
    p = FaultProxy(moto_url, tmp_path)
    env.setenv("AWS_ENDPOINT_URL", p.url)
    yield p
    p.close()


@pytest.fixture(scope="session")
def http_url(local_archive):
    """http://127.0.0.1:PORT/a: Python's http.server (its own process) serving the archive's
    parent folder."""
    folder = os.path.dirname(local_archive)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "-b", "127.0.0.1", "-d", folder,
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, proc)
        yield f"http://127.0.0.1:{port}/{os.path.basename(local_archive)}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def many_shards(tmp_path_factory, moto_url):
    """(local path, s3:// location, shard bytes): 3200 random 8x8 images of 20 classes packed
    raw, 160 to a shard: 20 shards of equal size (an archive in shards of 1/20 of it)."""
    from PIL import Image
    import numpy as np
    root = tmp_path_factory.mktemp("many")
    rng = np.random.default_rng(5)
    for c in range(20):
        folder = root / "src" / f"class{c:02d}"
        folder.mkdir(parents=True)
        for i in range(160):
            pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i:03d}.png")
    probe = str(root / "probe")  # every record the same size: that size x 160 a shard
    shardfeed.pack(str(root / "src"), probe, encoding="raw")
    with open(os.path.join(probe, "manifest.json")) as f:
        record = json.load(f)["shards"][0]["payload_bytes"] / 3200
    out = str(root / "archive")
    report = shardfeed.pack(str(root / "src"), out, encoding="raw", shard_size=int(160.5 * record))
    assert report["packed"] == 3200
    with open(os.path.join(out, "manifest.json")) as f:
        shards = json.load(f)["shards"]
    assert len(shards) == 20 and {s["sample_count"] for s in shards} == {160}
    total = sum(os.path.getsize(os.path.join(out, s["file"])) for s in shards)
    return out, upload(moto_url, out, "many"), total


@pytest.fixture(scope="session")
def byte_split_shards(tmp_path_factory, moto_url):
    """(local path, s3:// location, shard bytes): 2000 random images of 20 classes whose sides
    differ by class (8 to 32 pixels), packed raw in shards of 1/20 of the records' bytes. Shard
    files split by bytes hold 30 to 400 samples, and a short last one: a photo archive's shape."""
    from PIL import Image
    import numpy as np
    root = tmp_path_factory.mktemp("bytesplit")
    rng = np.random.default_rng(7)
    for c in range(20):
        folder = root / "src" / f"class{c:02d}"
        folder.mkdir(parents=True)
        side = 8 + 8 * (c % 4)
        for i in range(100):
            pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i:03d}.png")
    payload = sum(100 * (8 + 8 * (c % 4)) ** 2 * 3 for c in range(20))
    out = str(root / "archive")
    report = shardfeed.pack(str(root / "src"), out, encoding="raw", shard_size=payload // 20)
    assert report["packed"] == 2000
    with open(os.path.join(out, "manifest.json")) as f:
        shards = json.load(f)["shards"]
    counts = sorted(s["sample_count"] for s in shards)
    assert len(shards) >= 20 and counts[0] < counts[1] < counts[-1]  # unequal, one short
    total = sum(os.path.getsize(os.path.join(out, s["file"])) for s in shards)
    return out, upload(moto_url, out, "bytesplit"), total
