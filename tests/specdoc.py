"""Editing spec and policy documents in tests: a parsed YAML file, and copies with one field changed or removed;
and reading the errors a document is refused with."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from raylane.errors import ValidationError

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


def errors_of(fn, *args, **kwargs) -> list:
    with pytest.raises(ValidationError) as info:
        fn(*args, **kwargs)
    return info.value.errors


def assert_has_error(errors, path, value, allowed_part):
    matches = [e for e in errors if e[0] == path]
    assert matches, f"no error at {path!r}; got {errors}"
    got_path, got_value, got_allowed = matches[0]
    if value is not None:
        assert got_value == value or (got_value is value), (got_value, value)
    assert allowed_part in got_allowed, f"{allowed_part!r} not in {got_allowed!r}"
