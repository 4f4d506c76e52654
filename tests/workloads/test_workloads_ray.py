"""The Ray Train adapter of the reference workloads on a real local Ray: a 2-worker DDP gang checkpoints, yields
when its stop poll says so, and a second ``fit()`` with the same ``RunConfig(name, storage_path)`` resumes."""
from __future__ import annotations

import os

os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.2"

import uuid  # noqa: E402

import pytest  # noqa: E402
import ray  # noqa: E402
from ray.train import RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

from workloads.errors import ConfigError  # noqa: E402
from workloads import checkpoint as ckpt  # noqa: E402
from workloads.ray_train import check_config, train_loop_per_worker  # noqa: E402

TINY = {"max_steps": 6, "batch_size": 8, "checkpoint_every": 100, "model": {"d_model": 32, "n_layers": 1}}


@pytest.fixture(scope="module")
def ray_session():
    """A one-node cluster of 2 CPUs; its address."""
    from tests.raytest import start_cluster, stop_cluster

    cluster = start_cluster(gpu_nodes=(), head_cpus=2)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster.address
    finally:
        stop_cluster(cluster)


@pytest.mark.ray
def test_code_in_a_worker_that_looks_up_its_cluster_finds_its_own(ray_session):
    """Ray Train's PlacementGroupCleaner asks ``ray.util.state`` whether the controller lives, at the address Ray
    resolves inside the worker. Left to the machine's ``ray_current_cluster`` file, that is whichever cluster wrote it
    last (another test module's), which does not know the controller: the cleaner then removed a live run's
    placement group. Every test cluster's processes are told their own address."""
    @ray.remote(num_cpus=0)
    def resolved() -> str:
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address(None)

    assert ray.get(resolved.remote()) == ray_session


def test_check_config_reports_adapter_and_training_errors_together():
    with pytest.raises(ConfigError) as info:
        check_config({**TINY, "stop_poll": "not callable", "report_every": -1, "lr": -1.0})
    assert sorted(p for p, _, _ in info.value.errors) == ["lr", "report_every", "stop_poll"]


def test_the_declared_schema_refuses_what_check_config_refuses():
    import pydantic

    from workloads.ray_train import RayTrainConfig

    assert train_loop_per_worker.config_schema is RayTrainConfig
    RayTrainConfig.model_validate({**TINY, "report_every": 5, "yield_on_preemption": False})
    for bad in ({"max_steps": "日本語"}, {"model": {"n_layers": -1}}, {"lr": 1e18}, {"checkpoint_every": float("nan")},
                {"report_every": -1}, {"unknown": 1}):
        with pytest.raises(pydantic.ValidationError):
            RayTrainConfig.model_validate({**TINY, **bad})
        with pytest.raises(ConfigError):
            check_config({**TINY, **bad})


@pytest.mark.slow
@pytest.mark.ray
def test_torch_trainer_checkpoints_yields_and_resumes(ray_session, tmp_path):
    class StopAfterPolls:  # defined here so that cloudpickle ships it by value to the rank-0 worker
        def __init__(self, polls: int):
            self.polls, self.calls = polls, 0

        def __call__(self) -> bool:
            self.calls += 1
            return self.calls > self.polls

    run_config = RunConfig(name=f"workloads-{uuid.uuid4().hex[:8]}", storage_path=str(tmp_path))

    def fit(config):
        return TorchTrainer(
            train_loop_per_worker,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=run_config,
        ).fit()

    first = fit({**TINY, "stop_poll": StopAfterPolls(3), "yield_on_preemption": False})
    assert first.error is None
    assert first.return_value["status"] == "yielded" and first.return_value["step"] == 3
    assert first.checkpoint is not None
    with first.checkpoint.as_directory() as d:
        assert ckpt.is_checkpoint(d) and ckpt.read_meta(d)["step"] == 3
    m = first.metrics
    assert m["step"] == 3 and m["samples_per_s"] == pytest.approx(2 * 8 / m["step_time_s"])  # a gang of two

    second = fit(TINY)
    assert second.error is None
    assert second.return_value["status"] == "finished"
    assert (second.return_value["resumed_from_step"], second.return_value["step"]) == (3, 6)
    with second.checkpoint.as_directory() as d:
        assert ckpt.read_meta(d)["step"] == 6
