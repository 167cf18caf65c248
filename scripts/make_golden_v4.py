#!/usr/bin/env python3
"""Writes the version-4 golden archives (typed fields) under tests/format/golden/v4/: the hidden
C++ test "[.make_golden_v4]" (tests/format/fields_golden_test.cpp) writes them with every field
kind and records each field's stored value; this script adds what the Python reader must see
(labels, shapes, record and pixel SHA-256, as scripts/make_golden.py does for versions 1-3) and
writes expected.json. Run once, by the build that introduced version 4; never regenerate.

    make_golden_v4.py SHARDFEED_TESTS OUT_DIR   (PYTHONPATH must reach that build's module)
"""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np


def main():
    tests, out = sys.argv[1], sys.argv[2]
    os.makedirs(out)
    subprocess.run([tests, "[.make_golden_v4]"], check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, SHARDFEED_GOLDEN_V4_OUT=out))
    import shardfeed
    fields_file = os.path.join(out, "fields.json")
    with open(fields_file) as f:
        fields = json.load(f)
    os.remove(fields_file)
    expected = {}
    for name, stored in sorted(fields.items()):
        a = shardfeed.Archive(os.path.join(out, name))
        samples = []
        for i in range(len(a)):
            image, label = a[i]
            samples.append({
                "label": int(label),
                "shape": list(image.shape),
                "record_sha256": hashlib.sha256(bytes(a.record(i))).hexdigest(),
                "pixels_sha256": hashlib.sha256(np.ascontiguousarray(image).tobytes())
                .hexdigest(),
            })
        expected[name] = {"class_names": a.class_names, "encoding": a.encoding,
                          "samples": samples, "fields": stored["fields"],
                          "values": stored["values"]}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
