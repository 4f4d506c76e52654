"""Runs every benchmark of this package (each ``bench_*`` module's ``main``), one after the other, with defaults:
``python -m tests.bench.run_all`` (``make bench``). A benchmark that fails is reported and the others still run;
the exit status says whether any failed. Benchmarks print figures; they assert no timings."""
from __future__ import annotations

import importlib
import pkgutil
import sys
import time
import traceback

import tests.bench as package


def main() -> int:
    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name.startswith("bench_"))
    failed = []
    for name in names:
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            importlib.import_module(f"{package.__name__}.{name}").main([])
        except Exception:  # one benchmark's failure must not hide the others' figures
            traceback.print_exc()
            failed.append(name)
        print(f"== {name}: {time.perf_counter() - t0:.1f} s{' (FAILED)' if name in failed else ''}\n", flush=True)
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
