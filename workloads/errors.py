"""The reference workloads' own error: a config they cannot run. Imports nothing of Raylane.

``ConfigError.errors`` lists every problem as (field path, value, what is allowed). The class attribute
``fatal = True`` tells a runner that retrying cannot help (Raylane fails such a workload at once instead of
spending its retry budget); any user exception may carry the same attribute.
"""
from __future__ import annotations


class ConfigError(ValueError):
    fatal = True

    def __init__(self, source: str, errors: list[tuple[str, object, str]]):
        self.source = source
        self.errors = list(errors)
        lines = [f"{source}: {len(self.errors)} error(s)"]
        lines += [f"  {path}: got {value!r}; {allowed}" for path, value, allowed in self.errors]
        super().__init__("\n".join(lines))

    def __reduce__(self):  # crosses process boundaries (Ray task errors) intact
        return (type(self), (self.source, self.errors))
