"""Reading policies and workload specs from YAML, and turning every problem in them into one ``ValidationError``.

This module owns the translation from files to ``raylane.config.models`` and from pydantic's errors to Raylane's:
each error is (dotted field path, the bad value, what is allowed), and all errors of a file are raised together.
YAML syntax errors carry the line and column; a key given twice in one mapping is an error too (PyYAML would keep
the last one silently). No file, however broken, ends in a traceback: bytes that are not UTF-8 or not printable,
files over ``MAX_FILE_BYTES``, nesting deeper than ``MAX_DEPTH`` (refused before anything recurses), aliases that
contain themselves or expand beyond ``MAX_NODES`` values, keys that are not strings and values that are not
JSON-like (dates, binary, sets) are each an error with the line and column or the path.

Words
- *source*: what the errors are about, usually the file path; the first word of the error message.
- *path*: where in the document, dotted (``teams.nlp.quotas.gpu.lending_limit``), list items as ``[i]``.

The default policy: ``policies/default.yaml`` in the repository is the one documented, reviewed file. The package
ships a byte-identical copy, ``raylane/config/default_policy.yaml``, so that an installed Raylane works outside the
repository; ``tests/config/test_config.py`` fails when the two differ (fix: copy the repository file over the package
copy). ``default_policy_path()`` returns the repository file when Raylane runs from a checkout, else the copy, so
an edit to ``policies/default.yaml`` takes effect at once in development.
"""
from __future__ import annotations

import difflib
import sys
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Type, Union

import annotated_types
import pydantic
import yaml
from pydantic.fields import FieldInfo

from raylane.config.models import (Allowed, ClusterPolicy, WorkloadSpec, policy_name_errors,
                                   validate_spec_against_policy)
from raylane.errors import NotFoundError, ValidationError

__all__ = [
    "MISSING",
    "default_policy_path",
    "load_policy",
    "load_policy_from_dict",
    "load_spec",
    "load_spec_from_dict",
    "spec_and_errors",
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

# Limits on what a policy, spec or cluster file may be; the largest shipped file is under 10 KiB and 6 levels deep.
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 64  # nested mappings and lists, aliases expanded
MAX_NODES = 100_000  # values in the document once aliases are expanded (a "billion laughs" file is refused)

_FLOAT_MAX = sys.float_info.max
_TAG = "tag:yaml.org,2002:"
_REFUSED_TAGS = {
    _TAG + "timestamp": "a date or time is not a value here: quote it to make it a string",
    _TAG + "binary": "binary data is not a value here",
    _TAG + "set": "a set is not a value here: write a list",
    _TAG + "omap": "an ordered map is not a value here: write a mapping",
    _TAG + "pairs": "pairs are not a value here: write a mapping",
}


_TAG_WORDS = {_TAG + t: w for t, w in (("int", "an integer"), ("float", "a number"), ("bool", "true or false"),
                                        ("null", "null"), ("seq", "a list"), ("map", "a mapping"),
                                        ("timestamp", "a date"), ("binary", "binary data"), ("set", "a set"))}


class _DocumentError(yaml.MarkedYAMLError):
    """A problem of the document's shape (too deep, too large, an alias inside itself) found before it is
    constructed, with where it is."""

    def __init__(self, path: str, problem: str, mark):
        super().__init__(problem=problem, problem_mark=mark)
        self.path = path


def _clip(value: str, limit: int = 40) -> str:
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value):,} characters)"


def _where(mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _step(index: Any) -> str:
    """The path step of ``Composer.compose_node``'s ``index``: a list position, a mapping's key node, or None for
    a key itself."""
    if isinstance(index, int):
        return f"[{index}]"
    if isinstance(index, yaml.ScalarNode):
        return str(index.value)
    return "?" if index is not None else "(a key)"


def _join(steps: Sequence[str]) -> str:
    s = ""
    for step in steps:
        s += step if step.startswith("[") or not s else "." + step
    return s or "(top level)"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader for files people write: keys given twice in one mapping are recorded (PyYAML keeps the last one
    silently); nesting, alias expansion and cycles are bounded before anything recurses over the document; every
    error of a value (an int of 5,000 digits, an impossible date) carries the mark of the node it came from.

    PyYAML's composer recurses once per nesting level, so a 5,000-deep file would end in ``RecursionError``:
    ``compose_node`` refuses to open a mapping or list deeper than ``MAX_DEPTH`` (the scanner and parser below it
    are iterative). Aliases are not expanded while composing; ``_check_graph`` bounds what they expand to."""

    def __init__(self, stream):
        super().__init__(stream)  # the Reader checks every character here (ReaderError)
        self.duplicates: ErrorList = []
        self._steps: List[str] = []

    def compose_node(self, parent, index):
        self._steps.append(_step(index))
        try:
            if len(self._steps) > MAX_DEPTH and self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
                raise _DocumentError(_join(self._steps[1:]), f"at most {MAX_DEPTH} levels of nested mappings and "
                                     f"lists", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._steps.pop()

    def construct_object(self, node, deep=False):
        try:
            value = super().construct_object(node, deep=deep)
            # Every number Raylane reads may become a float; beyond a float's range it has no meaning anywhere.
            if type(value) is int and not -_FLOAT_MAX <= value <= _FLOAT_MAX:
                raise ValueError(f"a number from -{_FLOAT_MAX:.4g} to {_FLOAT_MAX:.4g}")
            return value
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, OverflowError, ArithmeticError) as e:  # int('9' * 5000), 2024-13-45, ...
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {_clip(node.value)}: {e}" if isinstance(node, yaml.ScalarNode) else str(e),
                node.start_mark) from None

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:  # every key is a plain string here (_check_graph)
            key = key_node.value
            if key_node.tag != _TAG + "str":
                continue
            if key in seen:
                self.duplicates.append(
                    (_where(key_node.start_mark), key, f"each key once per mapping (first at line {seen[key]})"))
            else:
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _check_graph(root: yaml.Node) -> ErrorList:
    """Bound the document before it is constructed: no alias cycle, at most ``MAX_DEPTH`` levels and ``MAX_NODES``
    values with aliases expanded (raising ``_DocumentError``); and the problems of its values (keys that are not
    strings, tags that are not JSON-like values), returned as errors. Iterative: nothing here recurses."""
    errors: ErrorList = []
    size: dict = {}  # id(node) -> (values, depth) of the node with aliases expanded
    active: set = set()  # ids of the nodes on the current path, to find an alias that contains itself
    stack: List[Tuple[yaml.Node, Tuple[str, ...], bool]] = [(root, (), False)]
    while stack:
        node, path, done = stack.pop()
        key = id(node)
        children = _children(node, path)
        if done:
            active.discard(key)
            kids = [size[id(c)] for c, _ in children]
            size[key] = (1 + sum(n for n, _ in kids), 1 + max((d for _, d in kids), default=0))
            if size[key][0] > MAX_NODES:
                raise _DocumentError(_join(path), f"at most {MAX_NODES:,} values with aliases expanded "
                                                  f"(this one expands to more)", node.start_mark)
            if size[key][1] > MAX_DEPTH + 1:
                raise _DocumentError(_join(path), f"at most {MAX_DEPTH} levels of nested mappings and lists, "
                                                  f"aliases expanded", node.start_mark)
            continue
        if key in size:
            continue
        if key in active:
            raise _DocumentError(_join(path), "an alias that does not contain itself", node.start_mark)
        active.add(key)
        errors.extend(_node_errors(node, path))
        stack.append((node, path, True))
        # Reversed, so that nodes are visited in document order and a shared node is named where it is defined.
        stack.extend((c, p, False) for c, p in reversed(children) if id(c) not in size)
    return errors


def _children(node: yaml.Node, path: Tuple[str, ...]) -> List[Tuple[yaml.Node, Tuple[str, ...]]]:
    if isinstance(node, yaml.SequenceNode):
        return [(c, path + (f"[{i}]",)) for i, c in enumerate(node.value)]
    if isinstance(node, yaml.MappingNode):
        return [(v, path + (_step(k),)) for k, v in node.value]
    return []


def _node_errors(node: yaml.Node, path: Tuple[str, ...]) -> ErrorList:
    out: ErrorList = []
    if node.tag in _REFUSED_TAGS:
        out.append((_join(path), node.value if isinstance(node, yaml.ScalarNode) else f"!!{node.tag[len(_TAG):]}",
                    f"{_REFUSED_TAGS[node.tag]} ({_where(node.start_mark)})"))
    if isinstance(node, yaml.MappingNode):
        for k, _ in node.value:
            if not isinstance(k, yaml.ScalarNode) or k.tag not in (_TAG + "str", _TAG + "merge"):
                shown = k.value if isinstance(k, yaml.ScalarNode) else _TAG_WORDS.get(k.tag, k.tag)
                out.append((_join(path), shown, f"a string as each key; this one reads as "
                                                f"{_TAG_WORDS.get(k.tag, k.tag)} ({_where(k.start_mark)})"
                                                + (": quote it" if isinstance(k, yaml.ScalarNode) else "")))
    return out


def read_yaml(path: Union[str, Path], what: str = "file") -> Tuple[Any, ErrorList]:
    """The document in ``path`` and the duplicate-key errors found while reading it.

    Raises ``NotFoundError`` for a missing file and ``ValidationError`` for anything else that keeps it from being
    read as intended, each error with its line and column or path: not UTF-8, larger than ``MAX_FILE_BYTES``, a
    YAML error, more than one document, nesting deeper than ``MAX_DEPTH`` or aliases expanding beyond
    ``MAX_NODES``, a key that is not a string, a value that is no JSON-like value (a date, binary, a set)."""
    p = Path(path)
    if not p.is_file():
        hint = "" if not p.exists() else " (it is a directory)"
        raise NotFoundError(f"{what} {p} not found{hint}")
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise NotFoundError(f"{what} {p} cannot be read: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ValidationError(str(p), [("(file)", f"{p.stat().st_size:,} bytes",
                                        f"at most {MAX_FILE_BYTES:,} bytes for a {what}")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start)
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1)
        raise ValidationError(str(p), [(f"byte {e.start}", raw[e.start:e.start + 8],
                                        f"UTF-8 text (line {line + 1}, column {column + 1})")]) from None
    return _parse_yaml(text, str(p))


def _parse_yaml(text: str, source: str) -> Tuple[Any, ErrorList]:
    def at(line: int, column: int) -> Tuple[str, str]:
        lines = text.splitlines()
        return f"line {line + 1}, column {column + 1}", lines[line].strip()[:200] if line < len(lines) else ""

    loader = None
    try:
        loader = _StrictLoader(text)
        node = loader.get_single_node()
        errors = _check_graph(node) if node is not None else []
        if errors:
            raise ValidationError(source, errors)
        data = loader.construct_document(node) if node is not None else None
    except _DocumentError as e:
        raise ValidationError(source, [(_where(e.problem_mark), e.path, e.problem)]) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where, line_text = at(mark.line, mark.column) if mark is not None else ("(yaml)", "")
        problem = " ".join(x for x in (e.context, e.problem) if x)
        raise ValidationError(source, [(where, line_text, f"valid YAML ({problem})")]) from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (NUL, other control characters)
        before = text[:e.position]
        where, _ = at(before.count("\n"), e.position - (before.rfind("\n") + 1))
        char = chr(e.character) if isinstance(e.character, int) else e.character
        raise ValidationError(source, [(where, char, f"printable text ({e.reason})")]) from None
    except yaml.YAMLError as e:
        raise ValidationError(source, [("(yaml)", "", f"valid YAML ({e})")]) from None
    except RecursionError:  # not expected: every recursion above is bounded by MAX_DEPTH
        raise ValidationError(source, [("(yaml)", "", f"at most {MAX_DEPTH} levels of nesting")]) from None
    finally:
        if loader is not None:
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
        elif kind in ("value_error", "assertion_error"):
            # A validator of the model (a user's config schema, say) said why: its words, not the field's type.
            allowed = str(e["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
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


def _bound(v: Any) -> Any:
    """A bound as written in a phrase: 0.0 and 0 alike as ``0``. (Python's typing cache hands back the first of two
    equal ``Annotated`` types it made, ``Gt(0)`` for ``Gt(0.0)``: the phrase must not depend on which came first.)"""
    return int(v) if isinstance(v, float) and v.is_integer() else v


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
                    text += f" {sym} {_bound(getattr(m, attr))}"
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


def load_spec_from_dict(data: Any, source: str = "spec", *, policy: Optional[ClusterPolicy] = None,
                        _extra: ErrorList = ()) -> WorkloadSpec:
    """A ``WorkloadSpec`` from parsed YAML, checked against ``policy`` when one is given (all errors at once).

    The user's code it names is not imported here: ``raylane.launchers.check`` adds those checks (what submission
    runs) to the same report."""
    spec, errors = spec_and_errors(data, source, policy=policy, _extra=_extra)
    if errors:
        raise ValidationError(source, errors)
    return spec


def spec_and_errors(data: Any, source: str = "spec", *, policy: Optional[ClusterPolicy] = None,
                    _extra: ErrorList = ()) -> Tuple[Optional[WorkloadSpec], ErrorList]:
    """What ``load_spec_from_dict`` finds, unraised: the ``WorkloadSpec`` (None when its own fields have errors) and
    every problem, for a caller that adds checks of its own to the same report (``raylane.launchers.check``)."""
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
    return spec, errors


def load_spec(path: Union[str, Path], policy: Optional[ClusterPolicy] = None) -> WorkloadSpec:
    """The workload spec in ``path``, checked against ``policy`` when given (see ``load_spec_from_dict``). Raises
    ``NotFoundError`` or ``ValidationError``."""
    p = Path(path)
    data, dups = read_yaml(p, "spec file")
    return load_spec_from_dict(data, str(p), policy=policy, _extra=dups)
