"""Ids of what users submit (workloads, pipelines, sweeps): ``<name>-<12 hex digits>``.

This module owns how such an id is drawn. The suffix is 48 random bits. Among 10,000 ids of one name the chance that
any two are drawn equal is about 2 in 10 million (birthday bound n^2 / 2^49); the 6 hex digits it replaced gave
about 3 collisions in a 10,000-submission burst of one spec name. A drawer that can tell which ids are in use
(``taken``) still draws again on a repeat, so a known id is never handed out; ``ConflictError`` is left for a
source of randomness that keeps repeating (``MAX_DRAWS`` in a row), which only a broken one does.

Words: *suffix* is the random part after the last ``-``; nothing parses it, only its uniqueness matters.
"""
from __future__ import annotations

import secrets
from typing import Callable, Optional

from raylane.errors import ConflictError

SUFFIX_BYTES = 6  # 12 hex digits
MAX_DRAWS = 8

__all__ = ["SUFFIX_BYTES", "MAX_DRAWS", "suffix", "new_id"]


def suffix() -> str:
    """A fresh random suffix (12 hex digits)."""
    return secrets.token_hex(SUFFIX_BYTES)


def new_id(name: str, taken: Callable[[str], bool] = lambda _id: False, *, kind: str = "workload",
           draw: Optional[Callable[[], str]] = None) -> str:
    """``<name>-<suffix>``, drawn again while ``taken`` says it is in use; ``ConflictError`` (naming the last id
    drawn) once ``MAX_DRAWS`` draws in a row were all taken. ``draw`` defaults to ``suffix``."""
    draw = draw or suffix
    for _ in range(MAX_DRAWS):
        candidate = f"{name}-{draw()}"
        if not taken(candidate):
            return candidate
    raise ConflictError(f"{kind} id", [("id", candidate, f"an id no {kind} has used "
                                                         f"({MAX_DRAWS} draws in a row were all in use)")])
