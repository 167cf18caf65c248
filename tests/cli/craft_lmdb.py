"""Crafting damage that gets past every hash, for tests: a one-shard LMDB archive's var blobs
rewritten in place, with each blob's checksum, the record checksums, the index and fields
checksums, the shard's content hash and the manifest's hash recomputed as docs/FORMAT.md says.

Only what the tests need: a single-chunk shard whose chunk is one LMDB overflow value (give a
sample a large bytes field to make room), read by walking the B-tree of the newest meta page.
The XXH3 is the system's libxxhash (the library shardfeed links)."""
import ctypes
import json
import os
import struct

_xxh = ctypes.CDLL("libxxhash.so.0")
_xxh.XXH3_64bits.restype = ctypes.c_uint64
_xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
PAGE = 4096
HEADER = "<8sIIQQQQQQ"  # magic, version, shard, first, count, chunks, index, content, fields
ENTRY = "<QIIIiHHBBBB"  # IndexEntry: checksum, chunk, offset, size, label, h, w, c, enc, o, flags
VAR_ENTRY = "<QIIII"  # VarEntry: checksum, chunk, offset, size, reserved


def xxh3(data):
    data = bytes(data)
    return _xxh.XXH3_64bits(data, len(data))


class Lmdb:
    """The key/value nodes of an LMDB file's main database, editable in place."""

    def __init__(self, path):
        self.path = path
        self.buf = bytearray(open(path, "rb").read())
        metas = []
        for page in (0, 1):
            at = page * PAGE + 16
            root, = struct.unpack_from("<Q", self.buf, at + 72 + 40)
            txn, = struct.unpack_from("<Q", self.buf, at + 128)
            metas.append((txn, root))
        self.nodes = {}
        self._walk(max(metas)[1])

    def _walk(self, page):
        at = page * PAGE
        flags, lower = struct.unpack_from("<HH", self.buf, at + 10)
        for k in range((lower - 16) // 2):
            ptr, = struct.unpack_from("<H", self.buf, at + 16 + 2 * k)
            node = at + ptr
            lo, hi, fl, key_size = struct.unpack_from("<HHHH", self.buf, node)
            key = bytes(self.buf[node + 8:node + 8 + key_size])
            if flags & 1:  # a branch page
                self._walk(lo | hi << 16 | fl << 32)
                continue
            big = bool(fl & 1)
            if big:
                overflow, = struct.unpack_from("<Q", self.buf, node + 8 + key_size)
                data = overflow * PAGE + 16
            else:
                data = node + 8 + key_size
            self.nodes[key] = {"node": node, "data": data, "size": lo | hi << 16, "big": big}

    def get(self, key):
        n = self.nodes[key]
        return bytes(self.buf[n["data"]:n["data"] + n["size"]])

    def room(self, key):
        n = self.nodes[key]
        if not n["big"]:
            return n["size"]
        pages, = struct.unpack_from("<I", self.buf, n["data"] - 16 + 12)
        return pages * PAGE - 16

    def put(self, key, data):
        n = self.nodes[key]
        assert len(data) <= self.room(key), (key, len(data), self.room(key))
        self.buf[n["data"]:n["data"] + len(data)] = data
        struct.pack_into("<HH", self.buf, n["node"], len(data) & 0xFFFF, len(data) >> 16)
        n["size"] = len(data)

    def save(self):
        with open(self.path, "wb") as f:
            f.write(self.buf)


def _blob(values):
    """A var blob: one (offset, size) slot per value, each value 8-byte aligned after them."""
    body = bytearray(8 * len(values))
    slots = []
    for v in values:
        body += bytes(-len(body) % 8)
        slots.append((len(body), len(v)))
        body += v
    for k, (offset, size) in enumerate(slots):
        struct.pack_into("<II", body, 8 * k, offset, size)
    return bytes(body)


def dims(*d):
    """A value's stored dims (uint32 each, padded to 8 bytes), as arrays, boxes and masks have."""
    out = b"".join(struct.pack("<I", x) for x in d)
    return out + bytes(-len(out) % 8)


def zstd_rle(total, byte=0, claims=None):
    """A zstd frame of `total` copies of `byte` in RLE blocks (a few bytes per 128 KiB), whose
    header claims `claims` bytes (default: `total`)."""
    claims = total if claims is None else claims
    out = bytearray(struct.pack("<I", 0xFD2FB528)) + bytes([0xE0]) + struct.pack("<Q", claims)
    left = total
    while True:
        n = min(128 << 10, left)
        left -= n
        out += struct.pack("<I", (left == 0) | 1 << 1 | n << 3)[:3] + bytes([byte])
        if left == 0:
            return bytes(out)


def rewrite_values(archive, var_fields, var_column, edit, edit_entry=None):
    """Calls edit(sample, values) with each sample's var values (a list of bytes, one per var
    field in schema order; the caller changes it in place) and edit_entry(sample, entry) with
    its index entry (a list in ENTRY's order), then lays out shard 0's only chunk again and
    recomputes every hash. `var_column`: the byte offset of the VarEntry column in the fields
    table (0 when every field is variable)."""
    path = os.path.join(archive, "shard-00000.mdb")
    db = Lmdb(path)
    head = list(struct.unpack(HEADER, db.get(b"header")))
    count = head[4]
    index = [list(struct.unpack_from(ENTRY, db.get(b"index"), 32 * i)) for i in range(count)]
    table = bytearray(db.get(b"fields"))
    chunk_key = b"c\x00\x00\x00\x00"
    chunk = db.get(chunk_key)
    records, blobs = [], []
    for i in range(count):
        offset, size = index[i][2], index[i][3]
        records.append(chunk[offset:offset + size])
        var = list(struct.unpack_from(VAR_ENTRY, table, var_column + 24 * i))
        blob = chunk[var[2]:var[2] + var[3]]
        values = [blob[o:o + s] for o, s in
                  (struct.unpack_from("<II", blob, 8 * k) for k in range(var_fields))]
        edit(i, values)
        if edit_entry:
            edit_entry(i, index[i])
        blobs.append(_blob(values))
    out = bytearray()
    for i, (record, blob) in enumerate(zip(records, blobs)):
        index[i][0], index[i][2], index[i][3] = xxh3(record), len(out), len(record)
        out += record
        out += bytes(-len(out) % 8)
        struct.pack_into(VAR_ENTRY, table, var_column + 24 * i, xxh3(blob), 0, len(out),
                         len(blob), 0)
        out += blob
    db.put(chunk_key, bytes(out))
    index_bytes = b"".join(struct.pack(ENTRY, *e) for e in index)
    db.put(b"index", index_bytes)
    db.put(b"fields", bytes(table))
    head[6], head[8] = xxh3(index_bytes), xxh3(table)
    head[7] = xxh3(bytes(out) + index_bytes + bytes(table))
    db.put(b"header", struct.pack(HEADER, *head))
    db.save()
    manifest_path = os.path.join(archive, "manifest.json")
    m = json.load(open(manifest_path))
    m["shards"][0]["xxh3"] = "%016x" % head[7]
    m["shards"][0]["payload_bytes"] = sum(map(len, records)) + sum(map(len, blobs))
    if "manifest_xxh3" in m:
        del m["manifest_xxh3"]
        text = json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        m["manifest_xxh3"] = "%016x" % xxh3(text.encode())
    with open(manifest_path, "w") as f:
        json.dump(m, f)
