"""Runs every benchmark in this package, one after the other: ``python -m tests.bench.run_all`` (``make bench``)."""
from __future__ import annotations

import time


def main() -> None:
    from tests.bench import bench_core

    for name, fn in [("bench_core", bench_core.main)]:
        t0 = time.perf_counter()
        fn([])
        print(f"[{name}: {time.perf_counter() - t0:.1f} s]\n")


if __name__ == "__main__":
    main()
