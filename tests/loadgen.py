"""A bounded HTTP load generator for serving tests and benchmarks: closed-loop clients on threads, urllib only.

``clients`` threads each send one request at a time (so about ``clients`` requests are ongoing at once) until
``stop()``, ``max_requests`` sent in all, or ``deadline_s`` passed. Every request sent is waited for (``timeout_s``
each); ``results`` has one ``Result`` per request, answered or not.
"""
from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Dict, List, Optional


@dataclass(frozen=True)
class Result:
    sent_at: float
    done_at: float
    status: int  # HTTP status; 0 when no answer came (connection error, timeout)
    replica: Optional[str]
    error: str = ""

    @property
    def latency_s(self) -> float:
        return self.done_at - self.sent_at


class LoadGen:
    def __init__(self, url: str, *, clients: int, max_requests: int, deadline_s: float, timeout_s: float = 120.0,
                 body: Optional[Dict] = None):
        self.url, self.clients, self.max_requests = url, clients, max_requests
        self.deadline_s, self.timeout_s = deadline_s, timeout_s
        self.body = json.dumps(body or {"prompt": "def main(", "max_new_tokens": 8}).encode()
        self.results: List[Result] = []
        self._lock = threading.Lock()
        self._sent = 0
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self.started_at = 0.0

    def start(self) -> "LoadGen":
        self.started_at = time.time()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.clients)]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> List[Result]:
        """Stop sending and wait for every request already sent."""
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 5)
        return self.results

    def _take(self) -> bool:
        with self._lock:
            if self._stop.is_set() or self._sent >= self.max_requests or \
                    time.time() - self.started_at > self.deadline_s:
                return False
            self._sent += 1
            return True

    def _client(self) -> None:
        while self._take():
            t0 = time.time()
            req = urllib.request.Request(self.url, data=self.body, method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                    out = json.loads(r.read())
                    res = Result(t0, time.time(), r.status, out.get("replica"))
            except urllib.error.HTTPError as exc:
                res = Result(t0, time.time(), exc.code, None, exc.read()[:200].decode(errors="replace"))
            except Exception as exc:  # noqa: BLE001 - recorded as unanswered
                res = Result(t0, time.time(), 0, None, f"{type(exc).__name__}: {exc}")
            with self._lock:
                self.results.append(res)

    # ---------------------------------------------------------------------------------------------- reading
    @property
    def sent(self) -> int:
        return self._sent

    def replicas(self) -> Dict[str, int]:
        with self._lock:
            out: Dict[str, int] = {}
            for r in self.results:
                if r.replica:
                    out[r.replica] = out.get(r.replica, 0) + 1
            return out

    def first_answer_by(self, replica: str) -> Optional[float]:
        with self._lock:
            return min((r.done_at for r in self.results if r.replica == replica), default=None)


def percentile(values: List[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation, as numpy's default."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if q < 100 else max(values)
