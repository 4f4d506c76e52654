"""Script mode with the frameworks (issue 45, item 3): a Lightning script as Ray's Lightning page writes it and a
Transformers script as Ray's Transformers page writes it, each run unchanged as
``python -m raylane.run --team T --class C script.py`` (a Ray job, its project folder the working dir, as
tests/script/test_script_mode.py submits it). Their ``trainer.fit()`` becomes a Raylane workload; the script gets
back the ``ray.train.Result`` and prints its metrics; the workload SUCCEEDED and its MLflow run is FINISHED.

Tiny models on synthetic local data (nothing downloaded), two workers of one logical GPU each, a few steps. One cluster
for the module (tests/jobtest.py). The model and data code follow tests/launchers/test_frameworks_e2e.py's examples
(examples/user-code/lightning-digits, transformers-gpt2), including their one concession to a cluster of logical GPUs
with a CPU build of torch: the Lightning strategy's device and Accelerate's device fall back to the CPU."""
from __future__ import annotations

import json
import re
import shlex
import sys
import textwrap

import pytest

pytest.importorskip("ray")
pytest.importorskip("lightning")
pytest.importorskip("transformers")

from tests.jobtest import finished, mlflow_run, module_env  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.e2e]

# Ray's Lightning page, on synthetic data: 64 samples, 16 per batch, 2 workers -> 2 steps an epoch, 2 epochs.
LIGHTNING_SCRIPT = textwrap.dedent('''
    import json

    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import ray.train.lightning
    from ray.train import RunConfig, ScalingConfig
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback
    from ray.train.torch import TorchTrainer


    class Regressor(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)


    class Strategy(RayDDPStrategy):
        """RayDDPStrategy, on the CPU where torch has no CUDA (a cluster of logical GPUs)."""

        @property
        def root_device(self):
            return super().root_device if torch.cuda.is_available() else torch.device("cpu")


    def train_func():
        torch.manual_seed(0)
        x = torch.randn(64, 4)
        y = x.sum(dim=1, keepdim=True)
        loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
        trainer = pl.Trainer(
            max_epochs=2,
            devices="auto",
            accelerator="auto",
            strategy=Strategy(),
            plugins=[RayLightningEnvironment()],
            callbacks=[RayTrainReportCallback()],
            enable_checkpointing=False,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer = ray.train.lightning.prepare_trainer(trainer)
        trainer.fit(Regressor(), train_dataloaders=loader)


    if __name__ == "__main__":
        trainer = TorchTrainer(
            train_func,
            scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
            run_config=RunConfig(name="lightning-script"),
        )
        result = trainer.fit()
        print("RESULT " + json.dumps({"metrics": result.metrics, "checkpoint": result.checkpoint is not None}),
              flush=True)
''')

# Ray's Transformers page, with a two-layer GPT-2 built from a config and random tokens: 64 blocks of 16 tokens,
# 4 per batch on each of 2 workers, 4 steps, a save (a report to Ray) every 2.
TRANSFORMERS_SCRIPT = textwrap.dedent('''
    import json
    import os
    import tempfile

    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    import ray.train.huggingface.transformers
    from ray.train import RunConfig, ScalingConfig
    from ray.train.huggingface.transformers import RayTrainReportCallback
    from ray.train.torch import TorchTrainer


    class Tokens(torch.utils.data.Dataset):
        def __init__(self):
            self.ids = torch.randint(0, 64, (64, 16), generator=torch.Generator().manual_seed(0))

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


    def train_func():
        if not torch.cuda.is_available():  # a cluster of logical GPUs: Accelerate stays on the CPU
            os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"
        model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2))
        args = TrainingArguments(
            output_dir=tempfile.mkdtemp(prefix="hf-script-"),
            max_steps=4,
            per_device_train_batch_size=4,
            logging_strategy="steps",
            logging_steps=2,
            save_strategy="steps",
            save_steps=2,
            report_to="none",
            disable_tqdm=True,
            use_cpu=not torch.cuda.is_available(),
        )
        trainer = Trainer(model=model, args=args, train_dataset=Tokens())
        trainer.add_callback(RayTrainReportCallback())
        trainer = ray.train.huggingface.transformers.prepare_trainer(trainer)
        trainer.train()


    if __name__ == "__main__":
        trainer = TorchTrainer(
            train_func,
            scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
            run_config=RunConfig(name="transformers-script"),
        )
        result = trainer.fit()
        print("RESULT " + json.dumps({"metrics": result.metrics, "checkpoint": result.checkpoint is not None}),
              flush=True)
''')


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    yield from module_env(tmp_path_factory, "script-frameworks")


def run_script(env, project, script: str, text: str):
    """Write ``text`` to ``project/script`` and submit it unchanged as a script-mode job; wait for it to end.
    Returns (job status, its logs, the one workload its driver submitted, as the control plane shows it)."""
    from raylane.jobs import submit_job, with_credential
    from tests.jobtest import job_env, operator_token

    (project / script).write_text(text)
    runtime_env = with_credential({"env_vars": job_env(env), "working_dir": str(project)}, operator_token(env))
    entry = (f"{sys.executable} -m raylane.run --storage-path {env['storage']} --tracking-uri {env['uri']} "
             f"--team team-a --class pretrain {shlex.quote(script)}")
    job = submit_job(env["client"], entrypoint=entry, runtime_env=runtime_env)
    env["jobs"].append(job)
    status = finished(env, job, timeout=420)
    logs = env["client"].get_job_logs(job)
    ids = re.findall(rf"workload (\S+) submitted \(job {re.escape(job)}\)", logs)
    assert len(ids) == 1, logs[-4000:]
    return status, logs, env["ctl"].explain(ids[0])


def result_of(logs: str) -> dict:
    (line,) = re.findall(r"^RESULT (.*)$", logs, re.M) or [None]
    assert line is not None, logs[-4000:]
    return json.loads(line)


def test_a_lightning_script_from_rays_page_runs_unchanged_in_script_mode(env, tmp_path):
    status, logs, wl = run_script(env, tmp_path, "train_lightning.py", LIGHTNING_SCRIPT)
    assert str(status).endswith("SUCCEEDED"), logs[-4000:]
    result = result_of(logs)
    # RayTrainReportCallback reports at each epoch's end: the last report is epoch 1 (the second), step 4.
    assert (result["metrics"]["epoch"], result["metrics"]["step"], result["checkpoint"]) == (1, 4, True), result
    assert result["metrics"]["train_loss"] >= 0
    assert wl["spec"]["name"] == "lightning-script" and wl["state"] == "SUCCEEDED"
    assert (wl["team"], wl["class"], wl["spec"]["gang"]["workers"]) == ("team-a", "pretrain", 2)
    assert mlflow_run(env, wl["id"]).info.status == "FINISHED"


def test_a_transformers_script_from_rays_page_runs_unchanged_in_script_mode(env, tmp_path):
    status, logs, wl = run_script(env, tmp_path, "train_transformers.py", TRANSFORMERS_SCRIPT)
    assert str(status).endswith("SUCCEEDED"), logs[-4000:]
    result = result_of(logs)
    # RayTrainReportCallback reports at each save (steps 2 and 4) with the logged loss.
    assert (result["metrics"]["step"], result["checkpoint"]) == (4, True), result
    assert result["metrics"]["loss"] > 0
    assert wl["spec"]["name"] == "transformers-script" and wl["state"] == "SUCCEEDED"
    assert (wl["team"], wl["class"], wl["spec"]["gang"]["workers"]) == ("team-a", "pretrain", 2)
    assert mlflow_run(env, wl["id"]).info.status == "FINISHED"
