"""pack, merge and convert with an s3:// OUT (moto_server on loopback): built in a staging
folder, shards uploaded (multipart above the part size), the manifest last; an existing
manifest refused without --overwrite; a failed upload leaves no manifest at the destination.
Faults come from an upload proxy run here, in a thread (the CLI runs as its own process)."""
import http.client
import http.server
import json
import os
import signal
import socket
import subprocess
import threading

import pytest

import shardfeed
from conftest import BUCKET, GOOD, s3_client

CLI = os.environ.get("SHARDFEED_CLI", "shardfeed")


def cli(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=600)


def make_bucket(url):
    c = s3_client(url)
    try:
        c.create_bucket(Bucket=BUCKET)
    except c.exceptions.BucketAlreadyOwnedByYou:
        pass
    return c


def records(path):
    a = shardfeed.Archive(path)
    return [bytes(a.record(i)) for i in range(len(a))], list(a.labels())


def keys(client, prefix):
    out = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")
    return sorted(o["Key"][len(prefix) + 1:] for o in out.get("Contents", []))


@pytest.fixture
def bucket(env, moto_url):
    return make_bucket(moto_url)


@pytest.mark.parametrize("name,opts", [
    ("small", ["--shard-size", "30K"]),
    # raw 512x512 records in shards of 12 MB: each goes up in 5 MiB parts (multipart upload)
    ("multipart", ["--encoding", "raw", "--size", "512", "--shard-size", "12M"]),
])
def test_pack_to_s3_verifies_and_reads_as_the_local_pack(env, bucket, tmp_path, name, opts):
    env.setenv("SHARDFEED_UPLOAD_PART_SIZE", "5MiB")
    local = str(tmp_path / "local")
    assert cli("pack", GOOD, local, "-q", *opts).returncode == 0
    staging = tmp_path / "staging"
    out = cli("pack", GOOD, f"s3://{BUCKET}/w-{name}", "-q", "--staging", str(staging), *opts)
    assert out.returncode == 0, out.stderr
    assert f"into s3://{BUCKET}/w-{name}" in out.stdout
    assert not os.path.exists(staging / f"w-{name}")  # uploaded: the local build is removed
    assert keys(bucket, f"w-{name}") == sorted(os.listdir(local))
    out = cli("verify", f"s3://{BUCKET}/w-{name}")
    assert out.returncode == 0, out.stderr
    assert "0 bad samples" in out.stdout
    assert records(f"s3://{BUCKET}/w-{name}") == records(local)


def test_pack_convert_and_merge_to_a_store_that_checks_signatures(env, moto_signed, tmp_path):
    # Every header a request signs must be sent: an `Expect:` signed but never sent made every
    # write fail with SignatureDoesNotMatch on real stores (reads were fine).
    url, key_id, secret = moto_signed
    env.setenv("AWS_ENDPOINT_URL", url)
    env.setenv("AWS_ACCESS_KEY_ID", key_id)
    env.setenv("AWS_SECRET_ACCESS_KEY", secret)
    env.setenv("SHARDFEED_UPLOAD_PART_SIZE", "5MiB")
    local = str(tmp_path / "local")
    assert cli("pack", GOOD, local, "-q", "--shard-size", "30K").returncode == 0
    out = cli("pack", GOOD, f"s3://{BUCKET}/signed", "-q", "--shard-size", "30K")
    assert out.returncode == 0, out.stderr
    # a multipart upload (create, parts, complete) signed as well
    out = cli("pack", GOOD, f"s3://{BUCKET}/signed-mp", "-q", "--encoding", "raw", "--size",
              "512", "--shard-size", "12M")
    assert out.returncode == 0, out.stderr
    out = cli("convert", local, f"s3://{BUCKET}/signed-conv", "-q")
    assert out.returncode == 0, out.stderr
    out = cli("pack", GOOD, f"s3://{BUCKET}/signed", "-q", "--overwrite")  # LIST and DELETE
    assert out.returncode == 0, out.stderr
    for name in ("signed", "signed-mp", "signed-conv"):
        out = cli("verify", f"s3://{BUCKET}/{name}")
        assert out.returncode == 0, out.stdout + out.stderr
    assert records(f"s3://{BUCKET}/signed") == records(local)


@pytest.mark.parametrize("signed", [False, True])
def test_a_prefix_with_characters_urls_reserve_is_written_and_read_as_its_keys(env, bucket,
                                                                               moto_signed,
                                                                               tmp_path, signed):
    # REGRESSION (found by a stranger's test): keys went into URLs unencoded: "x?y" PUT every
    # object to the key "x" (the rest a query) and reported success, "a#b" lost "#b", "%41"
    # became "A"; with --overwrite such a name would delete another prefix's objects.
    if signed:  # the encoded path is what SigV4 signs
        url, key_id, secret = moto_signed
        env.setenv("AWS_ENDPOINT_URL", url)
        env.setenv("AWS_ACCESS_KEY_ID", key_id)
        env.setenv("AWS_SECRET_ACCESS_KEY", secret)
        import boto3
        client = boto3.client("s3", endpoint_url=url, aws_access_key_id=key_id,
                              aws_secret_access_key=secret, region_name="us-east-1")
    else:
        client = bucket
    prefix = "odd dir/x?y#z%41+&=é"
    out = cli("pack", GOOD, f"s3://{BUCKET}/{prefix}", "-q", "--shard-size", "30K")
    assert out.returncode == 0, out.stderr
    names = keys(client, prefix)
    assert "manifest.json" in names and len(names) > 2, names
    assert keys(client, "odd dir/x") == [] and keys(client, "odd dir/xAy") == []
    out = cli("verify", f"s3://{BUCKET}/{prefix}", "--decode")
    assert out.returncode == 0, out.stdout + out.stderr
    out = cli("pack", GOOD, f"s3://{BUCKET}/{prefix}", "-q", "--overwrite")  # LIST, DELETE
    assert out.returncode == 0, out.stderr
    assert cli("verify", f"s3://{BUCKET}/{prefix}").returncode == 0


def test_half_a_key_pair_is_refused_naming_what_is_missing(env, s3_archive, tmp_path):
    # (S3 stranger) AWS_ACCESS_KEY_ID without its secret signed every request with an empty
    # secret, and the store's 403 said "check the credentials". Refused, as the AWS CLI does.
    env.delenv("AWS_SECRET_ACCESS_KEY")
    env.setenv("HOME", str(tmp_path))  # no ~/.aws/credentials to complete it
    out = cli("verify", s3_archive)
    assert out.returncode == 2, out.stderr
    assert "partial credentials: AWS_ACCESS_KEY_ID without AWS_SECRET_ACCESS_KEY" in out.stderr
    with pytest.raises(ValueError, match="partial credentials"):
        shardfeed.Archive(s3_archive)
    out = cli("pack", GOOD, f"s3://{BUCKET}/w-half", "-q")
    assert out.returncode == 2 and "partial credentials" in out.stderr, out.stderr


def test_an_http_location_with_a_query_or_fragment_is_refused(env, tmp_path):
    for loc in ("http://127.0.0.1:9/a?token=1", "https://example.com/a#x"):
        out = cli("verify", loc)
        assert out.returncode == 2, (loc, out.stderr)
        assert "a query or fragment cannot be part of an archive's URL" in out.stderr


def test_an_existing_manifest_is_refused_without_overwrite(env, bucket, tmp_path):
    dest = f"s3://{BUCKET}/w-again"
    assert cli("pack", GOOD, dest, "-q", "--shard-size", "30K").returncode == 0
    before = bucket.get_object(Bucket=BUCKET, Key="w-again/manifest.json")["Body"].read()
    out = cli("pack", GOOD, dest, "-q", "--shard-size", "60K")
    assert out.returncode == 2
    assert "w-again/manifest.json: already exists (pass --overwrite" in out.stderr
    assert bucket.get_object(Bucket=BUCKET, Key="w-again/manifest.json")["Body"].read() == before
    out = cli("pack", GOOD, dest, "-q", "--shard-size", "60K", "--overwrite")
    assert out.returncode == 0, out.stderr
    assert cli("verify", dest).returncode == 0
    local = str(tmp_path / "local")
    assert cli("pack", GOOD, local, "-q", "--shard-size", "60K").returncode == 0
    assert keys(bucket, "w-again") == sorted(os.listdir(local))
    assert records(dest) == records(local)


def test_convert_and_merge_write_to_s3(env, bucket, tmp_path):
    h5 = str(tmp_path / "h5")
    assert cli("pack", GOOD, h5, "-q", "--backend", "hdf5", "--shard-size", "30K").returncode == 0
    dest = f"s3://{BUCKET}/w-convert"
    out = cli("convert", h5, dest, "--backend", "lmdb")
    assert out.returncode == 0, out.stderr
    out = cli("verify", dest)
    assert out.returncode == 0, out.stdout + out.stderr
    assert records(dest) == records(h5)
    parts = str(tmp_path / "m.parts")
    for i in range(2):
        assert cli("pack", GOOD, str(tmp_path / "m"), "-q", "--part", f"{i}/2",
                   "--shard-size", "30K").returncode == 0
    local = str(tmp_path / "merged")
    assert cli("merge", parts, local).returncode == 0
    out = cli("merge", parts, f"s3://{BUCKET}/w-merge")
    assert out.returncode == 0, out.stderr
    assert records(f"s3://{BUCKET}/w-merge") == records(local)


def test_http_and_part_outs_are_refused(env, tmp_path):
    out = cli("pack", GOOD, "http://127.0.0.1:9/x", "-q")
    assert out.returncode == 2 and "read only" in out.stderr
    out = cli("pack", GOOD, f"s3://{BUCKET}/p", "-q", "--part", "0/2")
    assert out.returncode == 2 and "merge the parts into s3://" in out.stderr
    out = cli("pack", GOOD, str(tmp_path / "local"), "-q", "--staging", str(tmp_path / "s"))
    assert out.returncode == 2 and "--staging goes with an s3:// OUT" in out.stderr


def test_python_writers_refuse_a_remote_out_rather_than_write_a_local_s3_folder(tmp_path,
                                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    for call in (lambda: shardfeed.pack(GOOD, "s3://data/py"),
                 lambda: shardfeed.merge(str(tmp_path), "s3://data/py"),
                 lambda: shardfeed.convert(str(tmp_path), "https://host/py", "lmdb")):
        with pytest.raises(ValueError, match="with the CLI"):
            call()
    # (Found by a stranger's test: the Writer, pack_iterable and the Parquet importer wrote a
    # local folder ./s3:/data/py and said they had packed.)
    for call in (lambda: shardfeed.Writer("s3://data/py"),
                 lambda: shardfeed.pack_iterable([], "s3://data/py")):
        with pytest.raises(ValueError, match="writes a local folder; write locally and upload"):
            call()
    assert os.listdir(tmp_path) == []  # no folder named "s3:" or "https:"


class UploadProxy:
    """A proxy in front of moto that logs every request (method, path), resets the connection
    on requests whose path holds a fragment of `fail` (every time), holds those matching
    `stall` (a fragment, or a (method, fragment) pair) until release() (setting `stalled`) and
    then forwards them, and for the first request (method, fragment)
    of `lose` forwards it and then resets instead of answering (the store did it; the reply
    was lost), and answers later ones 404 NoSuchUpload, as MinIO (and S3, after a while) answer
    a retried CompleteMultipartUpload of an upload that is done (moto answers 200)."""

    def __init__(self, upstream):
        self.log, self.fail, self.stall, self.lose, self.lost = [], [], [], [], []
        # (method, fragment): answered HTTP 503 with a 256 MiB body, counting in flood_sent what
        # went out before the client hung up (a broken store or proxy answering without end)
        self.flood, self.flood_sent = [], 0
        # (method, fragment, code): answered 403 with that error code (no body for HEAD), as
        # S3 answers without a grant (AccessDenied) or with bad credentials
        self.deny = []
        self.stalled, self.released = threading.Event(), threading.Event()
        host = upstream.split("//", 1)[1]
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                outer.log.append((self.command, self.path))
                if any(self.command == f[0] and f[1] in self.path if isinstance(f, tuple)
                       else f in self.path for f in outer.stall):
                    outer.stalled.set()
                    outer.released.wait(120)  # bounded: the test releases it
                denied = [c for m, f, c in outer.deny if m == self.command and f in self.path]
                if denied:
                    data = b"" if self.command == "HEAD" else (
                        b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>" +
                        denied[0].encode() + b"</Code><Message>denied</Message></Error>")
                    self.send_response(403)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if any(m == self.command and f in self.path for m, f in outer.flood):
                    self.send_response(503)
                    self.send_header("Content-Length", str(256 << 20))
                    self.end_headers()
                    piece = b"x" * (64 << 10)
                    try:
                        for _ in range(4096):
                            self.wfile.write(piece)
                            outer.flood_sent += len(piece)
                    except OSError:
                        pass  # the client hung up: what it read is counted
                    self.close_connection = True
                    return
                if any(m == self.command and f in self.path for m, f in outer.lost):
                    data = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>NoSuchUpload"
                            b"</Code><Message>The specified upload does not exist.</Message>"
                            b"</Error>")
                    self.send_response(404)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if any(f in self.path for f in outer.fail):
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                conn = http.client.HTTPConnection(host, timeout=60)
                conn.request(self.command, self.path, body=body or None,
                             headers=dict(self.headers.items()))
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                lost = [x for x in outer.lose if x[0] == self.command and x[1] in self.path]
                if lost:
                    outer.lose.remove(lost[0])
                    outer.lost.append(lost[0])
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))  # HEAD: the object's
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = forward

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # the client hung up on a reset: expected here

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def release(self):
        self.released.set()

    def close(self):
        self.release()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upload_proxy(env, moto_url):
    p = UploadProxy(moto_url)
    env.setenv("AWS_ENDPOINT_URL", p.url)
    env.setenv("SHARDFEED_FETCH_RETRIES", "1")
    env.setenv("SHARDFEED_UPLOAD_PART_SIZE", "5MiB")
    yield p
    p.close()


RAW = ["--encoding", "raw", "--size", "512", "--shard-size", "12M"]


def test_the_manifest_goes_up_last(bucket, upload_proxy):
    out = cli("pack", GOOD, f"s3://{BUCKET}/w-order", "-q", *RAW)
    assert out.returncode == 0, out.stderr
    writes = [(m, p) for m, p in upload_proxy.log if m in ("PUT", "POST")]
    assert writes[-1] == ("PUT", f"/{BUCKET}/w-order/manifest.json")
    assert sum("manifest.json" in p for _, p in writes) == 1
    assert any("partNumber=3" in p for _, p in writes)  # multipart was used


def test_a_failed_part_leaves_no_manifest_and_keeps_the_build(bucket, upload_proxy, tmp_path, env,
                                                             moto_url):
    upload_proxy.fail = ["shard-00001.mdb?partNumber=2"]
    staging = tmp_path / "staging"
    out = cli("pack", GOOD, f"s3://{BUCKET}/w-broken", "-q", "--staging", str(staging), *RAW)
    assert out.returncode == 3  # an I/O error
    assert "shard-00001.mdb" in out.stderr and "part 2 of 3" in out.stderr
    assert "still failing after 2 attempts" in out.stderr
    assert f"s3://{BUCKET}/w-broken was not written (no manifest there)" in out.stderr
    assert "test-secret-never-shown" not in out.stderr
    assert os.path.exists(staging / "w-broken" / "manifest.json")  # kept, as the message says
    assert str(staging / "w-broken") in out.stderr
    assert "manifest.json" not in keys(bucket, "w-broken")
    assert not any("manifest.json" in p for m, p in upload_proxy.log if m == "PUT")
    uploads = bucket.list_multipart_uploads(Bucket=BUCKET, Prefix="w-broken/")
    assert not uploads.get("Uploads")  # the failed one was aborted
    env.setenv("AWS_ENDPOINT_URL", moto_url)  # the reader holds the GIL: not through the proxy
    with pytest.raises(FileNotFoundError):
        shardfeed.Archive(f"s3://{BUCKET}/w-broken")


def test_a_completed_multipart_upload_whose_reply_was_lost_is_not_an_error(bucket, upload_proxy,
                                                                          tmp_path, env,
                                                                          moto_url):
    # REGRESSION: the store completed shard-00001's multipart upload but its reply was lost;
    # the retried CompleteMultipartUpload then answers 404 NoSuchUpload (the upload is done),
    # which failed the pack. The object is there, whole: the pack goes on.
    upload_proxy.lose = [("POST", "shard-00001.mdb?uploadId=")]
    env.setenv("TMPDIR", str(tmp_path))
    local = str(tmp_path / "local")
    assert cli("pack", GOOD, local, "-q", *RAW).returncode == 0
    out = cli("pack", GOOD, f"s3://{BUCKET}/w-lost", "-q", *RAW)
    assert out.returncode == 0, out.stderr
    assert not upload_proxy.lose  # the reply was lost once
    completes = [p for m, p in upload_proxy.log if m == "POST" and "shard-00001.mdb?uploadId=" in p]
    assert len(completes) == 2
    env.setenv("AWS_ENDPOINT_URL", moto_url)
    assert records(f"s3://{BUCKET}/w-lost") == records(local)
    assert cli("verify", f"s3://{BUCKET}/w-lost", "-q").returncode == 0


def test_no_such_upload_with_a_foreign_object_of_the_same_size_fails_the_pack(bucket, upload_proxy,
                                                                              tmp_path, env,
                                                                              moto_url):
    # REGRESSION: NoSuchUpload is also the answer when someone else aborted our upload (a
    # lifecycle rule, a clean-up job). An object of the same size and part count, other bytes,
    # then at the key was taken for ours (size and "-N" were all the check compared): the pack
    # exited 0, published the manifest over it and deleted the local build. Now the object's
    # ETag must be the one our parts make; here it is not, so the pack fails, keeping the build.
    env.setenv("TMPDIR", str(tmp_path))
    local = str(tmp_path / "local")
    assert cli("pack", GOOD, local, "-q", *RAW).returncode == 0
    size = os.path.getsize(os.path.join(local, "shard-00001.mdb"))
    key = "w-aborted/shard-00001.mdb"
    upload_proxy.stall = ["shard-00001.mdb?uploadId="]  # hold our CompleteMultipartUpload
    upload_proxy.lost = [("POST", "shard-00001.mdb?uploadId=")]  # then answer NoSuchUpload

    def meanwhile():
        assert upload_proxy.stalled.wait(300)
        for u in bucket.list_multipart_uploads(Bucket=BUCKET, Prefix="w-aborted/").get(
                "Uploads", []):
            if u["Key"] == key:
                bucket.abort_multipart_upload(Bucket=BUCKET, Key=key, UploadId=u["UploadId"])
        foreign, part = os.urandom(size), 5 << 20
        mp = bucket.create_multipart_upload(Bucket=BUCKET, Key=key)
        parts = []
        for i, at in enumerate(range(0, size, part), 1):
            r = bucket.upload_part(Bucket=BUCKET, Key=key, UploadId=mp["UploadId"], PartNumber=i,
                                   Body=foreign[at:at + part])
            parts.append({"PartNumber": i, "ETag": r["ETag"]})
        bucket.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=mp["UploadId"],
                                         MultipartUpload={"Parts": parts})
        upload_proxy.release()

    t = threading.Thread(target=meanwhile)
    t.start()
    staging = tmp_path / "staging"
    out = cli("pack", GOOD, f"s3://{BUCKET}/w-aborted", "-q", "--staging", str(staging), *RAW)
    t.join()
    assert out.returncode != 0, out.stderr
    assert "shard-00001.mdb" in out.stderr and "NoSuchUpload" in out.stderr, out.stderr
    assert "manifest.json" not in keys(bucket, "w-aborted")
    assert os.path.exists(staging / "w-aborted" / "manifest.json")  # the build is kept


def test_a_manifest_head_denied_without_list_bucket_is_explained_and_overwrite_goes_on(
        bucket, upload_proxy, tmp_path, env):
    # REGRESSION: S3 answers a HEAD of a missing object 403 when the credentials lack
    # s3:ListBucket; pack then failed with "check the credentials", which are fine, and
    # --overwrite did not help. Now the message says why, and --overwrite writes (deleting a
    # manifest that may be there first, so no reader pairs it with the new shards).
    # S3 without s3:ListBucket: a missing object's HEAD and GET are 403 AccessDenied, and so
    # is the listing of the prefix
    upload_proxy.deny = [("HEAD", "w-denied/manifest.json", "AccessDenied"),
                         ("GET", "w-denied/manifest.json", "AccessDenied"),
                         ("GET", "prefix=w-denied", "AccessDenied")]
    env.setenv("TMPDIR", str(tmp_path))
    out = cli("pack", GOOD, f"s3://{BUCKET}/w-denied", "-q")
    assert out.returncode != 0
    assert "s3:ListBucket" in out.stderr and "--overwrite" in out.stderr, out.stderr
    assert f"s3://{BUCKET}/w-denied/manifest.json" in out.stderr
    assert keys(bucket, "w-denied") == []  # refused before anything was written
    out = cli("pack", GOOD, f"s3://{BUCKET}/w-denied", "-q", "--overwrite")
    assert out.returncode == 0, out.stderr
    assert ("DELETE", f"/{BUCKET}/w-denied/manifest.json") in upload_proxy.log
    assert "manifest.json" in keys(bucket, "w-denied")
    # Credentials that are wrong anyway fail at once, --overwrite or not (not after a build)
    upload_proxy.deny = [("HEAD", "w-badkey/manifest.json", "InvalidAccessKeyId"),
                         ("GET", "w-badkey/manifest.json", "InvalidAccessKeyId")]
    out = cli("pack", GOOD, f"s3://{BUCKET}/w-badkey", "-q", "--overwrite")
    assert out.returncode != 0 and "InvalidAccessKeyId" in out.stderr, out.stderr
    assert not [d for d in os.listdir(tmp_path) if d.startswith("shardfeed-staging-")]


def test_a_prefix_with_objects_but_no_manifest_is_refused_without_overwrite(env, bucket,
                                                                          tmp_path):
    # REGRESSION: with no manifest at the prefix, pack uploaded its shards over same-named
    # objects there (a user's own, or anything) without --overwrite.
    bucket.put_object(Bucket=BUCKET, Key="w-foreign/shard-00000.mdb", Body=b"not ours")
    env.setenv("TMPDIR", str(tmp_path))
    out = cli("pack", GOOD, f"s3://{BUCKET}/w-foreign", "-q")
    assert out.returncode == 2, out.stderr
    assert "holds objects but no manifest" in out.stderr and "--overwrite" in out.stderr
    assert "w-foreign/shard-00000.mdb" in out.stderr
    body = bucket.get_object(Bucket=BUCKET, Key="w-foreign/shard-00000.mdb")["Body"].read()
    assert body == b"not ours" and keys(bucket, "w-foreign") == ["shard-00000.mdb"]
    assert not os.listdir(tmp_path)  # refused before a staging folder was made
    out = cli("pack", GOOD, f"s3://{BUCKET}/w-foreign", "-q", "--overwrite")
    assert out.returncode == 0, out.stderr
    assert "manifest.json" in keys(bucket, "w-foreign")
    # a prefix that only shares the beginning of the name is not "under" it
    bucket.put_object(Bucket=BUCKET, Key="w-fresh-other/x", Body=b"x")
    assert cli("pack", GOOD, f"s3://{BUCKET}/w-fresh", "-q").returncode == 0


def test_a_prefix_with_dot_components_is_refused(env, bucket, tmp_path):
    # Found by a stranger's test: s3://b/x/../victim was written into victim/ (the HTTP client
    # resolves dot segments) past the refusal of a prefix holding objects, which listed x/../.
    bucket.put_object(Bucket=BUCKET, Key="victim/shard-00000.mdb", Body=b"user data")
    for prefix in ("x/../victim", "./victim", "victim/."):
        out = cli("pack", GOOD, f"s3://{BUCKET}/{prefix}", "-q")
        assert out.returncode == 2 and "component in the prefix" in out.stderr, out.stderr
        out = cli("verify", f"s3://{BUCKET}/{prefix}")
        assert out.returncode == 2 and "component in the prefix" in out.stderr, out.stderr
    assert keys(bucket, "victim") == ["shard-00000.mdb"]
    body = bucket.get_object(Bucket=BUCKET, Key="victim/shard-00000.mdb")["Body"].read()
    assert body == b"user data"


def test_overwrite_replaces_only_an_archive_and_deletes_only_its_shards(env, bucket, tmp_path):
    # Found by a stranger's test: --overwrite deleted any object a manifest.json at the prefix
    # named (a foreign one, an edited one), e.g. the user's notes.txt.
    bucket.put_object(Bucket=BUCKET, Key="w-not/notes.txt", Body=b"notes")
    bucket.put_object(Bucket=BUCKET, Key="w-not/manifest.json",
                      Body=b'{"shards": [{"file": "notes.txt"}]}')
    out = cli("pack", GOOD, f"s3://{BUCKET}/w-not", "-q", "--overwrite")
    assert out.returncode == 2 and "not a shardfeed archive's manifest" in out.stderr, out.stderr
    assert keys(bucket, "w-not") == ["manifest.json", "notes.txt"]
    # A shardfeed manifest edited since (its checksum no longer matches) naming the user's file:
    # the pack replaces it, and deletes nothing it names.
    dest = f"s3://{BUCKET}/w-edited"
    assert cli("pack", GOOD, dest, "-q", "--shard-size", "30K").returncode == 0
    bucket.put_object(Bucket=BUCKET, Key="w-edited/notes.txt", Body=b"notes")
    m = json.loads(bucket.get_object(Bucket=BUCKET, Key="w-edited/manifest.json")["Body"].read())
    m["shards"][-1]["file"] = "notes.txt"
    bucket.put_object(Bucket=BUCKET, Key="w-edited/manifest.json", Body=json.dumps(m).encode())
    out = cli("pack", GOOD, dest, "-q", "--shard-size", "60K", "--overwrite")
    assert out.returncode == 0, out.stderr
    assert "cannot read the archive being replaced" in out.stderr
    assert "notes.txt" in keys(bucket, "w-edited")
    assert cli("verify", dest).returncode == 0


def test_ctrl_c_during_the_upload_aborts_it_and_leaves_no_manifest(bucket, upload_proxy,
                                                                   tmp_path):
    # Stalled in the middle of a multipart upload (its second part): Ctrl-C there once killed
    # the process with the upload's first part left on the store, an orphan nobody aborts.
    upload_proxy.stall = ["shard-00002.mdb?partNumber=2"]
    proc = subprocess.Popen([CLI, "pack", GOOD, f"s3://{BUCKET}/w-interrupted", "-q", *RAW],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp_path)))
    try:
        assert upload_proxy.stalled.wait(120), "the upload never reached shard-00002's part 2"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # the cancel ends the stalled request, no release
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        upload_proxy.release()
    assert proc.returncode == -signal.SIGINT, err  # ended by the signal, as a shell expects
    assert "interrupted (SIGINT) while uploading" in err
    assert f"s3://{BUCKET}/w-interrupted was not written (no manifest there)" in err
    assert "manifest.json" not in keys(bucket, "w-interrupted")
    assert not any("manifest.json" in p for m, p in upload_proxy.log if m == "PUT")
    uploads = bucket.list_multipart_uploads(Bucket=BUCKET, Prefix="w-interrupted/")
    assert not uploads.get("Uploads")  # every multipart upload begun was aborted
    staged = [d for d in os.listdir(tmp_path) if d.startswith("shardfeed-staging-")]
    assert len(staged) == 1  # the build is kept, and the message says where
    assert os.path.join(str(tmp_path), staged[0], "w-interrupted") in err


def test_a_pack_that_fails_before_building_leaves_no_staging_folder(env, bucket, tmp_path):
    # REGRESSION (review): StagedOut::Prepare makes a staging folder under $TMPDIR; CmdPack's
    # early returns after it (a source that cannot be read, --parts-dir without --part) never
    # call Finish, so the folder is left behind on every such failure.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env.setenv("TMPDIR", str(tmp))
    out = cli("pack", str(tmp_path / "no-such-folder"), f"s3://{BUCKET}/never", "-q")
    assert out.returncode != 0
    assert os.listdir(tmp) == []


def another_writer_meanwhile(upload_proxy, bucket, key):
    """A thread that, once the proxy holds a request, writes other bytes at `key` (a second job
    packing to the same prefix), then lets the held request go on. Call the result when the pack
    has ended (it ends the thread if nothing was held)."""
    done = threading.Event()

    def meanwhile():
        while not upload_proxy.stalled.wait(0.1):
            if done.is_set():
                return
        bucket.put_object(Bucket=BUCKET, Key=key, Body=b"another job's shard")
        upload_proxy.release()
    t = threading.Thread(target=meanwhile)
    t.start()

    def join():
        done.set()
        t.join()
    return join


def archive_to_replace(env, moto_url, upload_proxy, bucket, prefix):
    """An archive of several shards packed at `prefix` (straight to moto), then the proxy in
    front again: (its s3:// location, its shard keys)."""
    dest = f"s3://{BUCKET}/{prefix}"
    env.setenv("AWS_ENDPOINT_URL", moto_url)
    assert cli("pack", GOOD, dest, "-q", "--shard-size", "20K").returncode == 0
    env.setenv("AWS_ENDPOINT_URL", upload_proxy.url)
    return dest, [k for k in keys(bucket, prefix) if k.startswith("shard-")]


def pack_racing(upload_proxy, bucket, stall, key, *args):
    """`pack GOOD *args` through the proxy, holding the request `stall` (method, fragment) while
    another job writes `key` (another_writer_meanwhile); its CompletedProcess."""
    upload_proxy.stall = [stall]
    join = another_writer_meanwhile(upload_proxy, bucket, key)
    try:
        return cli("pack", GOOD, *args)
    finally:
        join()


def test_a_shard_another_writer_replaced_before_the_manifest_fails_the_pack(bucket, upload_proxy,
                                                                           tmp_path):
    # REGRESSION: two jobs packing to one prefix at once both exited 0, and the manifest that
    # landed last named shards the other had written. Each shard's ETag is now checked before
    # the manifest goes up: here another job replaced shard-00000 after ours was sent.
    staging = tmp_path / "staging"
    out = pack_racing(upload_proxy, bucket, ("HEAD", "w-race/shard-00000.mdb"),
                      "w-race/shard-00000.mdb", f"s3://{BUCKET}/w-race", "-q", "--staging",
                      str(staging), *RAW)
    assert out.returncode == 3, out.stderr
    assert f"s3://{BUCKET}/w-race/shard-00000.mdb: replaced" in out.stderr, out.stderr
    assert "another writer" in out.stderr and "its own prefix" in out.stderr
    assert f"s3://{BUCKET}/w-race: this command's manifest was not written" in out.stderr
    assert "manifest.json" not in keys(bucket, "w-race")
    assert os.path.exists(staging / "w-race" / "manifest.json")  # the build is kept


def test_a_shard_another_writer_replaced_as_the_manifest_went_up_fails_the_pack(bucket,
                                                                               upload_proxy,
                                                                               tmp_path, env,
                                                                               moto_url):
    # The same after the check: another job replaced shard-00001 while our manifest was on its
    # way. The check after the manifest finds it; the pack fails and says the archive there may
    # be a mix, and readers refuse it.
    staging = tmp_path / "staging"
    out = pack_racing(upload_proxy, bucket, ("PUT", "w-race2/manifest.json"),
                      "w-race2/shard-00001.mdb", f"s3://{BUCKET}/w-race2", "-q", "--staging",
                      str(staging), *RAW)
    assert out.returncode == 3, out.stderr
    assert f"s3://{BUCKET}/w-race2/shard-00001.mdb: replaced" in out.stderr, out.stderr
    assert "manifest went up, but the archive there may mix" in out.stderr
    assert "manifest.json" in keys(bucket, "w-race2")
    assert os.path.exists(staging / "w-race2" / "manifest.json")  # the build is kept
    env.setenv("AWS_ENDPOINT_URL", moto_url)
    bad = cli("verify", f"s3://{BUCKET}/w-race2", "-q")
    assert bad.returncode != 0 and "shard-00001.mdb" in bad.stdout + bad.stderr


def test_an_endless_error_reply_to_an_upload_is_not_read_to_its_end(bucket, upload_proxy, tmp_path):
    # REGRESSION: an upload's reply was kept to 1 MiB but the rest was still read: a store or
    # proxy answering a PUT with an endless 503 body held the pack (256 MiB a try here). The
    # transfer now ends after the first 1 MiB, and the 503 is retried and reported as such.
    upload_proxy.flood = [("PUT", "w-flood/shard-00000.mdb")]
    out = cli("pack", GOOD, f"s3://{BUCKET}/w-flood", "-q", "--staging", str(tmp_path / "s"))
    assert out.returncode == 3, out.stderr
    assert "HTTP 503" in out.stderr and "still failing after 2 attempts" in out.stderr, out.stderr
    assert upload_proxy.flood_sent < 2 * 8 << 20, upload_proxy.flood_sent  # 2 tries, 1 MiB each
    assert "manifest.json" not in keys(bucket, "w-flood")


def test_a_manifest_another_job_wrote_during_the_upload_is_not_replaced(bucket, upload_proxy,
                                                                        tmp_path):
    # (S3 stranger) "already exists" was checked before the upload only: a slow pack replaced
    # the archive a faster job finished meanwhile, and both exited 0. It is checked again right
    # before the manifest goes up.
    out = pack_racing(upload_proxy, bucket, ("HEAD", "w-appear/shard-00000.mdb"),
                      "w-appear/manifest.json", f"s3://{BUCKET}/w-appear", "-q", "--staging",
                      str(tmp_path / "s"))
    assert out.returncode == 3, out.stderr
    assert "manifest.json: appeared while this command uploaded" in out.stderr, out.stderr
    assert "this command's manifest was not written" in out.stderr
    body = bucket.get_object(Bucket=BUCKET, Key="w-appear/manifest.json")["Body"].read()
    assert body == b"another job's shard"  # the other job's object, kept


def test_overwrite_removes_only_the_replaced_archives_shards_still_unchanged(bucket, upload_proxy,
                                                                            tmp_path, env,
                                                                            moto_url):
    # (S3 stranger, HIGH) After its manifest, --overwrite deleted every old shard name the new
    # archive did not use, without looking: another job writing those names at the same time
    # lost them, and both exited 0 over a broken archive. A name is now deleted only while its
    # object is the one the old manifest's archive had before the upload.
    dest, old = archive_to_replace(env, moto_url, upload_proxy, bucket, "w-old")
    assert len(old) >= 4
    out = pack_racing(upload_proxy, bucket, ("PUT", "w-old/manifest.json"), "w-old/" + old[-1],
                      dest, "-q", "--overwrite", "--encoding", "raw", "--size", "16", "--crop",
                      "center")  # one small shard: every other old name is to be removed
    assert out.returncode == 0, out.stderr
    assert "1 name(s) of the replaced archive not removed" in out.stderr, out.stderr
    left = keys(bucket, "w-old")
    assert old[-1] in left and not set(old[1:-1]) & set(left), left
    body = bucket.get_object(Bucket=BUCKET, Key="w-old/" + old[-1])["Body"].read()
    assert body == b"another job's shard"
    env.setenv("AWS_ENDPOINT_URL", moto_url)
    assert cli("verify", dest).returncode == 0


def test_ctrl_c_while_the_manifest_is_on_its_way_says_it_may_have_landed(bucket, upload_proxy,
                                                                        tmp_path):
    # (S3 stranger) Interrupted while the manifest's PUT waited for the store's answer, the
    # command said "was not written (no manifest there)"; the store then wrote it, and the
    # archive was there. The message now says it may have landed.
    upload_proxy.stall = [("PUT", "w-late/manifest.json")]
    proc = subprocess.Popen([CLI, "pack", GOOD, f"s3://{BUCKET}/w-late", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp_path)))
    try:
        assert upload_proxy.stalled.wait(120), "the upload never reached the manifest"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        upload_proxy.release()
    assert proc.returncode == -signal.SIGINT, err
    assert "interrupted while its manifest was on its way: the store may have written it" in err
    assert "was not written (no manifest there)" not in err, err


def test_a_refused_manifest_put_does_not_say_it_went_up(bucket, upload_proxy, tmp_path):
    # (review) The manifest's PUT answered 403 was reported as "this command's manifest went up,
    # but the archive there may mix...": nothing went up. It now says the PUT failed on its way.
    upload_proxy.deny = [("PUT", "w-deny/manifest.json", "AccessDenied")]
    out = cli("pack", GOOD, f"s3://{BUCKET}/w-deny", "-q", "--staging", str(tmp_path / "s"))
    assert out.returncode == 3, out.stderr
    assert "failed while its manifest was on its way" in out.stderr, out.stderr
    assert "manifest went up" not in out.stderr
    assert "manifest.json" not in keys(bucket, "w-deny")


def test_overwrite_removes_nothing_when_the_old_manifest_changed_while_read(bucket, upload_proxy,
                                                                           tmp_path, env,
                                                                           moto_url):
    # (review) The old manifest is read, then its shards' ETags: another job writing the prefix
    # in between may write under a listed name, and its object would be taken for the old
    # archive's. The manifest's ETag is read before and after; changed, nothing is removed.
    dest, old = archive_to_replace(env, moto_url, upload_proxy, bucket, "w-moved")
    out = pack_racing(upload_proxy, bucket, ("HEAD", "w-moved/" + old[-1]),  # old ETags read
                      "w-moved/manifest.json", dest, "-q", "--overwrite", "--encoding", "raw",
                      "--size", "16", "--crop", "center")
    assert out.returncode == 0, out.stderr
    assert "manifest.json changed while its shards were read" in out.stderr, out.stderr
    assert set(old) <= set(keys(bucket, "w-moved"))  # nothing of the old names removed
