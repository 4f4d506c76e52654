"""The user-code examples (examples/user-code/*): each is a project a user copies, with a spec that
``raylane spec check`` accepts and a README giving its plain ``ray job submit --working-dir`` line; the framework
examples' config schemas refuse bad configs at submit, their entrypoint modules import nothing heavy (a spec check
stays instant), and the digits CNN's checkpoint format is what its README says. No Ray (the end-to-end runs are in
test_frameworks_e2e.py)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from raylane import entrypoints
from raylane.errors import ValidationError

REPO = Path(__file__).resolve().parents[2]
USER_CODE = REPO / "examples" / "user-code"
EXAMPLES = sorted(p.name for p in USER_CODE.iterdir() if (p / "spec.yaml").is_file())
# The framework examples of this module: folder -> entrypoint module.
FRAMEWORKS = {"digits-cnn": "digits_cnn", "lightning-digits": "lightning_digits", "transformers-gpt2": "gpt2_bytes"}


@pytest.fixture
def isolated_imports():
    """Forget the modules an example brought in, so examples with modules of the same name cannot mix."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        mod = sys.modules.get(name)
        if str(getattr(mod, "__file__", "") or "").startswith(str(USER_CODE)):
            del sys.modules[name]


def test_the_framework_examples_are_there():
    assert set(FRAMEWORKS) <= set(EXAMPLES), EXAMPLES


@pytest.mark.parametrize("name", EXAMPLES)
def test_raylane_spec_check_accepts_the_example(name, isolated_imports, tmp_path):
    from typer.testing import CliRunner

    from raylane.cli import app

    folder = USER_CODE / name
    if (folder / "make_input.py").exists():  # the README's first step: the job's input, in a copy of the folder
        import shutil
        import subprocess

        copy = tmp_path / name
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("__pycache__"))
        refused = CliRunner().invoke(app, ["spec", "check", str(copy / "spec.yaml"), "--working-dir", str(copy),
                                           "--policy", str(REPO / "policies" / "local.yaml")])
        assert refused.exit_code == 1 and "config.input" in refused.output, refused.output  # no input yet
        subprocess.run([sys.executable, str(copy / "make_input.py")], check=True, cwd=copy)
        folder = copy
    out = CliRunner().invoke(app, ["spec", "check", str(folder / "spec.yaml"), "--working-dir", str(folder),
                                   "--policy", str(REPO / "policies" / "local.yaml")])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("OK "), out.output


@pytest.mark.parametrize("name", EXAMPLES)
def test_readme_gives_the_plain_ray_job_submit_line(name):
    readme = (USER_CODE / name / "README.md").read_text()
    assert (f"ray job submit --working-dir examples/user-code/{name} \\\n"
            f"    --runtime-env-json \"{{\\\"py_modules\\\": [\\\"$(raylane token for-job)\\\"]}}\" -- "
            f"python -m raylane.run spec.yaml") in readme
    assert "RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=~/.raylane/ray_auth_token" in readme


@pytest.mark.parametrize("name,config,field", [
    ("digits-cnn", {"lr": -1.0}, "config.lr"),
    ("digits-cnn", {"epochs": 3}, "config.epochs"),
    ("lightning-digits", {"max_epochs": 0}, "config.max_epochs"),
    ("lightning-digits", {"max_steps": 10}, "config.max_steps"),
    ("transformers-gpt2", {"save_steps": 20, "log_every": 7}, "config.log_every"),
    ("transformers-gpt2", {"n_embd": 30, "n_head": 4}, "config.n_head"),
])
def test_a_bad_config_is_refused_naming_the_field_and_value(name, config, field, isolated_imports):
    folder = USER_CODE / name
    s = yaml.safe_load((folder / "spec.yaml").read_text())
    s["config"] = {**s["config"], **config}
    with pytest.raises(ValidationError) as err:
        entrypoints.check_spec(s, working_dir=str(folder))
    assert [(f, v) for f, v, _ in err.value.errors] == [(field, config[field.split(".")[1]])], err.value.errors


def test_platform_keys_are_not_the_schemas_business(isolated_imports):
    # A drill or a storage path in a spec's config is read by Raylane and never reaches the user's schema.
    folder = USER_CODE / "lightning-digits"
    s = yaml.safe_load((folder / "spec.yaml").read_text())
    s["config"] = {**s["config"], "fault": {"hold_at_step": 22}, "storage_path": "/tmp/x"}
    assert entrypoints.check_spec(s, working_dir=str(folder)) is not None


def test_entrypoint_modules_import_nothing_heavy():
    # Submission and `raylane spec check` import the entrypoint module: torch, Ray, Lightning and Transformers are
    # imported inside the loop, on the workers.
    code = ("import sys\n"
            f"for folder, mod in {sorted(FRAMEWORKS.items())!r}:\n"
            f"    sys.path.insert(0, {str(USER_CODE)!r} + '/' + folder)\n"
            "    __import__(mod)\n"
            "heavy = sorted(m for m in ('torch', 'ray', 'lightning', 'transformers', 'sklearn') if m in sys.modules)\n"
            "print(','.join(heavy) or 'none')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "none"


def test_digits_checkpoint_is_what_the_readme_says(tmp_path, isolated_imports):
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(USER_CODE / "digits-cnn"))
    try:
        import digits_cnn
    finally:
        sys.path.remove(str(USER_CODE / "digits-cnn"))
    cfg = digits_cnn.DigitsConfig(channels=4, hidden=8)
    model = digits_cnn.build_model(cfg.channels, cfg.hidden)
    opt = torch.optim.Adam(model.parameters())
    digits_cnn._save(str(tmp_path), model, opt, 7, cfg, 0.5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json", "model.pt", "train_state.pt"]
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["step"] == 7 and meta["model"] == {"channels": 4, "hidden": 8} and meta["classes"] == 10
    assert torch.load(tmp_path / "train_state.pt")["step"] == 7
    x, y = digits_cnn.digits_split("test")
    assert x.shape == (360, 1, 8, 8) and str(x.dtype) == "float32" and x.max() <= 1.0 and len(y) == 360
    loaded = digits_cnn.load_checkpoint_model(str(tmp_path))
    with torch.no_grad():
        assert torch.equal(loaded(torch.from_numpy(x[:5])), model.eval()(torch.from_numpy(x[:5])))


def test_gpt2_corpus_is_made_here_and_the_same_each_time(isolated_imports):
    pytest.importorskip("torch")
    sys.path.insert(0, str(USER_CODE / "transformers-gpt2"))
    try:
        import gpt2_bytes
    finally:
        sys.path.remove(str(USER_CODE / "transformers-gpt2"))
    data = gpt2_bytes.docstring_corpus(20_000)
    assert len(data) == 20_000 and data == gpt2_bytes.docstring_corpus(20_000)
    blocks = gpt2_bytes.ByteBlocks(data, 64)
    item = blocks[3]
    assert len(blocks) == 20_000 // 63 and item["input_ids"].shape == (64,)
    assert int(item["input_ids"][0]) == gpt2_bytes.BOS and int(item["input_ids"].max()) < gpt2_bytes.VOCAB
    assert bytes(item["input_ids"][1:].tolist()) == data[3 * 63:4 * 63]


RAY_DOCS = USER_CODE / "ray-docs"


@pytest.mark.parametrize("spec_file", sorted(p.name for p in RAY_DOCS.glob("*.yaml")))
def test_raylane_spec_check_accepts_rays_docs_examples(spec_file, isolated_imports):
    from typer.testing import CliRunner

    from raylane.cli import app

    out = CliRunner().invoke(app, ["spec", "check", str(RAY_DOCS / spec_file), "--working-dir", str(RAY_DOCS),
                                   "--policy", str(REPO / "policies" / "local.yaml")])
    assert out.exit_code == 0 and out.output.startswith("OK "), out.output
