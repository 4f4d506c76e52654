"""Checks KubeRay manifests against KubeRay's own CRD schemas the way the Kubernetes API server would, for
tests/deploy/test_kuberay_manifests.py. Test tooling, not product code: no Ray, no cluster, no network.

The schemas are the `openAPIV3Schema` of API version v1 of KubeRay's CRDs, copied into deploy/kuberay/crds/ (its
README says from where and how to refresh them). They are *structural* schemas, and the API server applies them in
two steps that this module reproduces:

- **pruning**: a field the schema does not specify is silently dropped when the object is stored, so a misspelled
  key (`workerGroupSpec` for `workerGroupSpecs`) is applied as if it were not there. Here it is an error.
- **validation**: types, `required`, `enum`, formats, lengths, patterns, minimums, unique keys of map-lists.

Words:
- *schema node*: the part of the schema that describes one value (a dict with `type`, `properties`, ...).
- *unknown field*: a key of an object whose node has it neither in `properties` nor allows it through
  `additionalProperties` (a bool or a node for every other key) or `x-kubernetes-preserve-unknown-fields: true`.
  A node with `type: object` and none of the three specifies no field at all: every key below it is pruned.
  Under `x-kubernetes-preserve-unknown-fields`, an unknown key's value is kept whole and not looked at; the
  `properties` the node does name are still checked against their own nodes.
- *null*: kept only where the node is `nullable`; elsewhere the server drops it, so it is an error here.

Not done: CEL rules (`x-kubernetes-validations`, which the v1.7.0 schemas use only for `managedBy`, immutability
and RayJob's `deletionStrategy`), and defaulting. A schema keyword this module does not know raises
:class:`UnsupportedSchema` rather than being skipped, so a refreshed schema cannot make a check pass by being
misread.

Every :class:`Problem` names the path (`spec.workerGroupSpecs[0].minReplicas`, `metadata.labels["ray.io/x"]`), the
value and what is allowed; :func:`validate` reports all problems of a document at once.
"""
from __future__ import annotations

import datetime
import difflib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Mapping

import yaml

CRDS = Path(__file__).resolve().parents[1] / "deploy" / "kuberay" / "crds"
GROUP = "ray.io"
VERSION = "v1"
# Kind -> its schema file in CRDS. A manifest of a kind not here is a problem: copy its schema (CRDS/README.md).
SCHEMA_FILES: Dict[str, str] = {"RayCluster": "raycluster.json", "RayJob": "rayjob.json"}

# The root `metadata` of a custom resource is the API server's ObjectMeta whatever the CRD says (the CRDs say only
# `type: object`): its unknown fields are dropped too. These are the fields a manifest sets; the ones the server
# writes are accepted as they come.
_SERVER_SET = {"x-kubernetes-preserve-unknown-fields": True}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
OBJECT_META: Dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 253},
        "generateName": {"type": "string"},
        "namespace": {"type": "string", "maxLength": 63},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": _SERVER_SET},
        **{k: _SERVER_SET for k in ("uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
                                    "deletionGracePeriodSeconds", "managedFields", "selfLink")},
    },
}

# Keywords this module applies, and those it knowingly leaves alone (docs, merge strategy, defaulting, CEL).
_APPLIED = {"type", "format", "properties", "required", "additionalProperties", "items", "enum", "nullable", "anyOf",
            "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
            "minItems", "maxItems", "minProperties", "maxProperties", "x-kubernetes-preserve-unknown-fields",
            "x-kubernetes-int-or-string", "x-kubernetes-list-type", "x-kubernetes-list-map-keys"}
_IGNORED = {"description", "title", "default", "example", "x-kubernetes-map-type", "x-kubernetes-validations"}

_INT_RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


class UnsupportedSchema(Exception):
    """The schema uses a keyword or a value of one that this module does not implement."""


@dataclass(frozen=True)
class Problem:
    """One way a document breaks its schema: where, and what is wrong with what is allowed."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path or '<document>'}: {self.message}"


# ------------------------------------------------------------------------------------------------- entry points


def load_documents(path: Path) -> List[Any]:
    """The YAML documents of a file, empty ones (a trailing `---`, comments only) left out."""
    return [d for d in yaml.safe_load_all(Path(path).read_text()) if d is not None]


@lru_cache(maxsize=None)
def _schema_text(kind: str) -> str:
    return (CRDS / SCHEMA_FILES[kind]).read_text()


def schema_for(kind: str) -> Dict[str, Any]:
    """The v1 openAPIV3Schema of a KubeRay kind, a fresh copy the caller may change."""
    return json.loads(_schema_text(kind))


def check_resource(doc: Any) -> List[Problem]:
    """All problems of one KubeRay manifest document: its apiVersion and kind, then its body against the schema of
    that kind, with the root `metadata` checked as ObjectMeta."""
    if not isinstance(doc, dict):
        return [Problem("", f"{_show(doc)} is {_kind_of(doc)}; allowed: a Kubernetes object (a mapping)")]
    api, kind = doc.get("apiVersion"), doc.get("kind")
    if api != f"{GROUP}/{VERSION}":
        return [Problem("apiVersion", f"{_show(api)} has no schema copy; allowed: {GROUP}/{VERSION} "
                                      f"(deploy/kuberay/crds/ holds version {VERSION} only)")]
    if kind not in SCHEMA_FILES:
        return [Problem("kind", f"{_show(kind)} has no schema copy in deploy/kuberay/crds/; allowed: "
                                f"{', '.join(sorted(SCHEMA_FILES))} (copy the CRD's schema as its README says)")]
    schema = schema_for(kind)
    schema["properties"]["metadata"] = OBJECT_META
    return validate(doc, schema)


def validate(value: Any, schema: Mapping[str, Any], path: str = "") -> List[Problem]:
    """All problems of `value` against a structural schema node, the API server's pruning included."""
    out: List[Problem] = []
    _check(value, schema, path, out)
    return out


# ----------------------------------------------------------------------------------------------------- the walk


def _check(value: Any, node: Mapping[str, Any], path: str, out: List[Problem]) -> None:
    unknown = set(node) - _APPLIED - _IGNORED
    if unknown:
        raise UnsupportedSchema(f"schema node at {path or '<document>'} uses {sorted(unknown)}, which "
                                f"tests/kuberay_schema.py does not implement")
    if value is None:
        if not node.get("nullable", False):
            out.append(Problem(path, "null is not allowed here (not nullable: the API server drops it)"))
        return
    if node.get("x-kubernetes-int-or-string") and not (_is_int(value) or isinstance(value, str)):
        out.append(Problem(path, f"{_show(value)} is {_kind_of(value)}; allowed: an integer or a string"))
        return
    expected = node.get("type")
    if expected is not None:
        if expected not in _TYPES:
            raise UnsupportedSchema(f"schema node at {path or '<document>'} has type {expected!r}")
        if not _TYPES[expected](value):
            fmt = f" ({node['format']})" if "format" in node else ""
            out.append(Problem(path, f"{_show(value)} is {_kind_of(value)}; allowed: {expected}{fmt}"))
            return
    if "anyOf" in node:
        if not any(not validate(value, branch, path) for branch in node["anyOf"]):
            allowed = " or ".join(b.get("type", json.dumps(b)) for b in node["anyOf"])
            out.append(Problem(path, f"{_show(value)} is {_kind_of(value)}; allowed: {allowed}"))
            return
    if "enum" in node and not any(type(e) is type(value) and e == value for e in node["enum"]):
        out.append(Problem(path, f"{_show(value)} is not allowed; allowed: one of "
                                 f"{', '.join(_show(e) for e in node['enum'])}"))
    if isinstance(value, str):
        _check_string(value, node, path, out)
    elif _is_number(value):
        _check_number(value, node, path, out)
    elif isinstance(value, list):
        _check_array(value, node, path, out)
    elif isinstance(value, dict):
        _check_object(value, node, path, out)


def _check_string(value: str, node: Mapping[str, Any], path: str, out: List[Problem]) -> None:
    if "minLength" in node and len(value) < node["minLength"]:
        out.append(Problem(path, f"{_show(value)} is {len(value)} characters long; allowed: "
                                 f"at least {node['minLength']}"))
    if "maxLength" in node and len(value) > node["maxLength"]:
        out.append(Problem(path, f"{_show(value)} is {len(value)} characters long; allowed: "
                                 f"at most {node['maxLength']}"))
    if "pattern" in node and not re.search(node["pattern"], value):
        out.append(Problem(path, f"{_show(value)} does not match; allowed: strings matching {node['pattern']}"))
    if node.get("format") == "date-time":
        try:
            datetime.datetime.fromisoformat(value)
        except ValueError:
            out.append(Problem(path, f"{_show(value)} is not a date-time; allowed: RFC 3339, "
                                     f"e.g. 2025-01-31T12:00:00Z"))


def _check_number(value: Any, node: Mapping[str, Any], path: str, out: List[Problem]) -> None:
    bounds = _INT_RANGES.get(node.get("format", ""))
    if bounds and _is_int(value) and not bounds[0] <= value <= bounds[1]:
        out.append(Problem(path, f"{value} is out of range; allowed: {node['format']}, "
                                 f"{bounds[0]} to {bounds[1]}"))
    # OpenAPI v3.0: exclusiveMinimum/exclusiveMaximum are flags on minimum/maximum.
    if "minimum" in node:
        lo, strict = node["minimum"], node.get("exclusiveMinimum", False)
        if value < lo or (strict and value == lo):
            out.append(Problem(path, f"{value} is too small; allowed: {'>' if strict else '>='} {lo}"))
    if "maximum" in node:
        hi, strict = node["maximum"], node.get("exclusiveMaximum", False)
        if value > hi or (strict and value == hi):
            out.append(Problem(path, f"{value} is too large; allowed: {'<' if strict else '<='} {hi}"))


def _check_array(value: list, node: Mapping[str, Any], path: str, out: List[Problem]) -> None:
    if "minItems" in node and len(value) < node["minItems"]:
        out.append(Problem(path, f"a list of {len(value)} items; allowed: at least {node['minItems']}"))
    if "maxItems" in node and len(value) > node["maxItems"]:
        out.append(Problem(path, f"a list of {len(value)} items; allowed: at most {node['maxItems']}"))
    items = node.get("items")
    for i, item in enumerate(value):
        if items is not None:
            _check(item, items, f"{path}[{i}]", out)
    list_type = node.get("x-kubernetes-list-type", "atomic")
    if list_type == "set":
        _unique([_canonical(v) for v in value], "item", path, out)
    elif list_type == "map":
        names = node.get("x-kubernetes-list-map-keys", [])
        keys = [", ".join(f"{k}={_show(v.get(k))}" for k in names) if isinstance(v, dict) else None for v in value]
        _unique(keys, "/".join(names), path, out)
    elif list_type != "atomic":
        raise UnsupportedSchema(f"schema node at {path} has x-kubernetes-list-type {list_type!r}")


def _unique(keys: List[Any], what: str, path: str, out: List[Problem]) -> None:
    seen: Dict[str, int] = {}
    for i, key in enumerate(keys):
        if key is None:
            continue
        if key in seen:
            out.append(Problem(f"{path}[{i}]", f"duplicate {what} {key} (also at [{seen[key]}]); allowed: "
                                               f"each {what} once in this list"))
        else:
            seen[key] = i


def _check_object(value: dict, node: Mapping[str, Any], path: str, out: List[Problem]) -> None:
    props: Mapping[str, Any] = node.get("properties", {})
    extra = node.get("additionalProperties")
    preserve = node.get("x-kubernetes-preserve-unknown-fields", False) is True
    for raw_key, item in value.items():
        key = _key(raw_key)
        here = _join(path, key)
        if key in props:
            _check(item, props[key], here, out)
        elif isinstance(extra, dict):
            _check(item, extra, here, out)
        elif extra is True or preserve:
            continue
        else:
            out.append(Problem(here, _unknown_message(key, props)))
    for key in node.get("required", []):
        if key not in value:
            out.append(Problem(_join(path, key), "missing; it is required here"))
    if "minProperties" in node and len(value) < node["minProperties"]:
        out.append(Problem(path, f"an object of {len(value)} fields; allowed: at least {node['minProperties']}"))
    if "maxProperties" in node and len(value) > node["maxProperties"]:
        out.append(Problem(path, f"an object of {len(value)} fields; allowed: at most {node['maxProperties']}"))


def _unknown_message(key: str, props: Mapping[str, Any]) -> str:
    if not props:
        return "unknown field (the API server would prune it); allowed: no fields here"
    close = difflib.get_close_matches(key, list(props), n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"unknown field (the API server would prune it){hint} allowed: {', '.join(sorted(props))}"


# ------------------------------------------------------------------------------------------------------ helpers


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": _is_int,
    "number": _is_number,
    "boolean": lambda v: isinstance(v, bool),
}


def _kind_of(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    if v is None:
        return "null"
    return f"a YAML {type(v).__name__}"  # e.g. an unquoted date, which PyYAML reads as a date


def _show(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(sorted(map(str, v)))[:60] + "}"
    try:
        text = json.dumps(v)
    except TypeError:
        text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _canonical(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def _key(k: Any) -> str:
    # As kubectl's YAML-to-JSON conversion does for keys that YAML reads as something else.
    if isinstance(k, bool):
        return "true" if k else "false"
    return str(k)


def _join(path: str, key: str) -> str:
    if _PLAIN_KEY.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"

