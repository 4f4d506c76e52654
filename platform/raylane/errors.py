"""Raylane's one exception tree.

Everything raised on purpose derives from ``RaylaneError``. ``RetryableError`` is what a later attempt can fix
(the cluster is busy, an actor restarts); ``FatalError`` is what it cannot (bad input, a request that can never fit).
"""
from __future__ import annotations


class RaylaneError(Exception):
    """Root of every error Raylane raises on purpose."""


class RetryableError(RaylaneError):
    """A later attempt may succeed: the cluster is busy, the control actor is restarting, a node went away."""


class FatalError(RaylaneError):
    """No retry helps: the input is wrong or the request can never be satisfied."""


class ValidationError(FatalError):
    """A policy, spec or flag is invalid. ``errors`` lists every problem as (field path, value, what is allowed)."""

    def __init__(self, source: str, errors: list[tuple[str, object, str]]):
        self.source = source
        self.errors = list(errors)
        lines = [f"{source}: {len(self.errors)} error(s)"]
        lines += [f"  {path}: got {value!r}; {allowed}" for path, value, allowed in self.errors]
        super().__init__("\n".join(lines))

    def __reduce__(self):  # crosses process boundaries (Ray task errors) intact
        return (type(self), (self.source, self.errors))


class ConflictError(ValidationError):
    """An id already in use (a workload's, a pipeline's or a sweep's): refused before anything is written or
    changed. ``errors`` names the id (field ``id`` or ``pipeline_id``) and what is allowed."""


class UnknownNameError(FatalError, KeyError):
    """A policy, strategy or other registered name that does not exist."""

    def __init__(self, kind: str, name: str, known: list[str]):
        self.kind, self.name, self.known = kind, name, sorted(known)
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(self.known)}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]

    def __reduce__(self):
        return (type(self), (self.kind, self.name, self.known))


class InfeasibleError(FatalError):
    """A workload that no node set and no quota in the cluster could ever hold; refused at submit."""


class NotFoundError(FatalError):
    """A workload id, run or file that does not exist."""


class ControlPlaneUnavailable(RetryableError):
    """The control actor cannot be reached (not started, or restarting)."""


class AuthenticationError(FatalError):
    """A call without a valid credential: missing, malformed, unknown, forged, expired or revoked."""


class PermissionDeniedError(FatalError):
    """An authenticated caller asked for something its role and teams do not allow."""


class TooManyRequestsError(RetryableError):
    """Too many calls of this kind are open or were made: refused before any work, changing nothing. A later
    attempt succeeds once earlier ones have ended (a retry after a second or two)."""
