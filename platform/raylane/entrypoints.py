"""The user's code a spec names, found and checked before the workload queues. Imports no Ray.

A spec names what it runs in one of two ways:

- ``entrypoint: pkg.module:name``: a function (or, for ``kind: batch``, a class) importable from the job's working
  directory (``ray job submit --working-dir ./my-project``) or from an installed package.
- ``command: [prog, arg, ...]``: a program run on the lease (one-shot kinds only: ``eval`` and ``batch``).

What each kind calls (``SIGNATURES``):

- ``train``: the function Ray Train runs on every worker, ``train_loop_per_worker(config)`` (or with no argument),
  called with the spec's ``config``. Unchanged Ray Train loops qualify: ``ray.train.report`` and
  ``ray.train.get_checkpoint`` are all the platform needs (``raylane.train``).
- ``eval``: ``evaluate(config) -> {metric: number}``, run once on the lease.
- ``batch``: a Ray Data ``map_batches`` function ``fn(batch) -> batch``, or a callable class whose ``__init__``
  takes ``config`` (or nothing) and whose ``__call__`` takes a batch.

A config schema: an entrypoint may declare ``config_schema``, an attribute holding a pydantic model class (for a
function: ``train_loop_per_worker.config_schema = MyConfig``; for a class: a class attribute). The spec's ``config``
is validated against it wherever the spec is checked (``raylane spec check``, submission), every problem named
``config.<field>``; the platform's own config keys (``init_from``/``checkpoint`` references, ``storage_path``,
``fault``) are checked by the platform and not passed to the schema as references.

Errors are ``raylane.errors.ValidationError`` naming the field (``entrypoint``, ``command``, ``config.<path>``), the
value and what is allowed; nothing here raises a bare traceback for bad input.
"""
from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from raylane.errors import ValidationError

__all__ = ["Entrypoint", "ONE_SHOT_KINDS", "CODE_KINDS", "PLATFORM_KEYS", "parse", "load", "check_spec",
           "user_config", "on_path"]

# Kinds that run the user's code through an entrypoint or command. tune and serve run code of their own sections.
CODE_KINDS = ("train", "eval", "batch")
ONE_SHOT_KINDS = ("eval", "batch")
# Config keys the platform reads and removes (or rewrites) before the user's code sees the config.
PLATFORM_KEYS = ("storage_path", "fault")

_REF = re.compile(r"^(?P<module>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)"
                  r":(?P<attr>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)$")
_FORM = "'package.module:function' (a module importable from the job's working directory or an installed package)"
SIGNATURES = {
    "train": "a function train_loop_per_worker(config) (or with no argument), as Ray Train runs on every worker",
    "eval": "a function evaluate(config) returning a mapping of metric names to numbers",
    "batch": "a function fn(batch) -> batch, or a class with __init__(config) (or no argument) and __call__(batch), "
             "as Ray Data's map_batches takes",
}


@dataclass(frozen=True)
class Entrypoint:
    """``module:attr`` as written in a spec."""

    module: str
    attr: str

    def __str__(self) -> str:
        return f"{self.module}:{self.attr}"


def parse(value: Any, field: str = "entrypoint") -> Entrypoint:
    if not isinstance(value, str) or not _REF.match(value.strip()):
        raise ValidationError("spec", [(field, value, _FORM)])
    m = _REF.match(value.strip())
    return Entrypoint(m.group("module"), m.group("attr"))


@contextmanager
def on_path(working_dir: Optional[str]) -> Iterator[None]:
    """Make ``working_dir`` importable for the duration (what ``ray job submit --working-dir`` gives a job)."""
    if not working_dir:
        yield
        return
    path = os.path.abspath(working_dir)
    added = path not in sys.path
    if added:
        sys.path.insert(0, path)
    try:
        yield
    finally:
        if added and path in sys.path:
            sys.path.remove(path)


def load(ref: Entrypoint | str, kind: Optional[str] = "train", *, field: str = "entrypoint") -> Any:
    """Import ``ref`` and check it has the shape ``kind`` calls (``None``: import only, the caller checks the shape);
    ``ValidationError`` naming ``field`` if not."""
    ep = parse(ref, field) if isinstance(ref, str) else ref
    try:
        module = importlib.import_module(ep.module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ep.module
        if ep.module == missing or ep.module.startswith(missing + "."):
            why = (f"module {ep.module!r} not found: run from the project's folder, submit with "
                   f"--working-dir, or install the package")
        else:  # the user's module was found but it imports something that is not installed
            why = f"importing {ep.module!r} failed: it needs module {missing!r}, which is not installed"
        raise ValidationError("spec", [(field, str(ep), why)]) from None
    except Exception as exc:  # noqa: BLE001 - any error at import time is the user's code failing to load
        raise ValidationError("spec", [(field, str(ep), f"importing {ep.module!r} failed: "
                                                        f"{type(exc).__name__}: {exc}")]) from None
    obj: Any = module
    for part in ep.attr.split("."):
        if not hasattr(obj, part):
            known = sorted(n for n, v in vars(module).items() if not n.startswith("_") and callable(v)
                           and getattr(v, "__module__", None) == module.__name__)
            raise ValidationError("spec", [(field, str(ep), f"module {ep.module!r} has no {ep.attr!r}; its callables: "
                                                            f"{', '.join(known[:20]) or '(none)'}")])
        obj = getattr(obj, part)
    problem = signature_problem(obj, kind) if kind is not None else None
    if problem:
        raise ValidationError("spec", [(field, str(ep), f"{problem}; {kind} needs {SIGNATURES[kind]}")])
    return obj


def _positional(fn: Callable, *, drop_self: bool = False) -> Tuple[int, int, bool]:
    """(required positional, accepted positional, takes *args) of ``fn``."""
    params = list(inspect.signature(fn).parameters.values())
    if drop_self and params:
        params = params[1:]
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in pos if p.default is p.empty]
    var = any(p.kind == p.VAR_POSITIONAL for p in params)
    kw_required = [p for p in params if p.kind == p.KEYWORD_ONLY and p.default is p.empty]
    if kw_required:
        return 99, len(pos), var  # a required keyword-only argument nobody will pass
    return len(required), len(pos), var


def signature_problem(obj: Any, kind: str) -> Optional[str]:
    """Why ``obj`` cannot be called the way ``kind`` calls it, or None."""
    if kind not in SIGNATURES:
        return f"kind {kind!r} runs no entrypoint"
    if kind == "batch" and inspect.isclass(obj):
        if not any("__call__" in vars(k) for k in obj.__mro__ if k is not object):
            return f"class {obj.__name__} has no __call__(batch)"
        req, acc, var = _positional(obj.__call__, drop_self=True)
        if not (req <= 1 <= acc or var):
            return f"{obj.__name__}.__call__ takes {acc} argument(s) besides self, not a batch"
        req, acc, var = _positional(obj.__init__, drop_self=True) if obj.__init__ is not object.__init__ else (0, 0, 0)
        if req > 1:
            return f"{obj.__name__}.__init__ needs {req} arguments; it gets config (or nothing)"
        return None
    if inspect.isclass(obj) or not callable(obj):
        return f"{type(obj).__name__} {getattr(obj, '__name__', obj)!r} is not a function"
    try:
        req, acc, var = _positional(obj)
    except (TypeError, ValueError):
        return None  # a builtin or C callable without a signature: let it be called
    if req == 99:
        return "it has a required keyword-only argument"
    if kind == "train":
        if req > 1:
            return f"it needs {req} arguments; Ray Train passes at most one (config)"
        return None
    if req > 1 or not (acc >= 1 or var):
        return f"it takes {req if req > 1 else acc} argument(s), not one"
    return None


def config_schema(obj: Any) -> Optional[type]:
    schema = getattr(obj, "config_schema", None)
    if schema is None:
        return None
    try:
        import pydantic

        if inspect.isclass(schema) and issubclass(schema, pydantic.BaseModel):
            return schema
    except ImportError:  # pragma: no cover - pydantic is a dependency
        pass
    return None


def user_config(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The config the user's code sees: the platform's own keys removed."""
    return {k: v for k, v in dict(config or {}).items() if k not in PLATFORM_KEYS}


def schema_errors(schema: type, config: Mapping[str, Any], *, ref_keys: Sequence[str] = ()) -> List[Tuple[str, Any, str]]:
    """Every problem of ``config`` against the pydantic ``schema``, as (``config.<path>``, value, allowed).

    ``ref_keys`` are config keys that hold checkpoint references (``{workload, step}``), which become a directory
    only when the workload starts: they are checked by the platform, so the schema does not see them."""
    import pydantic

    data = user_config(config)
    for key in ref_keys:  # the platform checks the reference itself; the directory exists only at start
        if isinstance(data.get(key), Mapping):
            del data[key]
    try:
        schema.model_validate(data)
    except pydantic.ValidationError as exc:
        from raylane.config.loader import pydantic_errors

        try:
            described = pydantic_errors(exc, schema)
        except Exception:  # noqa: BLE001 - a schema the describer cannot read: pydantic's own words
            described = [(".".join(str(p) for p in e.get("loc", ())), e.get("input"), e.get("msg", "invalid"))
                         for e in exc.errors(include_url=False)]
        return [(f"config.{path}" if path else "config", _short(value), allowed)
                for path, value, allowed in described]
    return []


def _short(value: Any) -> Any:
    text = repr(value)
    return value if len(text) <= 120 else text[:117] + "..."


def check_spec(spec: Mapping[str, Any], *, working_dir: Optional[str] = None, load_code: bool = True) -> Any:
    """The checks of a spec's code: the entrypoint or command is there and fits the kind, and the config fits the
    entrypoint's declared schema; ``ValidationError`` at the first problem found. Returns the loaded entrypoint (None
    for a command or a kind that runs no user code). ``load_code=False`` checks only the form (for a machine without
    the user's project). What submission checks besides, the training datasets' files and functions among it, is
    ``raylane.launchers.check``."""
    kind = spec.get("kind", "train")
    entry, command = spec.get("entrypoint"), spec.get("command")
    if kind not in CODE_KINDS:
        extra = [(f, v, f"only for kinds {', '.join(CODE_KINDS)}; kind {kind} runs its {kind} section")
                 for f, v in (("entrypoint", entry), ("command", command)) if v is not None]
        if extra:
            raise ValidationError("spec", extra)
        return None
    if entry is not None and command is not None:
        raise ValidationError("spec", [("command", command, "either entrypoint or command, not both")])
    if command is not None:
        if kind not in ONE_SHOT_KINDS:
            raise ValidationError("spec", [("command", command, f"only for one-shot kinds ({', '.join(ONE_SHOT_KINDS)});"
                                                                f" kind {kind} needs an entrypoint: {SIGNATURES[kind]}")])
        if (not isinstance(command, list) or not command
                or not all(isinstance(a, str) and a and "\x00" not in a for a in command)):
            raise ValidationError("spec", [("command", command, "a non-empty list of non-empty strings "
                                                                "(program and arguments, no shell)")])
        return None
    if entry is None:
        how = SIGNATURES[kind] + (" (or command: [...])" if kind in ONE_SHOT_KINDS else "")
        raise ValidationError("spec", [("entrypoint", None, f"required for kind {kind}: {_FORM}, naming {how}")])
    ep = parse(entry)
    if not load_code:
        return None
    with on_path(working_dir):
        obj = load(ep, kind)
    schema = config_schema(obj)
    if schema is not None:
        errors = schema_errors(schema, spec.get("config") or {}, ref_keys=("init_from", "checkpoint"))
        if errors:
            raise ValidationError(f"config of {ep}", errors)
    return obj
