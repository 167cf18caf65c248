"""What a json field costs the loader's workers (docs/BENCHMARKS.md, "Typed fields in batches"):
a raw 16x16 archive of 20,000 samples whose json field holds a COCO-like annotation list of
1,531 bytes, read by `shardfeed bench` (1 worker, no crop, 3 epochs) with --fields "" and
--fields meta, twice in turn. The consumer's gather of 1.5 KB is a memcpy; the rest of the
difference is the workers' check of each value (format::CheckStoredValue: UTF-8 and depth).

    SHARDFEED_CLI=build/shardfeed PYTHONPATH=build/python /usr/bin/python3 \
        bench/json_field_bench.py WORKDIR"""
import json, os, subprocess, sys, tempfile
import numpy as np
import shardfeed
BIN = os.environ.get("SHARDFEED_CLI", "build/shardfeed")
d = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
path = os.path.join(d, "j.sf")
if not os.path.exists(path):
    ann = [{"id": 123456 + k, "category_id": 17, "area": 1234.5678, "bbox": [12.5, 33.25, 100.0, 80.75],
            "iscrowd": 0, "segmentation": [[1.0, 2.0, 3.5, 4.5, 5.0, 6.0, 7.25, 8.0, 9.0, 10.0]]}
           for k in range(10)]
    print("json bytes:", len(json.dumps(ann, separators=(",", ":"))))
    with shardfeed.Writer(path, schema={"image": "image", "label": "int64", "meta": "json"},
                          encoding="raw", workers=2) as w:
        for i in range(20000):
            w.write({"image": np.full((16, 16, 3), i % 250, np.uint8), "label": 0, "meta": ann})
for fields in ("", "meta", "", "meta"):
    r = subprocess.run([BIN, "bench", path, "--json", "--workers", "1", "--crop", "none",
                        "--epochs", "3", "--fields", fields], capture_output=True, text=True)
    out = json.loads(r.stdout) if r.returncode == 0 else r.stderr
    keys = {k: v for k, v in out.items() if isinstance(v, (int, float)) and ("img" in k or "cpu" in k or "per" in k)} if isinstance(out, dict) else out
    print(repr(fields), keys)
