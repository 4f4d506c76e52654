"""Write the batch job's input: the digits test split as a parquet file (``id``, ``label``, ``pixels``).

``pixels`` is the 8x8 image as 64 floats in [0, 1] (scikit-learn's 0..16 divided by 16); ``label`` is the true digit,
kept so the predictions can be checked. The split is digits-cnn's (``test_size=0.2, random_state=0, stratify``), so
a digits-cnn checkpoint never saw these images.

    python make_input.py [PATH]        # default: digits.parquet next to this file
"""
from __future__ import annotations

import os
import sys

SPLIT = {"test_size": 0.2, "random_state": 0, "stratify": True}


def write_input(path: str) -> int:
    """Write the test split to ``path``; returns the number of rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    ids = np.arange(len(d.target), dtype=np.int64)
    pixels = (d.images / 16.0).astype(np.float32).reshape(len(d.target), 64)
    _, ids_te = train_test_split(ids, test_size=SPLIT["test_size"], random_state=SPLIT["random_state"],
                                 stratify=d.target if SPLIT["stratify"] else None)
    table = pa.table({
        "id": pa.array(ids_te),
        "label": pa.array(d.target[ids_te].astype(np.int64)),
        "pixels": pa.array(list(pixels[ids_te]), type=pa.list_(pa.float32())),
    })
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(table, path, row_group_size=64)  # a few row groups, so Ray Data has blocks to spread
    return table.num_rows


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                             "digits.parquet")
    print(f"wrote {write_input(out)} images to {out}")
