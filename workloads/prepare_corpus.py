"""Data preparation for the reference language model: a pipeline's first stage (examples/pipelines/lm-lifecycle.yaml).

Reads Python sources of the named standard-library packages, normalises them (tabs to four spaces, trailing
whitespace removed, runs of blank lines folded to one, files whose normalised text was seen before dropped), and
writes them as text shards of at most ``shard_bytes`` to the output directory, with ``_manifest.json`` (files,
bytes, duplicates dropped, the sha256 of every shard). ``workloads.data.CorpusConfig(path=...)`` trains on the
result.

Run as a ``command`` of kind batch: the platform gives the config in ``RAYLANE_CONFIG`` and the output directory in
``RAYLANE_OUTPUT``, and records what it writes in ``RAYLANE_METRICS_FILE``.

    python -m workloads.prepare_corpus            # inside a stage
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Annotated, List

from pydantic import BaseModel, ConfigDict, Field, field_validator

from workloads.data import _source_files, stdlib_root


class PrepareConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    packages: Annotated[List[str], Field(min_length=1)] = ["json", "email", "http"]
    max_bytes: Annotated[int, Field(ge=4096, le=1_000_000_000)] = 400_000
    shard_bytes: Annotated[int, Field(ge=1024)] = 64_000

    @field_validator("packages")
    @classmethod
    def _known(cls, v: List[str]) -> List[str]:
        root = stdlib_root()
        bad = [p for p in v if Path(p).is_absolute() or ".." in Path(p).parts or not (root / p).is_dir()]
        if bad:
            raise ValueError(f"{bad}: each must name a package directory under the stdlib {root}")
        return v


def normalise(text: str) -> str:
    lines = [line.replace("\t", "    ").rstrip() for line in text.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def prepare(cfg: PrepareConfig, out: Path) -> dict:
    """Write the shards and the manifest to ``out`` (created); returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    root = stdlib_root()
    seen, files, dropped, total = set(), [], 0, 0
    shards: List[bytes] = [b""]
    for pkg in cfg.packages:
        for path in _source_files(root / pkg):
            if total >= cfg.max_bytes:
                break
            text = normalise(path.read_text(encoding="utf-8", errors="replace")).encode()
            digest = hashlib.sha256(text).hexdigest()
            if digest in seen or len(text) < 2:
                dropped += 1
                continue
            seen.add(digest)
            text = text[: cfg.max_bytes - total]
            total += len(text)
            files.append(path.relative_to(root).as_posix())
            if len(shards[-1]) + len(text) > cfg.shard_bytes and shards[-1]:
                shards.append(b"")
            shards[-1] += text + b"\n"
    names = []
    for i, data in enumerate(shards):
        name = f"shard-{i:05d}.txt"
        (out / name).write_bytes(data)
        names.append({"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"packages": cfg.packages, "files": len(files), "duplicates_dropped": dropped, "bytes": total,
                "shards": names}
    (out / "_manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main() -> int:
    out = os.environ.get("RAYLANE_OUTPUT")
    if not out:
        print("RAYLANE_OUTPUT is not set: run me as a stage (kind batch, command) or set it", file=sys.stderr)
        return 2
    cfg = PrepareConfig.model_validate(json.loads(os.environ.get("RAYLANE_CONFIG") or "{}"))
    manifest = prepare(cfg, Path(out))
    print(f"prepared {manifest['files']} files, {manifest['bytes']} bytes in {len(manifest['shards'])} shards "
          f"({manifest['duplicates_dropped']} dropped) -> {out}", flush=True)
    metrics = os.environ.get("RAYLANE_METRICS_FILE")
    if metrics:
        Path(metrics).write_text(json.dumps({"files": manifest["files"], "bytes": manifest["bytes"],
                                             "shards": len(manifest["shards"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
