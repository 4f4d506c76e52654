"""A spec's ``datasets:`` end to end: Ray's own regression example (``ray.train.examples.pytorch.
torch_regression_example:train_func``, unchanged, from the Ray wheel) submitted as a plain Ray job with
examples/user-code/ray-regression as its working directory; its two local parquet files reach the loop as the
"train" (split among the 2 workers) and "validation" datasets, and it finishes with one loss per epoch in its
MLflow run. One cluster for the module (tests/jobtest.py)."""
import math
from pathlib import Path

import pytest
import yaml

ray = pytest.importorskip("ray")

from raylane.control.client import State  # noqa: E402
from tests.jobtest import finished, metric_history, module_env, record_of_job, submit_job  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.e2e]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "user-code" / "ray-regression"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    yield from module_env(tmp_path_factory, "datasets")


def test_rays_regression_example_trains_on_the_specs_local_datasets(env):
    s = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
    epochs = 2
    s["config"] = {**s["config"], "epochs": epochs, "batch_size": 32}
    job = submit_job(env, s, "ray-regression", working_dir=EXAMPLE)
    assert str(finished(env, job, timeout=300)).endswith("SUCCEEDED")
    rec = env["ctl"].explain(record_of_job(env, job).id)
    assert rec.state is State.SUCCEEDED and rec["restarts"] == 0, rec["journal"]
    run, hist = metric_history(env, rec.id, "loss")
    # Rank 0's validation loss (an L1 loss over the 64 validation rows), once per epoch.
    assert len(hist) == epochs and [s for s, _ in hist] == sorted({s for s, _ in hist}), hist
    assert all(math.isfinite(v) and v > 0 for _, v in hist), hist
    assert run.info.status == "FINISHED"
