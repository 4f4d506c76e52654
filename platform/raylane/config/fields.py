"""The field types every config model is built from: names, durations, memory sizes, choices, and their errors.

This module owns the scalar grammars of Raylane's files and flags and the base model class. Every other module of
``raylane.config`` builds on it, and it imports none of them, so the package's imports form a tree:
``fields`` <- ``datasets``, ``serve``, ``sweep`` <- ``models`` <- ``loader``. Command lines parse their flags with
the same grammars (``parse_duration``), so a duration means the same in a spec, a policy and a flag.

Words
- *duration*: seconds as a number, or a string of one or more parts, each a number and a unit: ``ms``, ``s``,
  ``m``, ``h``, ``d`` or ``w`` (weeks), as in ``90s``, ``10m``, ``2h``, ``1d``, ``2w`` or ``1h30m``.
- *memory*: GiB as a number, or a string such as ``16Gi``, ``512Mi`` or ``1Ti``.
- *allowed text*: the human phrase an error shows after the bad value ("one of fifo, priority, ...").
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Annotated, Any, Callable, Optional, Tuple

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from raylane.scheduling.types import Resources, gpu_request_error

__all__ = [
    "Allowed",
    "StrictModel",
    "error",
    "one_of",
    "matching",
    "NAME_MAX",
    "NAME_ALLOWED",
    "Name",
    "DURATION_ALLOWED",
    "DURATION_UNITS",
    "parse_duration",
    "Duration",
    "MEMORY_ALLOWED",
    "parse_memory",
    "Memory",
    "NonNegative",
    "ResourcesSpec",
]


@dataclasses.dataclass(frozen=True)
class Allowed:
    """``Annotated`` marker: the text an error shows as "what is allowed" for a field of this type."""

    text: str


def error(kind: str, allowed: str) -> PydanticCustomError:
    """The error a validator raises: reported as ``raylane_<kind>``, its message the allowed text."""
    # The message is the allowed text itself; braces would be read as template fields by pydantic.
    return PydanticCustomError(f"raylane_{kind}", allowed.replace("{", "(").replace("}", ")"))


def one_of(names: Tuple[str, ...]) -> Any:
    """A string type that must be one of ``names``."""
    allowed = "one of " + ", ".join(names)

    def check(value: str) -> str:
        if value not in names:
            raise error("one_of", allowed)
        return value

    return Annotated[str, AfterValidator(check), Allowed(allowed)]


def matching(kind: str, pattern: str, allowed: str) -> Any:
    """A string type that must match ``pattern`` whole; its error is ``allowed``, reported as ``raylane_<kind>``."""
    regex = re.compile(pattern)

    def check(value: str) -> str:
        if not regex.fullmatch(value):
            raise error(kind, allowed)
        return value

    return Annotated[str, AfterValidator(check), Allowed(allowed)]


# ------------------------------------------------------------------------------------------- scalar types

NAME_MAX = 63
_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
NAME_ALLOWED = (
    f"a name of at most {NAME_MAX} lowercase letters, digits and '-', starting and ending with a letter or digit"
)


def _check_name(value: str) -> str:
    if len(value) > NAME_MAX or not _NAME_RE.fullmatch(value):
        raise error("name", NAME_ALLOWED)
    return value


Name = Annotated[str, AfterValidator(_check_name), Allowed(NAME_ALLOWED)]

DURATION_ALLOWED = "a duration: seconds as a number >= 0, or a string like 90s, 10m, 2h, 1d or 1h30m"
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
# ``ms`` before ``m`` and ``s``: "500ms" is half a second, not 500 minutes and a stray "s".
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|s|m|h|d|w)")


def _number(value: Any) -> Optional[float]:
    """A finite number from a YAML scalar (bool is not a number here), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            x = float(value.strip())
        except ValueError:
            return None
        return x if math.isfinite(x) else None
    return None


def parse_duration(value: Any) -> float:
    """Seconds from ``90``, ``"90s"``, ``"10m"``, ``"2h"``, ``"1d"``, ``"2w"``, ``"1h30m"``, ``"1w2d"``, ``"500ms"``
    (spaces ignored). ValueError otherwise, naming the value and what is allowed; a caller that knows the field or
    flag reports it with its own name."""
    x = _number(value)
    if x is None and isinstance(value, str):
        text = value.strip().replace(" ", "")
        parts = list(_DURATION_PART.finditer(text))
        if text and parts and "".join(p.group(0) for p in parts) == text:
            x = sum(float(p.group(1)) * DURATION_UNITS[p.group(2)] for p in parts)
    if x is None or x < 0:
        raise ValueError(f"{value!r} is not {DURATION_ALLOWED}")
    return x


MEMORY_ALLOWED = "memory in GiB: a number >= 0, or a string like 16Gi, 512Mi or 1Ti"
_MEMORY_UNITS = {"ki": 1.0 / (1 << 20), "mi": 1.0 / 1024, "gi": 1.0, "ti": 1024.0}
_MEMORY_RE = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*([KMGT]i)B?", re.IGNORECASE)


def parse_memory(value: Any) -> float:
    """GiB from ``16``, ``"16Gi"``, ``"16GiB"``, ``"512Mi"``, ``"1Ti"``. ValueError otherwise (``"16G"`` included:
    decimal units are refused rather than guessed)."""
    x = _number(value)
    if x is None and isinstance(value, str):
        m = _MEMORY_RE.fullmatch(value.strip())
        if m:
            x = float(m.group(1)) * _MEMORY_UNITS[m.group(2).lower()]
    if x is None or x < 0:
        raise ValueError(f"{value!r} is not {MEMORY_ALLOWED}")
    return x


def _wrap(parse: Callable[[Any], float], kind: str, allowed: str) -> Callable[[Any], float]:
    def validate(value: Any) -> float:
        try:
            return parse(value)
        except ValueError:
            raise error(kind, allowed) from None

    return validate


Duration = Annotated[float, BeforeValidator(_wrap(parse_duration, "duration", DURATION_ALLOWED)), Allowed(DURATION_ALLOWED)]
Memory = Annotated[float, BeforeValidator(_wrap(parse_memory, "memory", MEMORY_ALLOWED)), Allowed(MEMORY_ALLOWED)]
NonNegative = Annotated[float, Field(ge=0)]


class StrictModel(BaseModel):
    """Base of every Raylane config model: unknown fields are errors, numbers are finite, instances immutable."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


_RES = Resources()


class ResourcesSpec(StrictModel):
    """What one worker of a gang needs. ``gpu`` below 1 is a share of one GPU device (0.5: two such workers share a
    GPU); 1 or more must be a whole number of GPUs (Ray's rule). A gang, a serving replica and a sweep's trial all
    size their workers with it."""

    gpu: NonNegative = _RES.gpu
    cpu: NonNegative = _RES.cpu
    memory: Memory = _RES.memory

    @field_validator("gpu")
    @classmethod
    def _gpu_share_or_whole(cls, v: float) -> float:
        why = gpu_request_error(v)
        if why is not None:
            raise error("gpu_share", f"{why}, like 0.5 or 2 (not {v:g})")
        return v

    def to_core(self) -> Resources:
        return Resources(gpu=self.gpu, cpu=self.cpu, memory=self.memory)
