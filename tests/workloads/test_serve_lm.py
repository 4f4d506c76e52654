"""The served LM without Ray: generation from a checkpoint or a fresh model, request parsing, the schema of its
constructor's arguments. Pure torch, seconds."""
from __future__ import annotations

import asyncio
import inspect
import json

import pydantic
import pytest

pytest.importorskip("torch")

from workloads.serve_lm import BadRequest, Generator, LMServer, LMServerConfig, parse_request  # noqa: E402
from workloads.train_lm import LocalHooks, train  # noqa: E402

SHAPE = {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    hooks = LocalHooks(root)
    train({"max_steps": 4, "checkpoint_every": 4, "batch_size": 4, "warmup_steps": 1, "eval_every": 0,
           "corpus": {"max_bytes": 50_000}, "model": SHAPE}, hooks=hooks)
    return hooks.latest_checkpoint()


def test_greedy_generation_from_a_checkpoint_is_deterministic(checkpoint):
    g = Generator(checkpoint)
    assert g.source["checkpoint"] == checkpoint and g.source["step"] == 4
    a = g.generate("def main(", max_new_tokens=12)
    assert a == Generator(checkpoint).generate("def main(", max_new_tokens=12)
    assert isinstance(a, str) and 0 < len(a.encode("utf-8", errors="replace")) <= 12 * 3


def test_sampling_is_seeded():
    g = Generator(shape=SHAPE)
    one = g.generate("x", max_new_tokens=16, temperature=1.0, seed=1)
    assert one == g.generate("x", max_new_tokens=16, temperature=1.0, seed=1)
    assert one != g.generate("x", max_new_tokens=16, temperature=1.0, seed=2)


def test_without_a_checkpoint_every_replica_serves_the_same_fresh_model():
    a, b = Generator(shape=SHAPE), Generator(shape=SHAPE)
    assert a.source == {"checkpoint": None, "init_seed": 0}
    assert a.generate("import ", max_new_tokens=8) == b.generate("import ", max_new_tokens=8)


def test_prompt_longer_than_the_context_keeps_its_tail():
    g = Generator(shape=SHAPE)
    assert len(g.generate("y" * 500, max_new_tokens=3).encode("utf-8", errors="replace")) >= 1


@pytest.mark.parametrize(
    "body, phrase",
    [
        ([], "JSON object"),
        ({}, "prompt: got None"),
        ({"prompt": 3}, "prompt: got 3"),
        ({"prompt": "a", "max_new_tokens": 0}, "max_new_tokens: got 0; allowed: an integer from 1 to 4096"),
        ({"prompt": "a", "max_new_tokens": True}, "max_new_tokens: got True"),
        ({"prompt": "a", "temperature": -1}, "temperature: got -1"),
        ({"prompt": "a", "seed": "x"}, "seed: got 'x'"),
        ({"prompt": "a", "top_k": 3}, "top_k: unknown field"),
    ],
)
def test_bad_requests_name_the_field(body, phrase):
    with pytest.raises(BadRequest, match=None) as info:
        parse_request(body, max_new_tokens=8, temperature=0.0)
    assert phrase in str(info.value)


def test_request_defaults_come_from_the_server():
    assert parse_request({"prompt": "a"}, max_new_tokens=8, temperature=0.5) == {
        "prompt": "a", "max_new_tokens": 8, "temperature": 0.5, "seed": 0}


class _Request:
    def __init__(self, method, body=None):
        self.method, self._body = method, body

    async def json(self):
        if isinstance(self._body, bytes):
            raise json.JSONDecodeError("bad", "", 0)
        return self._body


def test_server_answers_generation_info_and_bad_requests():
    pytest.importorskip("starlette")
    s = LMServer(shape=SHAPE, max_new_tokens=5)
    ok = asyncio.run(s(_Request("POST", {"prompt": "hello"})))
    assert ok.status_code == 200
    out = json.loads(ok.body)
    assert out["new_tokens"] == 5 and out["replica"] == "local" and out["prompt"] == "hello"
    info = json.loads(asyncio.run(s(_Request("GET"))).body)
    assert info["served"] == 1 and info["model"]["d_model"] == 32 and info["max_new_tokens"] == 5
    bad = asyncio.run(s(_Request("POST", {"prompt": "a", "max_new_tokens": -1})))
    assert bad.status_code == 400 and "max_new_tokens" in json.loads(bad.body)["error"]
    assert asyncio.run(s(_Request("POST", b"{"))).status_code == 400


def test_the_declared_schema_is_the_constructor_s_keyword_arguments():
    assert LMServer.config_schema is LMServerConfig
    params = dict(inspect.signature(LMServer).parameters)
    assert list(params) == list(LMServerConfig.model_fields)
    for name, p in params.items():
        assert p.default == LMServerConfig.model_fields[name].default, name


def test_the_schema_refuses_what_the_server_could_not_use(checkpoint, tmp_path):
    ok = {"checkpoint": checkpoint, "shape": SHAPE, "max_new_tokens": 8, "temperature": 0, "token_delay_ms": 0}
    assert LMServerConfig.model_validate(ok).checkpoint == checkpoint
    for bad in ({"checkpoint": str(tmp_path)}, {"shape": {"d_model": 30, "n_heads": 4}}, {"max_new_tokens": "8"},
                {"temperature": -1}, {"token_delay": 5}):
        with pytest.raises(pydantic.ValidationError):
            LMServerConfig.model_validate(bad)
    s = LMServer(**{k: v for k, v in ok.items() if k != "checkpoint"})
    assert s.defaults == {"max_new_tokens": 8, "temperature": 0}


def test_the_workload_does_not_import_the_platform():
    import workloads.serve_lm as mod

    source = inspect.getsource(mod)
    assert "import raylane" not in source and "from raylane" not in source
