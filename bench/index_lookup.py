"""The key index's own share of a batch at N keys, without Spark: a bucketed generation of N integer keys
written to a temporary store, then batches of 5,000 random keys looked up, moved and made durable (a delta).

    .venv/bin/python bench/index_lookup.py [--keys 100000000] [--batches 20]

Prints the median lookup, update and delta-write times and the process's peak RSS; the LAST line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from lakestream.sink.index.disk import DiskKeyIndex, bucket_bits, bucket_of, write_npy
from lakestream.sink.index.keys import pack
from lakestream.sink.index.store import IndexStore


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=100_000_000)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--changes", type=int, default=5000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lakestream-index-bench-"))
    store = IndexStore(str(root))
    index = DiskKeyIndex(False, ["id"], "bench")
    bits = bucket_bits(args.keys)
    gen = root / "build-bench"
    gen.mkdir(parents=True)
    started = time.perf_counter()
    import pyarrow.fs as pafs

    fs = pafs.LocalFileSystem()
    # Keys 0..N-1 in 10,000-row files; written bucket by bucket (one pass per bucket range of keys).
    keys = np.arange(args.keys, dtype=np.int64)
    buckets = bucket_of(keys, bits)
    order = np.argsort(buckets, kind="stable")
    del keys
    sorted_buckets = buckets[order]
    del buckets
    bounds = np.searchsorted(sorted_buckets, np.arange((1 << bits) + 1))
    del sorted_buckets
    for b in range(1 << bits):
        k = order[bounds[b] : bounds[b + 1]].astype(np.int64)
        k.sort()
        write_npy(fs, f"{gen}/bucket-{b:05d}.keys.npy", k)
        write_npy(fs, f"{gen}/bucket-{b:05d}.locs.npy", pack(k // 10_000, k % 10_000))
    del order
    for f in range(args.keys // 10_000 + 1):
        index.file_id(f"file-{f}")
    index.open_base(
        str(gen), {"bits": bits, "rows": args.keys, "buckets": list(range(1 << bits)), "paths": list(index.paths)}
    )
    index.generation, index.snapshot_id, index.valid = "build-bench", 1, True
    store.write_base(index)
    build_s = time.perf_counter() - started
    rng = np.random.default_rng(1)
    lookups, updates, deltas = [], [], []
    for b in range(args.batches):
        probe = np.unique(rng.integers(0, args.keys, args.changes))
        t0 = time.perf_counter()
        found = index.lookup(probe)
        t1 = time.perf_counter()
        assert (found >= 0).all()
        fid = index.file_id(f"new-{b}")
        index.update(probe, pack(np.full(len(probe), fid), np.arange(len(probe))))
        index.snapshot_id = b + 2
        t2 = time.perf_counter()
        store.persist(index)
        t3 = time.perf_counter()
        lookups.append(t1 - t0)
        updates.append(t2 - t1)
        deltas.append(t3 - t2)
    peak = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) // 1024
    out = {
        "bench": "index_lookup",
        "keys": args.keys,
        "buckets": 1 << bits,
        "setup_s": round(build_s, 1),
        "lookup_ms_median": round(statistics.median(lookups) * 1000, 2),
        "update_ms_median": round(statistics.median(updates) * 1000, 2),
        "delta_write_ms_median": round(statistics.median(deltas) * 1000, 2),
        "peak_rss_mb_including_setup": peak,
        "index_bytes_on_disk": store.footprint(),
        "load": os.getloadavg(),
    }
    print(
        f"{args.keys:,} keys in {1 << bits} buckets: lookup {out['lookup_ms_median']} ms, update "
        f"{out['update_ms_median']} ms, delta {out['delta_write_ms_median']} ms per batch of {args.changes:,}"
    )
    print(json.dumps(out), flush=True)
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
