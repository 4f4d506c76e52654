"""Serving the reference language model: text generation from a checkpoint, behind an HTTP route.

Two layers, so the model part is tested without Ray:
- ``Generator`` (pure torch): loads a checkpoint directory of the byte-level LM (``workloads.eval_lm.load_model``),
  or, when none is given, builds a freshly initialised ``ByteTransformer`` of the configured ``shape`` (seeded, so
  every replica serves the same weights; it generates noise, but exercises the whole serving path). ``generate``
  continues a prompt greedily (``temperature == 0``) or by sampling from a seeded generator.
- ``LMServer``: the Ray Serve deployment class (a plain class; a serving platform wraps it with
  ``serve.deployment``), constructed with the keyword arguments of ``LMServerConfig``, which it declares as its
  ``config_schema`` so a platform can check a spec's arguments before any replica starts. ``POST <route>`` with a
  JSON body ``{"prompt": str, "max_new_tokens": int, "temperature": float, "seed": int}`` (all but ``prompt``
  optional) answers ``{"text", "prompt", "new_tokens", "replica", "service_ms"}``; ``GET <route>`` answers what the
  replica serves. A bad body is a 400 naming the field.

A replica runs one generation at a time (a model on one device, no batching): concurrent requests queue inside
the replica, where Serve counts them as ongoing, which is what the autoscaler reads. Generation runs in a thread so
the replica keeps answering Serve's probes meanwhile. ``token_delay_ms`` sleeps per generated token: on logical
GPUs (no device) it stands in for accelerator decode time without burning the CPU the rest of the cluster needs.
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Annotated, Any, Dict, Mapping, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from workloads import checkpoint as ckpt
from workloads.model import ByteTransformer, ModelConfig

__all__ = ["Generator", "LMServer", "LMServerConfig", "parse_request"]

MAX_PROMPT_BYTES = 4096


class Generator:
    """A ByteTransformer that continues prompts. Not thread-safe: callers serialise (``LMServer`` does)."""

    def __init__(self, checkpoint: Optional[str] = None, shape: Optional[Mapping[str, Any]] = None, *,
                 seed: int = 0, num_threads: int = 1):
        torch.set_num_threads(num_threads)
        if checkpoint:
            from workloads.eval_lm import load_model

            self.model, meta = load_model(checkpoint)
            self.source = {"checkpoint": checkpoint, "step": meta.get("step")}
        else:
            cfg = ModelConfig.model_validate(dict(shape or {}))
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                self.model = ByteTransformer(cfg).eval()
            self.source = {"checkpoint": None, "init_seed": seed}
        self.config = self.model.config

    @torch.no_grad()
    def generate(self, prompt: str, *, max_new_tokens: int = 32, temperature: float = 0.0, seed: int = 0,
                 token_delay_s: float = 0.0) -> str:
        """``prompt`` continued by ``max_new_tokens`` bytes, decoded as UTF-8 (invalid bytes replaced)."""
        ids = list(prompt.encode("utf-8")) or [ord("\n")]
        rng = torch.Generator().manual_seed(seed) if temperature > 0 else None
        out = []
        ctx = self.config.context
        for _ in range(max_new_tokens):
            x = torch.tensor([ids[-ctx:]], dtype=torch.long)
            logits = self.model(x)[0][0, -1]
            if temperature > 0:
                probs = torch.softmax(logits / temperature, dim=-1)
                nxt = int(torch.multinomial(probs, 1, generator=rng).item())
            else:
                nxt = int(torch.argmax(logits).item())
            ids.append(nxt)
            out.append(nxt)
            if token_delay_s:
                time.sleep(token_delay_s)
        return bytes(b % 256 for b in out).decode("utf-8", errors="replace")


class BadRequest(ValueError):
    pass


def parse_request(body: Any, *, max_new_tokens: int, temperature: float) -> Dict[str, Any]:
    """Generation arguments from a request body, the server's defaults filling what it leaves out."""
    if not isinstance(body, Mapping):
        raise BadRequest("body: a JSON object with 'prompt' (and optionally max_new_tokens, temperature, seed)")
    unknown = set(body) - {"prompt", "max_new_tokens", "temperature", "seed"}
    if unknown:
        raise BadRequest(f"{sorted(unknown)[0]}: unknown field; allowed: prompt, max_new_tokens, temperature, seed")
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or len(prompt.encode("utf-8")) > MAX_PROMPT_BYTES:
        raise BadRequest(f"prompt: got {prompt!r:.60}; allowed: a string of at most {MAX_PROMPT_BYTES} bytes")
    n = body.get("max_new_tokens", max_new_tokens)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 4096:
        raise BadRequest(f"max_new_tokens: got {n!r}; allowed: an integer from 1 to 4096")
    t = body.get("temperature", temperature)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 10:
        raise BadRequest(f"temperature: got {t!r}; allowed: a number from 0 to 10")
    seed = body.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise BadRequest(f"seed: got {seed!r}; allowed: an integer")
    return {"prompt": prompt, "max_new_tokens": n, "temperature": float(t), "seed": seed}


class LMServerConfig(BaseModel):
    """The keyword arguments ``LMServer`` is constructed with (a serving spec's ``serve.model.args``).

    ``checkpoint``: a checkpoint directory of the LM (``workloads.checkpoint``: ``state.pt`` + ``meta.json``, e.g. a
    training run's ``checkpoint_*``); without one, each replica serves a freshly initialised model of ``shape``.
    ``max_new_tokens`` and ``temperature`` are the defaults a request may override. ``token_delay_ms``: on logical
    GPUs (no device), sleep this long per generated token to stand in for accelerator decode time."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    checkpoint: Optional[Annotated[str, Field(min_length=1)]] = None
    shape: Optional[ModelConfig] = None  # None: ModelConfig's defaults
    max_new_tokens: Annotated[int, Field(ge=1, le=4096)] = 32
    temperature: Annotated[float, Field(ge=0.0, le=10.0)] = 0.0
    token_delay_ms: Annotated[float, Field(ge=0.0, le=10_000.0)] = 0.0
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0

    @field_validator("checkpoint")
    @classmethod
    def _is_checkpoint(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not ckpt.is_checkpoint(v):
            raise ValueError(f"a checkpoint directory holding {ckpt.STATE_FILE} and {ckpt.META_FILE}, or null "
                             f"(a fresh model of shape)")
        return v


class LMServer:
    """The Ray Serve deployment of the LM: every replica is ``LMServer(**args)``, ``args`` fitting
    ``LMServerConfig``."""

    config_schema = LMServerConfig

    def __init__(self, checkpoint: Optional[str] = None, shape: Optional[Mapping[str, Any]] = None, *,
                 max_new_tokens: int = 32, temperature: float = 0.0, token_delay_ms: float = 0.0, seed: int = 0):
        self.gen = Generator(checkpoint, shape, seed=seed)
        self.defaults = {"max_new_tokens": max_new_tokens, "temperature": temperature}
        self.token_delay_s = token_delay_ms / 1000.0
        self._lock = threading.Lock()  # one generation at a time: the replica's device is busy
        self.replica = _replica_id()
        self.served = 0

    def _generate(self, args: Dict[str, Any]) -> Dict[str, Any]:
        with self._lock:
            t0 = time.perf_counter()
            text = self.gen.generate(args["prompt"], max_new_tokens=args["max_new_tokens"],
                                     temperature=args["temperature"], seed=args["seed"],
                                     token_delay_s=self.token_delay_s)
            self.served += 1
            return {"text": text, "prompt": args["prompt"], "new_tokens": args["max_new_tokens"],
                    "replica": self.replica, "service_ms": (time.perf_counter() - t0) * 1000.0}

    async def __call__(self, request):
        from starlette.responses import JSONResponse

        if request.method == "GET":
            return JSONResponse({"replica": self.replica, "model": self.gen.config.model_dump(),
                                 "source": self.gen.source, "served": self.served, **self.defaults})
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "body: not JSON; allowed: a JSON object with 'prompt'"}, status_code=400)
        try:
            args = parse_request(body, **self.defaults)
        except BadRequest as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse(await asyncio.to_thread(self._generate, args))


def _replica_id() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - outside a Serve replica (tests): no id
        return "local"
