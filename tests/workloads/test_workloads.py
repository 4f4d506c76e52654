"""The reference workloads, pure torch (no Ray): the corpus, the loop's learning, resume, fine-tuning, evaluation,
config errors. Sized to run in well under a minute on two CPU cores."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
import torch

from workloads.errors import ConfigError
from workloads import checkpoint as ckpt
from workloads.data import batch_at, build_corpus, global_batch_at, loss_scale, rank_slice
from workloads.eval_lm import evaluate
from workloads.model import ByteTransformer, ModelConfig
from workloads.train_lm import ForwardingHooks, LocalHooks, TrainHooks, finetune_config, parse_config, train

# One thread (robust on a shared box), ~20 ms a step, big enough that the loss falls well within 100 steps.
SMALL = {"batch_size": 16, "num_threads": 1, "model": {"d_model": 64}, "checkpoint_every": 50}
LN_256 = math.log(256)  # the loss of a model that knows nothing about bytes


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> LocalHooks:
    hooks = LocalHooks(tmp_path_factory.mktemp("pretrain"))
    result = train({**SMALL, "max_steps": 100}, hooks=hooks)
    assert (result.status, result.step) == ("finished", 100)
    return hooks


# --- data ------------------------------------------------------------------------------------------------------


def test_corpus_is_bounded_deterministic_and_identified_by_its_files():
    a = build_corpus(max_bytes=50_000)
    b = build_corpus(max_bytes=60_000)
    email = build_corpus(subdir="email", max_bytes=50_000)
    assert a.num_bytes == 50_000 and list(a.files) == sorted(a.files)
    assert not any(part in {"site-packages", "test"} for f in a.files for part in Path(f).parts)
    assert torch.equal(torch.cat([a.train, a.val]), torch.cat([b.train, b.val])[:50_000])
    assert all(f.startswith("email/") for f in email.files)
    assert len({a.snapshot_id, b.snapshot_id, email.snapshot_id}) == 3
    assert a.val.numel() == 5_000  # val_fraction 0.1 of the bytes, taken from the end


def test_batch_is_a_pure_function_of_seed_and_step_and_ranks_take_disjoint_slices():
    data = build_corpus(max_bytes=50_000).train
    x1, y1 = batch_at(data, seed=1, step=7, batch_size=4, context=16)
    x2, _ = batch_at(data, seed=1, step=7, batch_size=4, context=16)
    x3, _ = batch_at(data, seed=1, step=8, batch_size=4, context=16)
    assert torch.equal(x1, x2) and not torch.equal(x1, x3)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the inputs shifted by one byte
    r0, _ = batch_at(data, seed=1, step=7, batch_size=2, context=16, rank=0, world_size=2)
    r1, _ = batch_at(data, seed=1, step=7, batch_size=2, context=16, rank=1, world_size=2)
    assert torch.equal(torch.cat([r0, r1]), x1)  # the global batch does not depend on how it is split


def test_a_fixed_global_batch_is_partitioned_over_any_worker_count():
    data = build_corpus(max_bytes=50_000).train
    (whole, whole_y) = global_batch_at(data, seed=3, step=11, global_batch=8, context=16)
    assert whole.shape == (8, 16)
    for world in range(1, 6):
        parts = [global_batch_at(data, seed=3, step=11, global_batch=8, context=16, rank=r, world_size=world)
                 for r in range(world)]
        sizes = [x.shape[0] for x, _ in parts]
        assert sizes == [hi - lo for lo, hi in (rank_slice(8, r, world) for r in range(world))]
        assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1  # uneven by at most one window (3 ranks: 2, 3, 3)
        assert torch.equal(torch.cat([x for x, _ in parts]), whole)
        assert torch.equal(torch.cat([y for _, y in parts]), whole_y)
    assert [x.shape[0] for x, _ in (global_batch_at(data, seed=3, step=11, global_batch=8, context=16, rank=r,
                                                    world_size=3) for r in range(3))] == [2, 3, 3]
    # Even split with global_batch = batch_size x world_size: exactly batch_at's batches.
    for world in (1, 2, 4):
        for r in range(world):
            x, y = global_batch_at(data, seed=3, step=11, global_batch=8, context=16, rank=r, world_size=world)
            bx, by = batch_at(data, seed=3, step=11, batch_size=8 // world, context=16, rank=r, world_size=world)
            assert torch.equal(x, bx) and torch.equal(y, by)
            assert loss_scale(8, r, world) == 1.0
    with pytest.raises(ValueError, match=r"global_batch: got 2; allowed: an integer >= the worker count \(3\)"):
        rank_slice(2, 0, 3)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_scaled_rank_gradients_average_to_the_gradient_of_the_global_mean_loss(world):
    # What DDP does: every rank backs up loss * loss_scale on its part, the gradients are averaged over the ranks.
    data = build_corpus(max_bytes=50_000).train
    torch.manual_seed(0)
    model = ByteTransformer(ModelConfig(context=16, d_model=16, n_layers=1, n_heads=2))
    x, y = global_batch_at(data, seed=5, step=2, global_batch=8, context=16)
    model.zero_grad()
    model(x, y)[1].backward()
    want = [p.grad.clone() for p in model.parameters()]
    got = [torch.zeros_like(p) for p in model.parameters()]
    for r in range(world):
        xr, yr = global_batch_at(data, seed=5, step=2, global_batch=8, context=16, rank=r, world_size=world)
        model.zero_grad()
        (model(xr, yr)[1] * loss_scale(8, r, world)).backward()
        for g, p in zip(got, model.parameters()):
            g += p.grad / world
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    if world == 3:  # uneven (2, 3, 3 windows): the plain, unscaled average would be off
        plain = [torch.zeros_like(p) for p in model.parameters()]
        for r in range(world):
            xr, yr = global_batch_at(data, seed=5, step=2, global_batch=8, context=16, rank=r, world_size=world)
            model.zero_grad()
            model(xr, yr)[1].backward()
            for g, p in zip(plain, model.parameters()):
                g += p.grad / world
        assert not all(torch.allclose(g, w, rtol=1e-5, atol=1e-6) for g, w in zip(plain, want))


def test_global_batch_on_one_worker_trains_as_batch_size_and_refuses_fewer_windows_than_workers(tmp_path):
    plain, fixed = LocalHooks(tmp_path / "plain"), LocalHooks(tmp_path / "fixed")
    train({**SMALL, "max_steps": 3}, hooks=plain)
    # batch_size is ignored once global_batch is set.
    train({**SMALL, "batch_size": 5, "global_batch": SMALL["batch_size"], "max_steps": 3}, hooks=fixed)
    assert plain.losses() == fixed.losses()
    # Throughput counts the global batch, not batch_size.
    assert all(m["samples_per_s"] * m["step_time_s"] == pytest.approx(16) for _, m in fixed.reports)

    class Three(TrainHooks):
        world_rank, world_size = 0, 3

    with pytest.raises(ConfigError) as info:
        train({**SMALL, "global_batch": 2, "max_steps": 1}, hooks=Three())
    assert info.value.errors == [("global_batch", 2, "an integer >= the worker count (3)")]
    with pytest.raises(ConfigError) as info:
        parse_config({"global_batch": 0})
    assert info.value.errors[0][:2] == ("global_batch", 0)


# --- training --------------------------------------------------------------------------------------------------


def test_loss_falls_over_100_steps(pretrained):
    losses = pretrained.losses()
    assert sorted(losses) == list(range(1, 101))
    first = statistics.mean(losses[s] for s in range(1, 11))
    last = statistics.mean(losses[s] for s in range(91, 101))
    assert first > LN_256 - 1.0 and last < first - 1.5, (first, last)
    metrics = pretrained.reports[-1][1]
    assert {"loss", "lr", "step_time_s", "samples_per_s"} <= set(metrics)
    assert metrics["samples_per_s"] == pytest.approx(16 / metrics["step_time_s"])
    lrs = [m["lr"] for _, m in pretrained.reports]
    assert lrs[0] < lrs[19] == pytest.approx(3e-3) and lrs[-1] < lrs[19] / 5  # warmup, then cosine decay
    assert pretrained.saved_steps == [50, 100]


@pytest.mark.parametrize("stop_at", [13, 15], ids=["between-checkpoints", "on-a-checkpoint"])
def test_resumed_run_equals_uninterrupted_run(tmp_path, stop_at):
    # Dropout on, so the resumed run only matches if the RNG state came back too.
    cfg = {**SMALL, "max_steps": 2 * stop_at, "seed": 3, "checkpoint_every": 5,
           "model": {"d_model": 64, "dropout": 0.1}}
    straight = LocalHooks(tmp_path / "straight")
    train(cfg, hooks=straight)

    first = LocalHooks(tmp_path / "interrupted", stop_at_step=stop_at)
    yielded = train(cfg, hooks=first)
    assert (yielded.status, yielded.step) == ("yielded", stop_at)
    assert first.saved_steps == sorted({5, 10, 15} & set(range(stop_at + 1)) | {stop_at})  # no duplicate save

    second = LocalHooks(tmp_path / "interrupted")
    finished = train(cfg, hooks=second)
    assert (finished.status, finished.step, finished.resumed_from_step) == ("finished", 2 * stop_at, stop_at)
    after = range(stop_at + 1, 2 * stop_at + 1)
    assert [s for s, _ in second.reports] == list(after)
    for s in after:
        assert second.losses()[s] == straight.losses()[s], f"loss differs at step {s}"
        assert dict(second.reports)[s]["lr"] == dict(straight.reports)[s]["lr"]
    end_a = ckpt.read_state(straight.latest_checkpoint())["model"]
    end_b = ckpt.read_state(second.latest_checkpoint())["model"]
    assert all(torch.equal(end_a[k], end_b[k]) for k in end_a)


def test_resume_under_a_changed_data_order_warns(tmp_path, caplog):
    train({**SMALL, "max_steps": 2}, hooks=LocalHooks(tmp_path))
    with caplog.at_level("WARNING", logger="workloads.train_lm"):
        result = train({**SMALL, "max_steps": 4, "seed": 1}, hooks=LocalHooks(tmp_path))
    assert result.resumed_from_step == 2
    assert "seed" in caplog.text and "max_steps" in caplog.text and "batch_size" not in caplog.text


def test_finetune_from_pretrain_checkpoint_lowers_val_loss_on_its_corpus(pretrained, tmp_path):
    pre = pretrained.latest_checkpoint()
    before = evaluate(pre, corpus={"subdir": "email"})
    hooks = LocalHooks(tmp_path)
    result = train(finetune_config(pre, max_steps=60, batch_size=16, num_threads=1), hooks=hooks)
    after = evaluate(hooks.latest_checkpoint())
    assert after["val_loss"] < before["val_loss"] - 0.05, (before, after)

    meta = ckpt.read_meta(hooks.latest_checkpoint())
    assert meta["init_from"] == pre and meta["train"]["corpus"]["subdir"] == "email"
    assert result.data_snapshot != ckpt.read_meta(pre)["data_snapshot"]
    assert hooks.reports[0][1]["loss"] < LN_256 - 1.0  # starts from the pretrained weights, not from scratch
    assert hooks.reports[0][1]["lr"] == pytest.approx(3e-4 / 10)  # fresh schedule: first warmup step, smaller LR
    assert ckpt.read_state(hooks.latest_checkpoint())["scheduler"]["last_epoch"] == 60


def test_finetune_refuses_a_model_shape_other_than_its_checkpoints(pretrained, tmp_path):
    with pytest.raises(ConfigError, match="model"):
        train(finetune_config(pretrained.latest_checkpoint(), model={"d_model": 32}), hooks=LocalHooks(tmp_path))


def test_forwarding_hooks_wrap_a_runner(tmp_path):
    seen = []

    class Recording(ForwardingHooks):
        def report(self, step, metrics):
            seen.append(step)
            super().report(step, metrics)

    inner = LocalHooks(tmp_path)
    train({**SMALL, "max_steps": 3}, hooks=Recording(inner))
    assert seen == [1, 2, 3] and [s for s, _ in inner.reports] == [1, 2, 3] and inner.saved_steps == [3]


# --- evaluation ------------------------------------------------------------------------------------------------


def test_eval_reports_perplexity_as_exp_of_val_loss(pretrained):
    out = evaluate(pretrained.latest_checkpoint(), batches=4)
    assert set(out) == {"val_loss", "perplexity"}
    assert out["perplexity"] == pytest.approx(math.exp(out["val_loss"]), rel=1e-12)
    assert out["val_loss"] < LN_256 - 1.0
    assert evaluate(pretrained.latest_checkpoint(), batches=4) == out  # a fixed evaluation set


# --- config errors ---------------------------------------------------------------------------------------------

BAD_CONFIGS = [
    # name, config, path of the error, value, a phrase of what is allowed
    ("unknown key", {"max_step": 10}, "max_step", 10, "allowed keys: batch_size"),
    ("lr not positive", {"lr": -1.0}, "lr", -1.0, "a number > 0.0 and <= 1.0"),
    ("lr as a string", {"lr": "0.1"}, "lr", "0.1", "a number"),
    ("zero batch", {"batch_size": 0}, "batch_size", 0, "an integer >= 1 and <= 4096"),
    ("bool for an int", {"max_steps": True}, "max_steps", True, "an integer >= 1"),
    ("negative seed", {"seed": -1}, "seed", -1, "an integer >= 0"),
    ("heads do not divide width", {"model": {"d_model": 66}}, "model", {"d_model": 66}, "multiple of n_heads"),
    ("unknown model key", {"model": {"width": 3}}, "model.width", 3, "allowed keys: context, d_model"),
    ("init_from not a checkpoint", {"init_from": "/nonexistent"}, "init_from", "/nonexistent", "state.pt"),
    ("subdir outside the stdlib", {"corpus": {"subdir": "../etc"}}, "corpus.subdir", "../etc", "under the stdlib"),
    ("grad_clip zero", {"grad_clip": 0.0}, "grad_clip", 0.0, "null or a number > 0.0"),
]


@pytest.mark.parametrize("config,path,value,allowed", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_names_key_value_and_what_is_allowed(config, path, value, allowed):
    with pytest.raises(ConfigError) as info:
        train(config, hooks=LocalHooks("/nonexistent-never-written"))
    [(got_path, got_value, got_allowed)] = info.value.errors
    assert (got_path, got_value) == (path, value)
    assert allowed in got_allowed and allowed in str(info.value)


def test_every_config_error_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        parse_config({"lr": 0.0, "batch_size": "8", "bogus": 1, "corpus": {"val_fraction": 0.9}})
    assert sorted(p for p, _, _ in info.value.errors) == ["batch_size", "bogus", "corpus.val_fraction", "lr"]

