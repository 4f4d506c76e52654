"""What the control plane's process unpickles: plain data, never code.

Ray unpickles a call's arguments in the callee before the method runs (``ray._private.serialization``), so a caller
that pickles an object whose ``__reduce__`` names a function (``os.system``, ``exec``, ``builtins.eval``, a
Raylane function) runs that function inside the control actor, whatever its methods check. Ray 2.60 has no option to
refuse that; it does have one place where every pickle it reads in a process passes: the module-level ``pickle``
of ``ray._private.serialization`` (task arguments, ``ray.get`` and awaited results) and of ``ray.exceptions``
(the exception a failed call carries). ``install`` replaces those two names, in this process only, by
``GUARDED``: ``ray.cloudpickle`` with a ``loads`` whose unpickler resolves only the names in ``ALLOWED`` (plain
data: containers, numbers, dates; exception classes of Python, Ray and Raylane; Raylane's enumerations). Anything else is refused before
it is called: the call fails in Ray's deserializer (the caller gets Ray's error), nothing of it ran, and the
refusal is kept for the shell's audit (``refusals``). A plain value (dict, list, str, number, bytes, None, tuple,
set) needs no name at all, which is every argument Raylane's clients send (``ControlClient._call``).

Installed by the control actor and its watcher (``raylane.control.actor``), never in a user's process. What it does
not cover, and why, is in docs/security.md ("Code inside the cluster").
"""
from __future__ import annotations

import _compat_pickle
import collections
import enum
import io
import logging
import pickle
import threading
from typing import Any, Callable, Deque, Dict, FrozenSet, List, Optional, Tuple

log = logging.getLogger("raylane.control")

# (module, name) pairs a pickle may name: data types whose construction runs no caller-chosen code.
ALLOWED: FrozenSet[Tuple[str, str]] = frozenset({
    ("builtins", n) for n in ("set", "frozenset", "bytearray", "complex", "slice", "range", "object", "int", "float",
                              "str", "bytes", "bool", "list", "dict", "tuple")
} | {
    ("collections", n) for n in ("OrderedDict", "deque", "Counter")
} | {
    ("datetime", n) for n in ("datetime", "date", "time", "timedelta", "timezone")
} | {
    ("copyreg", "_reconstructor"), ("_codecs", "encode"), ("decimal", "Decimal"), ("uuid", "UUID"),
    # What Ray's own calls from this process return: a placement group's ``ready()`` answers with the group.
    ("ray.util.placement_group", "PlacementGroup"), ("ray._raylet", "PlacementGroupID"),
    # References, rebuilt from ids (no code of the caller's): a gang's worker handles (``register_workers``).
    ("ray._private.serialization", "_actor_handle_deserializer"),
    ("ray._private.serialization", "_object_ref_deserializer"),
})

# Modules whose exception classes (and only those) a pickle may name: how a failed call's error travels.
EXCEPTION_MODULES: FrozenSet[str] = frozenset({"builtins", "ray.exceptions", "raylane.errors"})

# Raylane's own enumerations (``ReportKind``, ``State``, ...: a member is unpickled as ``Class(value)``, a lookup)
# may be named from this package; its modules are Raylane's code, imported as the control plane imports them.
ENUM_PACKAGE = "raylane."

KEEP = 64  # refusals kept for the audit between two drains; past that, counted only


class Refused(pickle.UnpicklingError):
    """A pickle named something outside ``ALLOWED``: not unpickled."""


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        # Python 2's names (protocols 0-2), mapped as pickle.Unpickler maps them (fix_imports) before it looks.
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        if "." not in name and (module in EXCEPTION_MODULES or module.startswith(ENUM_PACKAGE)):
            try:
                found = super().find_class(module, name)
            except Exception:  # noqa: BLE001 - no such module or name: refused like any other
                found = None
            if isinstance(found, type) and (issubclass(found, BaseException) if module in EXCEPTION_MODULES
                                            else issubclass(found, enum.Enum)):
                return found
        _note(module, name)
        raise Refused(f"refused to unpickle {module}.{name}: the control plane takes plain data only "
                      "(raylane.control.unpickle)")


_lock = threading.Lock()
_kept: Deque[str] = collections.deque(maxlen=KEEP)
_dropped = 0


def _note(module: str, name: str) -> None:
    global _dropped
    with _lock:
        if len(_kept) == KEEP:
            _dropped += 1
        _kept.append(f"{module}.{name}")


def refusals() -> Tuple[List[str], int]:
    """The names refused since the last call (at most ``KEEP``) and how many more were refused; both cleared."""
    global _dropped
    with _lock:
        names, more = list(_kept), _dropped
        _kept.clear()
        _dropped = 0
    return names, more


def loads(data: Any, *, buffers: Optional[Any] = None, **_: Any) -> Any:
    """``pickle.loads`` with ``find_class`` limited to ``ALLOWED`` and exception classes of ``EXCEPTION_MODULES``."""
    return _Unpickler(io.BytesIO(memoryview(data)), buffers=buffers).load()


class _Guarded:
    """``ray.cloudpickle`` with a guarded ``loads`` (``load`` too): what ``install`` puts in Ray's modules."""

    def __init__(self, inner: Any):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    loads = staticmethod(loads)

    @staticmethod
    def load(file: Any, **kw: Any) -> Any:
        return loads(file.read(), **kw)


_installed: Dict[str, Any] = {}


def targets() -> List[Any]:
    """The modules whose ``pickle`` Ray reads every foreign pickle of this process through."""
    import ray._private.serialization as serialization
    import ray.exceptions as exceptions

    return [serialization, exceptions]


def install() -> None:
    """Guard this process's unpickling of what other processes send (idempotent). Raises ``RuntimeError`` when
    Ray's modules no longer read pickles through a module-level ``pickle`` (a Ray upgrade): the control plane then
    refuses to start rather than run unguarded."""
    for mod in targets():
        current = getattr(mod, "pickle", None)
        if isinstance(current, _Guarded):
            continue
        if current is None or not callable(getattr(current, "loads", None)):
            raise RuntimeError(f"{mod.__name__} has no module-level pickle.loads to guard (Ray changed): "
                               "raylane.control.unpickle does not know this Ray version")
        _installed[mod.__name__] = current
        mod.pickle = _Guarded(current)
    log.info("unpickling guarded in %s", ", ".join(m.__name__ for m in targets()))


def uninstall() -> None:
    """Put Ray's own ``pickle`` back (tests)."""
    for mod in targets():
        if mod.__name__ in _installed:
            mod.pickle = _installed.pop(mod.__name__)


def installed() -> bool:
    return all(isinstance(getattr(m, "pickle", None), _Guarded) for m in targets())


def drain(audit: Callable[[str, str, str], None]) -> None:
    """Write what was refused since the last drain as one audit row (action ``unpickle``, target ``@control``)."""
    names, more = refusals()
    if not names:
        return
    shown = ", ".join(sorted(set(names)))
    extra = f" (and {more} more)" if more else ""
    audit("unpickle", "refused", f"{len(names) + more} call(s) whose pickled arguments named {shown}{extra}: "
                                 "the control plane unpickles plain data only; nothing of them ran")
