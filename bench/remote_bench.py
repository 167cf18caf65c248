#!/usr/bin/env python3
"""Remote reading: the same JPEG archive read from local disk, over http:// from nginx and over
s3:// from moto_server (both on loopback), epoch 1 with a cold cache and epoch 2 warm, then the
block shuffle against the global one (shards fetched per epoch per rank, the label mix of the
first batches), then bytes fetched per epoch with a cache of 1/4 of the archive. All measured
in one run; the peers (MosaicML Streaming, LitData) beside it with --peers.

    PYTHONPATH=build/python /usr/bin/python3 bench/remote_bench.py CORPUS [--build build]
        [--workers 2] [--batch-size 64] [--repeat 3] [--windows 1,2,4,8]
        [--peers /tmp/peers/bin/python] [--peer-repeat 1]

CORPUS is an ImageFolder tree of JPEGs (bench/make_corpus.py). The script packs it (JPEG
passthrough, shards of 1/20 of the archive) into a temporary folder next to it, serves that
folder with nginx (Debian's, started here as an unprivileged process with its own config, pid
and logs in the temporary folder; stopped at the end) and uploads the shards to a moto_server
(scripts/install-deps.sh's remote venv, or SHARDFEED_REMOTE_VENV). Every timed read runs in a
fresh process with a fresh cache folder: epoch 1 includes opening the archive (the download of
its shards), as a training job's first epoch does. Figures are the median of --repeat rounds,
each round reading local, http and s3 in turn; the page cache holds the archive for all of them
(a warm-up read comes first).
Bytes and shards fetched are counted by the server (nginx's access log), not by the reader.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import consume  # noqa: E402

NOBODY = 65534


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, bound_s=60):
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("server exited with %d" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nothing listens on port %d after %d s" % (port, bound_s))


NGINX_CONF = """daemon off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 256; }}
http {{
  log_format bench '$request_method $uri $status $body_bytes_sent';
  access_log {d}/access.log bench;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  default_type application/octet-stream;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  server {{
    listen 127.0.0.1:{port};
    root {root};
  }}
}}
"""


class Nginx:
    """nginx serving `root` on a free loopback port: its config, pid and logs in `state`.
    As root it is started under setpriv as nobody (the served folder must be world-readable)."""

    def __init__(self, root, state):
        self.state = state
        os.makedirs(state, exist_ok=True)
        self.port = free_port()
        conf = os.path.join(state, "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_CONF.format(d=state, port=self.port, root=root))
        self.log = os.path.join(state, "access.log")
        cmd = [shutil.which("nginx") or "/usr/sbin/nginx", "-p", state, "-c", conf,
               "-e", os.path.join(state, "error.log")]
        if os.geteuid() == 0:
            for d, _, files in os.walk(state):
                os.chown(d, NOBODY, NOBODY)
                for f in files:
                    os.chown(os.path.join(d, f), NOBODY, NOBODY)
            cmd = ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups",
                   *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_listening(self.port, self.proc)
        except RuntimeError as e:
            raise RuntimeError("nginx did not start (%s): %s" %
                               (e, self.proc.stderr.read().decode(errors="replace")))
        self.url = "http://127.0.0.1:%d" % self.port

    def stop(self):
        self.proc.send_signal(signal.SIGQUIT)  # graceful: finish the requests in flight
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def remote_venv():
    v = os.environ.get("SHARDFEED_REMOTE_VENV") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "shardfeed",
        "remote-venv")
    return v


class Moto:
    """moto_server on a free loopback port (the remote tests' S3 server)."""

    def __init__(self):
        self.python = os.path.join(remote_venv(), "bin", "python")
        server = os.path.join(remote_venv(), "bin", "moto_server")
        if not os.path.exists(server):
            raise RuntimeError("no moto_server in %s: run scripts/install-deps.sh" % remote_venv())
        self.port = free_port()
        self.proc = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(self.port, self.proc)
        self.url = "http://127.0.0.1:%d" % self.port

    def env(self):
        # S3_ENDPOINT_URL: MosaicML Streaming's name for the endpoint
        return {"AWS_ENDPOINT_URL": self.url, "S3_ENDPOINT_URL": self.url,
                "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}

    def upload(self, folder, bucket, prefix):
        """Every file of `folder` to s3://bucket/prefix/ (boto3 from the remote venv)."""
        script = ("import boto3, os, sys\n"
                  "c = boto3.client('s3', endpoint_url=sys.argv[1], aws_access_key_id='bench',"
                  " aws_secret_access_key='bench', region_name='us-east-1')\n"
                  "c.create_bucket(Bucket=sys.argv[3])\n"
                  "for n in sorted(os.listdir(sys.argv[2])):\n"
                  "    c.upload_file(os.path.join(sys.argv[2], n), sys.argv[3], sys.argv[4] + '/' + n)\n")
        subprocess.run([self.python, "-c", script, self.url, folder, bucket, prefix], check=True)
        return "s3://%s/%s" % (bucket, prefix)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def log_bytes(log, start=0):
    """(GETs of shard files, body bytes of all GETs, end offset) of nginx's access log from
    byte offset `start`."""
    shards = body = 0
    with open(log, "rb") as f:
        f.seek(start)
        data = f.read()
    for line in data.decode().splitlines():
        method, uri, status, sent = line.split()
        if method == "GET":
            body += int(sent)
            shards += "/shard-" in uri
    return shards, body, start + len(data)


# ---- the measuring child: one fresh process per timed read ----

def measure(a):
    """Opens `a.measure` and reads --epochs epochs; prints JSON: per epoch, images and seconds
    (epoch 1 includes the open), and nginx's figures per epoch when --log names its log."""
    import shardfeed
    opts = dict(batch_size=a.batch_size, workers=a.workers, crop="center", size=224,
                shuffle=a.shuffle if a.shuffle == "block" else True, seed=0)
    if a.window:
        opts["shuffle_window"] = a.window
    offset = log_bytes(a.log)[2] if a.log else 0
    out = {"epochs": []}
    t0 = time.perf_counter()
    try:
        loader = shardfeed.Loader(a.measure, **opts)
    except Exception as e:  # a refused cache limit is a figure too
        print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)}))
        return 0
    for e in range(a.epochs):
        loader.set_epoch(e)
        c = consume(loader)
        t1 = time.perf_counter()
        row = {"images": c.images, "seconds": t1 - t0, "first_batch_s": c.first}
        if a.log:
            row["shard_gets"], row["bytes"], offset = log_bytes(a.log, offset)
        out["epochs"].append(row)
        t0 = t1
    stats = loader.stats()
    out["stats"] = {k: v for k, v in stats.items()
                    if any(w in k for w in ("fetch", "cache", "hit", "miss"))}
    loader.close()
    print(json.dumps(out))
    return 0


def run_child(args, location, cache, env=None, shuffle="global", window=0, log=None, epochs=2):
    e = dict(os.environ, SHARDFEED_CACHE_DIR=cache, **(env or {}))
    cmd = [sys.executable, os.path.abspath(__file__), "--measure", location, "--workers",
           str(args.workers), "--batch-size", str(args.batch_size), "--epochs", str(epochs),
           "--shuffle", shuffle, "--window", str(window)]
    if log:
        cmd += ["--log", log]
    out = subprocess.run(cmd, env=e, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("measuring %s failed:\n%s" % (location, out.stderr))
    return json.loads(out.stdout.strip().splitlines()[-1])


def timed(args, tmp, targets):
    """{name: (median images/s of epoch 1 (cold cache, open included), of epoch 2)} over --repeat
    rounds; each round reads every (name, location, env) of `targets` in turn, so a change in
    the machine's load falls on all of them alike."""
    runs = {name: ([], []) for name, _, _ in targets}
    for r in range(args.repeat):
        for name, location, env in targets:
            cache = tempfile.mkdtemp(prefix="cache-", dir=tmp)
            res = run_child(args, location, cache, env)
            shutil.rmtree(cache, ignore_errors=True)
            (a, b) = res["epochs"][:2]
            runs[name][0].append(a["images"] / a["seconds"])
            runs[name][1].append(b["images"] / b["seconds"])
    return {name: (statistics.median(e1), statistics.median(e2)) for name, (e1, e2) in runs.items()}


# ---- block shuffle: order figures from the loader itself ----

def shard_of(manifest):
    starts = [s["first_sample"] for s in manifest["shards"]]
    import bisect
    return lambda i: bisect.bisect_right(starts, i) - 1


def lru_fetches(shards_in_order, capacity):
    """Fetches an LRU cache of `capacity` shards makes over the access order."""
    cache, n = OrderedDict(), 0
    for s in shards_in_order:
        if s in cache:
            cache.move_to_end(s)
            continue
        n += 1
        cache[s] = True
        if len(cache) > capacity:
            cache.popitem(last=False)
    return n


def order_figures(archive, manifest, batch_size, shuffle, window, ranks, capacity, first_k):
    """Per rank: shards read, LRU fetches with a cache of `capacity` shards, and the distinct
    classes in the first k batches for each k in first_k."""
    import shardfeed
    which = shard_of(manifest)
    rows = []
    for rank in range(ranks):
        opts = dict(batch_size=batch_size, workers=1, crop="center", size=16, seed=0,
                    shuffle=shuffle if shuffle == "block" else True, rank=rank, world_size=ranks)
        if window:
            opts["shuffle_window"] = window
        with shardfeed.Loader(archive, **opts) as loader:
            loader.set_epoch(0)
            batches = [(b.indices.copy(), b.labels.copy()) for b in loader]
        order = [which(int(i)) for idx, _ in batches for i in idx]
        mix = [len(set(int(x) for _, lab in batches[:k] for x in lab)) for k in first_k]
        rows.append({"shards": len(set(order)), "fetches": lru_fetches(order, capacity),
                     "mix": mix})
    return rows


# ---- the report ----

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus", nargs="?")
    ap.add_argument("--build", default="build")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--windows", default="1,2,4,8")
    ap.add_argument("--peers", default="", help="the peers' interpreter (bench/install-peers.sh)")
    ap.add_argument("--peer-repeat", type=int, default=1, help="runs per peer (they are slow)")
    ap.add_argument("--skip-moto", action="store_true", help="http:// only")
    # the measuring child's options
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--epochs", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--shuffle", default="global", help=argparse.SUPPRESS)
    ap.add_argument("--window", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--log", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        return measure(args)
    if not args.corpus:
        ap.error("CORPUS is required")
    sf = os.path.join(args.build, "shardfeed")
    tmp = tempfile.mkdtemp(prefix="shardfeed-remotebench-",
                           dir=os.path.dirname(os.path.abspath(args.corpus)))
    os.chmod(tmp, 0o755)  # nginx runs as nobody when this runs as root
    servers = []
    try:
        report(args, sf, tmp, servers)
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(args, sf, tmp, servers):
    serve = os.path.join(tmp, "serve")
    archive = os.path.join(serve, "jpeg")
    src_bytes = sum(os.path.getsize(os.path.join(d, f))
                    for d, _, fs in os.walk(args.corpus) for f in fs)
    shard_size = max(1 << 20, src_bytes // 20)
    subprocess.run([sf, "pack", args.corpus, archive, "-q", "--shard-size", str(shard_size)],
                   check=True, stdout=subprocess.DEVNULL)
    os.chmod(serve, 0o755)
    with open(os.path.join(archive, "manifest.json")) as f:
        manifest = json.load(f)
    archive_bytes = sum(s["file_bytes"] for s in manifest["shards"])
    n_shards = len(manifest["shards"])

    nginx = Nginx(serve, os.path.join(tmp, "nginx"))
    servers.append(nginx)
    http = nginx.url + "/jpeg"
    moto = s3 = None
    if not args.skip_moto:
        moto = Moto()
        servers.append(moto)
        s3 = moto.upload(archive, "bench", "jpeg")

    print("corpus: %s (%d JPEGs, %.1f MB); archive: %d shards, %.1f MB; %d CPU(s); batch %d, "
          "%d workers, JPEG centre crop 224, global shuffle; median of %d runs"
          % (args.corpus, manifest["sample_count"], src_bytes / 1e6, n_shards, archive_bytes / 1e6,
             os.cpu_count(), args.batch_size, args.workers, args.repeat))
    run_child(args, archive, os.path.join(tmp, "warm"), epochs=1)  # page cache, first imports
    targets = [("shardfeed, local disk", archive, None),
               ("shardfeed, http:// (nginx, loopback)", http, None)]
    if moto:
        targets.append(("shardfeed, s3:// (moto_server, loopback)", s3, moto.env()))
    figures = timed(args, tmp, targets)
    local = figures[targets[0][0]]
    rows = [(name, figures[name], None if i == 0 else local) for i, (name, _, _) in enumerate(targets)]
    if args.peers:
        rows += peer_rows(args, tmp, moto, local)
    print("%-46s %14s %14s  %s" % ("reader", "epoch 1 img/s", "epoch 2 img/s",
                                    "vs local (goals: >= 0.7x, >= 0.97x)"))
    for name, fig, base in rows:
        if isinstance(fig, str):
            print("%-46s %s" % (name, fig))
            continue
        ratio = "%.2fx, %.2fx" % (fig[0] / base[0], fig[1] / base[1]) if base else ""
        print("%-46s %14.0f %14.0f  %s" % (name, fig[0], fig[1], ratio))

    # Block shuffle against the global one: the order each of 2 ranks reads.
    capacity = max(1, n_shards // 4)
    windows = [int(w) for w in args.windows.split(",") if w]
    first_k = (1, 4, 16)
    print("\nshuffle order, 2 ranks, epoch 0 (%d shards of %.1f MB, %d classes): shards read per "
          "rank, shard fetches per rank through an LRU cache of %d shards (1/4 of the archive), "
          "distinct classes in the first 1/4/16 batches of %d"
          % (n_shards, archive_bytes / n_shards / 1e6, len(manifest["class_names"]), capacity,
             args.batch_size))
    print("%-22s %14s %22s %26s" % ("shuffle", "shards read", "fetches (LRU 1/4)",
                                    "classes in first 1/4/16"))
    configs = [("global", 0)] + [("block", w) for w in windows]
    for shuffle, w in configs:
        rows = order_figures(archive, manifest, args.batch_size, shuffle, w, 2, capacity, first_k)
        name = "global" if shuffle == "global" else "block, window %d" % w
        print("%-22s %14s %22s %26s" % (
            name, " / ".join(str(r["shards"]) for r in rows),
            " / ".join(str(r["fetches"]) for r in rows),
            "  ".join("/".join(str(m) for m in r["mix"]) for r in rows)))

    # Bytes fetched per epoch with a cache of 1/4 of the archive, block shuffle (measured at
    # the server).
    limit = archive_bytes // 4
    print("\nhttp:// with SHARDFEED_CACHE_LIMIT=%d (1/4 of the archive), shuffle=block, default "
          "window: bytes fetched per epoch (nginx's access log; goal <= 1.1x the archive)" % limit)
    cache = tempfile.mkdtemp(prefix="cache-", dir=tmp)
    res = run_child(args, http, cache, {"SHARDFEED_CACHE_LIMIT": str(limit)}, shuffle="block",
                    log=nginx.log)
    if "error" in res:
        print("  refused at open: %s" % res["error"])
    else:
        for i, e in enumerate(res["epochs"]):
            print("  epoch %d: %d shard GETs, %.1f MB = %.2fx the archive, %.0f images/s"
                  % (i + 1, e["shard_gets"], e["bytes"] / 1e6, e["bytes"] / archive_bytes,
                     e["images"] / e["seconds"]))
        if res.get("stats"):
            print("  loader stats: %s" % json.dumps(res["stats"]))


def peer_rows(args, tmp, moto, local):
    """MosaicML Streaming and LitData through bench/peers_remote.py (the peers' interpreter)."""
    rows = []
    if not os.path.exists(args.peers):
        return [("peers", "not run: no interpreter at %s (bash bench/install-peers.sh)" % args.peers)]
    if moto is None:
        return [("peers", "not run: they read from s3:// (moto), skipped with --skip-moto")]
    for peer in ("streaming", "litdata"):
        cmd = [args.peers, os.path.join(HERE, "peers_remote.py"), peer, args.corpus,
               "--work", os.path.join(tmp, peer), "--endpoint", moto.url,
               "--workers", str(args.workers), "--batch-size", str(args.batch_size),
               "--repeat", str(args.peer_repeat)]
        out = subprocess.run(cmd, capture_output=True, text=True,
                             env=dict(os.environ, **moto.env()))
        last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
        try:
            res = json.loads(last)
        except ValueError:
            res = {"error": (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1]}
        name = {"streaming": "MosaicML Streaming, s3:// (moto)",
                "litdata": "LitData, s3:// (moto)"}[peer]
        if "error" in res:
            rows.append((name, "failed: " + res["error"]))
        else:
            rows.append((name + ", " + res["version"], (res["epoch1"], res["epoch2"]), local))
    rows.append(("Streaming, LitData over http:// (nginx)",
                 "not run: neither has an http(s) downloader (their remotes: object stores, "
                 "sftp, hf, local)"))
    return rows


if __name__ == "__main__":
    sys.exit(main())
