"""Editing spec and policy documents in tests: a parsed YAML file, and copies with one field changed or removed."""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

DELETE = object()


def raw(path: Path) -> dict:
    return yaml.safe_load(Path(path).read_text())


def with_field(doc: dict, dotted: str, value, sep: str = ".") -> dict:
    """A deep copy of ``doc`` with ``dotted`` (keys split on ``sep``) set to ``value`` (or removed, for DELETE)."""
    doc = copy.deepcopy(doc)
    *parents, last = dotted.split(sep)
    node = doc
    for key in parents:
        node = node.setdefault(key, {})
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return doc
