"""Reading policies and workload specs from YAML, and turning every problem in them into one ``ValidationError``.

This module owns the translation from files to ``raylane.config.models`` and from pydantic's errors to Raylane's:
each error is (dotted field path, the bad value, what is allowed), and all errors of a file are raised together.
YAML syntax errors carry the line and column; a key given twice in one mapping is an error too (PyYAML would keep
the last one silently).

Words
- *source*: what the errors are about, usually the file path; the first word of the error message.
- *path*: where in the document, dotted (``teams.nlp.quotas.gpu.lending_limit``), list items as ``[i]``.

The default policy: ``policies/default.yaml`` in the repository is the one documented, reviewed file. The package
ships a byte-identical copy, ``raylane/config/default_policy.yaml``, so that an installed Raylane works outside the
repository; ``tests/test_config.py`` fails when the two differ (fix: copy the repository file over the package
copy). ``default_policy_path()`` returns the repository file when Raylane runs from a checkout, else the copy, so
an edit to ``policies/default.yaml`` takes effect at once in development.
"""
from __future__ import annotations

import difflib
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Type, Union

import annotated_types
import pydantic
import yaml
from pydantic.fields import FieldInfo

from raylane.config.models import Allowed, ClusterPolicy, WorkloadSpec, policy_name_errors, validate_spec_against_policy
from raylane.errors import NotFoundError, ValidationError

__all__ = [
    "MISSING",
    "default_policy_path",
    "load_policy",
    "load_policy_from_dict",
    "load_spec",
    "load_spec_from_dict",
    "read_yaml",
    "validate_document",
    "pydantic_errors",
]

ErrorList = List[Tuple[str, Any, str]]

_REPO_ROOT = Path(__file__).resolve().parents[3]
PACKAGED_DEFAULT = "default_policy.yaml"


class _Missing:
    """The 'value' of a field that is absent."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()


def default_policy_path() -> Path:
    """``policies/default.yaml`` of the checkout Raylane runs from, else the copy shipped in the package."""
    repo_file = _REPO_ROOT / "policies" / "default.yaml"
    # Only a checkout has platform/raylane beside policies/; an installed package's parents are site-packages.
    if repo_file.is_file() and (_REPO_ROOT / "platform" / "raylane" / "config").is_dir():
        return repo_file
    return Path(str(resources.files("raylane.config").joinpath(PACKAGED_DEFAULT)))


# ------------------------------------------------------------------------------------------------ YAML


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that records keys given twice in one mapping instead of keeping the last silently."""

    def __init__(self, stream):
        super().__init__(stream)
        self.duplicates: ErrorList = []

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            try:
                key = self.construct_object(key_node, deep=True)
                hash(key)
            except Exception:  # an unhashable key; the base class raises the proper error below
                continue
            if key in seen:
                m = key_node.start_mark
                self.duplicates.append(
                    (f"line {m.line + 1}, column {m.column + 1}", key, f"each key once per mapping (first at line {seen[key]})")
                )
            else:
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Union[str, Path], what: str = "file") -> Tuple[Any, ErrorList]:
    """The document in ``path`` and the duplicate-key errors found while reading it.

    Raises ``NotFoundError`` for a missing file and ``ValidationError`` for a YAML syntax error."""
    p = Path(path)
    if not p.is_file():
        hint = "" if not p.exists() else " (it is a directory)"
        raise NotFoundError(f"{what} {p} not found{hint}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValidationError(str(p), [(f"byte {e.start}", e.object[e.start:e.start + 8], "UTF-8 text")]) from None
    return _parse_yaml(text, str(p))


def _parse_yaml(text: str, source: str) -> Tuple[Any, ErrorList]:
    loader = _StrictLoader(text)
    try:
        data = loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        lines = text.splitlines()
        where, line_text = "(yaml)", ""
        if mark is not None:
            where = f"line {mark.line + 1}, column {mark.column + 1}"
            line_text = lines[mark.line].strip() if mark.line < len(lines) else ""
        problem = " ".join(x for x in (e.context, e.problem) if x)
        raise ValidationError(source, [(where, line_text, f"valid YAML ({problem})")]) from None
    except yaml.YAMLError as e:
        raise ValidationError(source, [("(yaml)", "", f"valid YAML ({e})")]) from None
    finally:
        loader.dispose()
    return data, loader.duplicates


# --------------------------------------------------------------------------------- pydantic -> Raylane


def pydantic_errors(exc: pydantic.ValidationError, model: Type[pydantic.BaseModel]) -> ErrorList:
    """Every error of ``exc`` as (dotted path, bad value, allowed text), reading field types from ``model``."""
    out: ErrorList = []
    for e in exc.errors(include_url=False):
        loc = tuple(e["loc"])
        kind = e["type"]
        value = e.get("input")
        if loc and loc[-1] == "[key]":
            # A bad mapping key: the path ends at the key itself, and the key is the value.
            loc = loc[:-1]
            allowed = e["msg"] if kind.startswith("raylane_") else _describe(_type_at(model, loc, key=True))
            allowed = allowed or e["msg"]
        elif kind.startswith("raylane_"):
            allowed = e["msg"]
        elif kind == "extra_forbidden":
            allowed = _unknown_field(model, loc)
        elif kind == "missing":
            value = MISSING
            allowed = "required: " + (_describe(_type_at(model, loc)) or "a value")
        else:
            allowed = _describe(_type_at(model, loc)) or e["msg"]
        out.append((_dotted(loc), value, allowed))
    return out


def _dotted(loc: Sequence[Any]) -> str:
    s = ""
    for part in loc:
        if isinstance(part, int):
            s += f"[{part}]"
        else:
            s += ("." if s else "") + str(part)
    return s or "(top level)"


def _unknown_field(model: Type[pydantic.BaseModel], loc: Tuple[Any, ...]) -> str:
    parent = _unwrap(_type_at(model, loc[:-1]))[0]
    if not _is_model(parent):
        return "unknown field"
    fields = _field_names(parent)
    text = "unknown field; allowed fields: " + ", ".join(fields)
    close = difflib.get_close_matches(str(loc[-1]), fields, n=1)
    return text + (f" (did you mean {close[0]}?)" if close else "")


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, pydantic.BaseModel)


def _field_names(model: Type[pydantic.BaseModel]) -> List[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _unwrap(tp: Any) -> Tuple[Any, list, bool]:
    """(bare type, Annotated metadata, nullable) of a field type."""
    meta: list = []
    nullable = False
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            args = typing.get_args(tp)
            tp = args[0]
            for m in args[1:]:
                meta.extend(m.metadata if isinstance(m, FieldInfo) else [m])
        elif origin in (typing.Union, types.UnionType):
            args = typing.get_args(tp)
            rest = [a for a in args if a is not type(None)]
            if len(rest) != 1:
                break
            nullable = nullable or len(rest) < len(args)
            tp = rest[0]
        else:
            return tp, meta, nullable
    return tp, meta, nullable


def _type_at(model: Type[pydantic.BaseModel], loc: Sequence[Any], key: bool = False) -> Any:
    """The declared type at ``loc`` inside ``model`` (with ``key``: the key type of the mapping at ``loc[:-1]``)."""
    tp: Any = model
    steps = list(loc[:-1]) if key else list(loc)
    for part in steps:
        bare, _, _ = _unwrap(tp)
        origin = typing.get_origin(bare)
        if _is_model(bare):
            field = next((f for n, f in bare.model_fields.items() if part in (n, f.alias)), None)
            if field is None:
                return None
            tp = field.rebuild_annotation()
        elif origin in (dict, Mapping, typing.Dict):
            tp = typing.get_args(bare)[1]
        elif origin in (list, tuple, typing.List, typing.Tuple):
            tp = typing.get_args(bare)[0]
        else:
            return None
    if key:
        bare = _unwrap(tp)[0]
        return typing.get_args(bare)[0] if typing.get_origin(bare) in (dict, Mapping) else None
    return tp


_BOUNDS = ((annotated_types.Ge, "ge", ">="), (annotated_types.Gt, "gt", ">"), (annotated_types.Le, "le", "<="),
           (annotated_types.Lt, "lt", "<"))


def _describe(tp: Any) -> Optional[str]:
    """A human phrase for what a value of type ``tp`` may be, e.g. "an integer >= 1" or "a number >= 0 or null"."""
    if tp is None:
        return None
    bare, meta, nullable = _unwrap(tp)
    text = next((m.text for m in meta if isinstance(m, Allowed)), None)
    if text is None:
        origin = typing.get_origin(bare)
        if bare is bool:
            text = "true or false"
        elif bare is int:
            text = "an integer"
        elif bare is float:
            text = "a number"
        elif bare is str:
            text = "a string"
        elif bare is Any:
            text = "any value"
        elif _is_model(bare):
            text = "a mapping with fields " + ", ".join(_field_names(bare))
        elif bare is dict or origin in (dict, Mapping):
            text = "a mapping"
        elif origin in (list, tuple) or bare in (list, tuple):
            item = typing.get_args(bare)[0] if typing.get_args(bare) else None
            inner = _describe(item)
            text = "a list" + (f" of items each {inner}" if inner else "")
        else:
            return None
        for m in meta:
            for cls, attr, sym in _BOUNDS:
                if isinstance(m, cls):
                    text += f" {sym} {getattr(m, attr)}"
            if isinstance(m, annotated_types.MinLen) and m.min_length > 0:
                unit = "character" if bare is str else "entry"
                text += f" with at least {m.min_length} {unit}{'s' if m.min_length > 1 else ''}"
            if isinstance(m, annotated_types.MaxLen):
                text += f" with at most {m.max_length}"
    return text + " or null" if nullable else text


# ---------------------------------------------------------------------------------------------- loading


def validate_document(
    model: Type[pydantic.BaseModel], data: Any, source: str, extra: Sequence[Tuple[str, Any, str]] = ()
) -> Any:
    """``model`` from a parsed document, or ``ValidationError`` with every problem (``extra`` first: e.g. the
    duplicate keys ``read_yaml`` found). For any ``StrictModel``, e.g. the cluster file's."""
    errors = list(extra)
    result = None
    if not isinstance(data, Mapping):
        errors.append(("(top level)", data, "a mapping with fields " + ", ".join(_field_names(model))))
    else:
        try:
            result = model.model_validate(dict(data))
        except pydantic.ValidationError as exc:
            errors.extend(pydantic_errors(exc, model))
    if errors:
        raise ValidationError(source, errors)
    return result


_validate = validate_document  # the name raylane.config.cluster imports


def load_policy_from_dict(data: Any, source: str = "policy", *, _extra: ErrorList = ()) -> ClusterPolicy:
    """A ``ClusterPolicy`` from parsed YAML; raises ``ValidationError`` with every problem."""
    return validate_document(ClusterPolicy, data, source, _extra)


def load_policy(path: Union[str, Path, None] = None) -> ClusterPolicy:
    """The policy in ``path`` (default: ``default_policy_path()``). Raises ``NotFoundError`` or ``ValidationError``."""
    p = Path(path) if path is not None else default_policy_path()
    data, dups = read_yaml(p, "policy file")
    return load_policy_from_dict(data, str(p), _extra=dups)


def load_spec_from_dict(
    data: Any, source: str = "spec", *, policy: Optional[ClusterPolicy] = None, _extra: ErrorList = ()
) -> WorkloadSpec:
    """A ``WorkloadSpec`` from parsed YAML, checked against ``policy`` when one is given (all errors at once)."""
    errors = list(_extra)
    spec = None
    try:
        spec = validate_document(WorkloadSpec, data, source)
    except ValidationError as exc:
        errors.extend(exc.errors)
    if spec is not None and policy is not None:
        errors.extend(validate_spec_against_policy(spec, policy))
    elif policy is not None and isinstance(data, Mapping):
        # The spec has errors of its own; still report the unknown team or class, which need no valid spec.
        bad = {p for p, _, _ in errors}
        names = {f: data.get(f) if f not in bad and isinstance(data.get(f), str) else None for f in ("team", "class")}
        gang = data.get("gang")
        features = gang.get("features") if isinstance(gang, Mapping) else None
        if not isinstance(features, list) or any(p.startswith("gang.features") for p in bad):
            features = []
        features = [f for f in features if isinstance(f, str)]
        errors.extend(policy_name_errors(policy, team=names["team"], class_=names["class"], features=features))
    if errors:
        raise ValidationError(source, errors)
    return spec


def load_spec(path: Union[str, Path], policy: Optional[ClusterPolicy] = None) -> WorkloadSpec:
    """The workload spec in ``path``, checked against ``policy`` when given. Raises ``NotFoundError`` or
    ``ValidationError``."""
    p = Path(path)
    data, dups = read_yaml(p, "spec file")
    return load_spec_from_dict(data, str(p), policy=policy, _extra=dups)
