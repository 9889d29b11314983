"""Feeds partitions to a training node as Spark's feeding tasks do (sparkgrad.cluster.feed.FeedTarget, one
connection per partition), from a plain process: feeder.py <host> <port> <first> <stop> <step> <rows each>;
SG_SECRET (hex) in the environment. Partition p holds the integers [p*rows, (p+1)*rows). Prints the rows sent."""

from __future__ import annotations

import os
import sys

import numpy as np
from sparkgrad.cluster.feed import FeedTarget


def main(host: str, port: int, first: int, stop: int, step: int, rows: int) -> None:
    target = FeedTarget(((host, port),), bytes.fromhex(os.environ["SG_SECRET"]), timeout=60.0)
    sent = 0
    for p in range(first, stop, step):
        batch = {"0": np.arange(p * rows, (p + 1) * rows, dtype=np.int64)}
        sent += sum(target.feed(0, [batch]))
    print(sent, flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), int(a[5]))
