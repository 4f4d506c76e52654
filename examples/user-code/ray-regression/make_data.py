"""Write the regression data Ray's own example reads (``ray.train.examples.pytorch.torch_regression_example``), small
enough to ship: ``train.parquet`` (256 rows) and ``validation.parquet`` (64 rows) next to this file.

Ray's example reads ``s3://anonymous@air-example-data/regression.csv`` (columns ``x000``..``x099`` and ``y``) and
joins the 100 features into one column before training; these files hold the joined form its ``train_func`` reads
from ``ray.train.get_dataset_shard``: ``x``, a list of 100 float32 features in [-1, 1] (two decimals, so the files
compress), and ``y = x . w + 0.5 + noise`` as float32, with ``w`` and the noise drawn from a fixed seed.

    python make_data.py [FOLDER]        # default: this file's folder
"""
from __future__ import annotations

import os
import sys

FEATURES = 100
ROWS = {"train": 256, "validation": 64}
SEED = 0


def write_data(folder: str) -> dict:
    """Write ``<name>.parquet`` for each of ``ROWS`` into ``folder``; returns name -> path."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(SEED)
    w = rng.normal(0.0, 1.0 / np.sqrt(FEATURES), FEATURES)
    out = {}
    for name, rows in ROWS.items():
        x = np.round(rng.uniform(-1.0, 1.0, (rows, FEATURES)), 2).astype(np.float32)
        y = (x @ w + 0.5 + rng.normal(0.0, 0.05, rows)).astype(np.float32)
        table = pa.table({"x": pa.array(list(x), type=pa.list_(pa.float32())), "y": pa.array(y)})
        out[name] = os.path.join(folder, f"{name}.parquet")
        pq.write_table(table, out[name])
    return out


if __name__ == "__main__":
    folder = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for name, path in write_data(folder).items():
        print(f"{name}: {path}")
