#!/usr/bin/env python
"""The broker's check of a 4 MiB encoded batch (``parse_encoded``), per body size.

Each UNIQ_KEY's end is found either by one scan of the whole buffer for 0x02 or
by a window of ``MAX_UNIQ_KEY`` + 1 bytes per record; ``SCAN_BELOW_RECORD_BYTES``
picks between them. This prints both, and what the rule picks, best of
``--repeats`` in-process parses, for text bodies and for binary ones (bytes 0..7,
one in eight a 0x02, as protobuf or Avro payloads are rich in small bytes).

Usage::

    python benchmarks/bench_parse.py
    python benchmarks/bench_parse.py --bodies 200,400,65536 --repeats 30
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / d) for d in ("connector", "broker_stub", "proto")]

import numpy as np  # noqa: E402
from pymq_broker.store import encoded_batch  # noqa: E402
from pyspark_pymq.client.codec import encode_records  # noqa: E402

BATCH_BYTES = 4 << 20


def best_ms(records: bytes, sizes: bytes, scan_below: int, repeats: int) -> float:
    encoded_batch.SCAN_BELOW_RECORD_BYTES = scan_below
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        encoded_batch.parse_encoded(records, sizes, "t", scalar=False)
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bodies", default="100,200,400,800,4096,65536", help="body sizes in bytes")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    rule = encoded_batch.SCAN_BELOW_RECORD_BYTES
    rng = np.random.default_rng(1)
    print(f"parse_encoded of a {BATCH_BYTES >> 20} MiB batch, best of {args.repeats}, ms "
          f"(scan below {rule} bytes per record)\n")
    print("| body | kind | records | scan | windows | the rule picks |")
    print("|---|---|---|---|---|---|")
    for size in (int(b) for b in args.bodies.split(",")):
        n = BATCH_BYTES // (size + 100)
        props = [b"UNIQ_KEY\x01" + f"{i:032X}".encode() + b"\x02" for i in range(n)]
        for kind in ("text", "binary"):
            body = b"x" * size if kind == "text" else rng.integers(0, 8, size, dtype=np.uint8).tobytes()
            raw, sizes = encode_records("t", [body] * n, props)
            packed = np.asarray(sizes, dtype="<i4").tobytes()
            scan = best_ms(raw, packed, 1 << 62, args.repeats)
            windows = best_ms(raw, packed, 0, args.repeats)
            picked = "scan" if len(raw) < n * rule else "windows"
            print(f"| {size} B | {kind} | {n} | {scan:.2f} | {windows:.2f} | {picked} |")
    encoded_batch.SCAN_BELOW_RECORD_BYTES = rule


if __name__ == "__main__":
    main()
