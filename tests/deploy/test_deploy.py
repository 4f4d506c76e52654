"""The deployment files of deploy/ stay usable and in step with the code they deploy: they parse, the cluster files
load, node labels follow the feature-label convention of ``raylane.localcluster.node_labels``, every metric the
rules and the dashboard name exists in ``raylane.metrics``, and promtool accepts the rules and passes their unit
tests. Pure and fast: no Ray cluster is started.

promtool comes from ``deploy/prometheus/install_promtool.sh``; without it the promtool tests are skipped, except
under CI (``CI`` set), where they fail: a CI run must not pass without checking the rules.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest
import yaml

from raylane import metrics
from raylane.config.cluster import NodeGroup, load_cluster
from raylane.config.loader import load_policy, load_spec
from raylane.localcluster import node_labels

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROM = DEPLOY / "prometheus"
RULE_FILES = [PROM / "raylane_rules.yml", PROM / "raylane_targets.yml"]
DASHBOARD = DEPLOY / "grafana" / "raylane-dashboard.json"
LAUNCHER = DEPLOY / "ray-cluster-launcher" / "cluster.yaml"
KUBERAY = DEPLOY / "kuberay" / "raycluster.yaml"
RAYJOB = DEPLOY / "kuberay" / "rayjob-pretrain.yaml"
AUTOSCALING = DEPLOY / "clusters" / "autoscaling.yaml"  # the growable groups of the KubeRay and launcher clusters
IMAGE_REPO = "/home/ray/raylane"  # where the launcher's file_mounts and the Docker image put this checkout

FEATURE_PREFIX = "feature.raylane.io/"
NODE_TYPE = "raylane.io/node-type"

METRICS = {m.name: m for m in metrics.ALL}
# Ray's own metrics that the dashboard plots beside Raylane's (and that a rule test uses as "Ray is scraped"), with
# the labels used; each is checked to be one that the installed Ray's dashboards use too.
RAY_NATIVE = {"ray_serve_http_request_latency_ms": {"application", "le"}, "ray_node_cpu_utilization": set()}
# Labels Ray's metrics agent and the scrape add to every series.
RAY_LABELS = {"SessionName", "NodeAddress", "Component", "instance", "job", "ray_io_cluster"}


def _yaml_docs(path: Path) -> List[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


# ------------------------------------------------------------------------------------------------ every file parses


def _data_files() -> List[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml", ".json") and p.is_file())


@pytest.mark.parametrize("path", _data_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_and_json_file_parses(path):
    if path.suffix == ".json":
        assert isinstance(json.loads(path.read_text()), dict)
    else:
        assert _yaml_docs(path), f"{path} holds no YAML document"


def test_shell_scripts_parse():
    for script in DEPLOY.rglob("*.sh"):
        subprocess.run(["bash", "-n", str(script)], check=True)
        assert os.access(script, os.X_OK), f"{script} is not executable"


def test_docs_describe_every_deploy_file():
    doc = (REPO / "docs" / "deploy.md").read_text()
    missing = [str(p.relative_to(REPO)) for p in DEPLOY.rglob("*")
               if p.is_file() and "clusters" not in p.parts and "__pycache__" not in p.parts
               and str(p.relative_to(REPO)) not in doc]
    assert not missing, f"docs/deploy.md does not mention {missing}"


# ------------------------------------------------------------------------------------------------ cluster files


def test_local_cluster_file_is_the_embedded_cluster():
    assert load_cluster(DEPLOY / "local" / "cluster.yaml") == load_cluster(None)


@pytest.mark.parametrize("cluster,policy", [
    ("deploy/local/cluster.yaml", "policies/local.yaml"),
    ("deploy/local/three-node.yaml", "deploy/local/three-node-policy.yaml"),
])
def test_local_cluster_files_load_and_match_their_policy(cluster, policy):
    c, pol = load_cluster(REPO / cluster), load_policy(REPO / policy)
    for g in c.nodes:
        assert set(g.features) <= set(pol.node_features), f"{cluster}: {g.name} has undeclared features"
        assert g.node_type in pol.prices, f"{cluster}: {g.name}'s node type {g.node_type!r} has no price"
    # The example specs are written for these policies' teams; the cluster can hold the largest gang.
    for spec in sorted((REPO / "examples" / "specs").glob("*.yaml")):
        s = load_spec(spec, pol)
        assert s.gang.resources.gpu <= max(g.gpus for g in c.nodes)


def _launcher_gpu_nodes() -> Iterator[Tuple[str, int, Dict[str, str]]]:
    cfg = yaml.safe_load(LAUNCHER.read_text())
    for name, t in cfg["available_node_types"].items():
        if name != cfg["head_node_type"]:
            yield f"launcher:{name}", int(t["resources"].get("GPU", 0)), t.get("labels", {})


def _kuberay_gpu_nodes() -> Iterator[Tuple[str, int, Dict[str, str]]]:
    cluster = next(d for d in _yaml_docs(KUBERAY) if d["kind"] == "RayCluster")
    for g in cluster["spec"]["workerGroupSpecs"]:
        limits = g["template"]["spec"]["containers"][0]["resources"]["limits"]
        yield f"kuberay:{g['groupName']}", int(limits.get("nvidia.com/gpu", 0)), g.get("labels", {})


GPU_NODES = list(_launcher_gpu_nodes()) + list(_kuberay_gpu_nodes())


@pytest.mark.parametrize("where,gpus,labels", GPU_NODES, ids=[n[0] for n in GPU_NODES])
def test_gpu_node_labels_follow_the_feature_label_convention(where, gpus, labels):
    """Launcher and KubeRay nodes carry the labels `raylane up` gives a cluster-file node of the same features and
    node type, valid as Ray labels, declared by the default policy, and agreeing with the simulator's example
    cluster of the same node type."""
    from ray._private.label_utils import validate_node_labels

    validate_node_labels(labels)
    features = sorted(k[len(FEATURE_PREFIX):] for k in labels if k.startswith(FEATURE_PREFIX))
    group = NodeGroup(name="g", gpus=gpus, features=features, node_type=labels.get(NODE_TYPE, ""))
    assert node_labels(group) == labels
    policy = load_policy(REPO / "policies" / "default.yaml")
    assert set(features) <= set(policy.node_features)
    assert group.node_type in policy.prices
    from raylane.sim.cluster import load_cluster as load_sim_cluster

    sim = {g.node_type: g for g in load_sim_cluster(DEPLOY / "clusters" / "mixed-example.yaml").node_groups}
    assert group.node_type in sim, f"{where}: no group of node type {group.node_type} in mixed-example.yaml"
    assert (gpus, set(features)) == (sim[group.node_type].gpus, set(sim[group.node_type].features))


def test_launcher_config_passes_rays_schema_and_keeps_gpus_off_the_head():
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = yaml.safe_load(LAUNCHER.read_text())
    validate_config(prepare_config(cfg))
    head = cfg["available_node_types"][cfg["head_node_type"]]
    assert head["resources"].get("GPU") == 0
    assert cfg["file_mounts"] == {IMAGE_REPO: "."}
    starts = " ".join(cfg["head_start_ray_commands"])
    assert "deploy/start_control.py" in starts and "--journal" in starts and "RAYLANE_MLFLOW_URI" in starts
    assert "RAYLANE_MLFLOW_URI" in " ".join(cfg["worker_start_ray_commands"])


def test_kuberay_manifests_hold_together():
    docs = _yaml_docs(KUBERAY)
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    cluster = next(d for d in docs if d["kind"] == "RayCluster")
    service = next(d for d in docs if d["kind"] == "Service")
    head = cluster["spec"]["headGroupSpec"]
    pods = [head["template"]["spec"]] + [g["template"]["spec"] for g in cluster["spec"]["workerGroupSpecs"]]
    for pod in pods:
        assert pod["containers"][0]["name"].startswith("ray-"), "KubeRay wants the Ray container first"
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes
        for v in volumes.values():
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims
    for g in [head] + cluster["spec"]["workerGroupSpecs"]:
        # KubeRay v1.5 refuses labels in rayStartParams; they belong in the group's labels field.
        assert "labels" not in g["rayStartParams"]
    ray_head = head["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in ray_head["resources"]["limits"] and head["rayStartParams"]["num-gpus"] == "0"
    hook = " ".join(ray_head["lifecycle"]["postStart"]["exec"]["command"])
    state_mount = next(m["mountPath"] for m in ray_head["volumeMounts"] if m["name"] == "state")
    assert "deploy/start_control.py" in hook and f"--journal {state_mount}/" in hook
    # Every Ray node writes to the MLflow sidecar through the Service, which selects the head pod.
    assert service["spec"]["selector"] == {"ray.io/cluster": cluster["metadata"]["name"], "ray.io/node-type": "head"}
    uri = f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    for pod in pods:
        env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
        assert env["RAYLANE_MLFLOW_URI"] == uri
    mlflow = next(c for c in head["template"]["spec"]["containers"] if c["name"] == "mlflow")
    allowed = next(e["value"] for e in mlflow["env"] if e["name"] == "MLFLOW_SERVER_ALLOWED_HOSTS")
    assert f"{service['metadata']['name']}*" in allowed.split(",")
    job = _yaml_docs(RAYJOB)[0]
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}


# ------------------------------------------------------------------------------------------------ autoscaling


def _growable() -> Dict[str, NodeGroup]:
    """The growable groups of deploy/clusters/autoscaling.yaml by node type."""
    return {g.node_type: g for g in load_cluster(AUTOSCALING).nodes if g.growable}


def _kuberay_groups() -> Dict[str, Tuple[dict, int, int]]:
    """node type -> (worker group, GPUs, CPUs) of the RayCluster."""
    cluster = next(d for d in _yaml_docs(KUBERAY) if d["kind"] == "RayCluster")
    out = {}
    for g in cluster["spec"]["workerGroupSpecs"]:
        limits = g["template"]["spec"]["containers"][0]["resources"]["limits"]
        out[g["labels"][NODE_TYPE]] = (g, int(limits.get("nvidia.com/gpu", 0)), int(limits["cpu"]))
    return out


def _launcher_types() -> Dict[str, Tuple[str, dict]]:
    """node type -> (type name, node type config) of the launcher's worker types."""
    cfg = yaml.safe_load(LAUNCHER.read_text())
    return {t["labels"][NODE_TYPE]: (name, t) for name, t in cfg["available_node_types"].items()
            if name != cfg["head_node_type"]}


def _cluster_flag(command: str) -> str:
    m = re.search(r"deploy/start_control\.py\b[^|>]*?--cluster[ =](\S+)", command)
    assert m, f"start_control.py is not given --cluster: {command}"
    return m.group(1)


def test_autoscaling_cluster_file_loads_and_matches_the_default_policy():
    c = load_cluster(AUTOSCALING)
    policy = load_policy(REPO / "policies" / "default.yaml")
    growable = [g for g in c.nodes if g.growable]
    assert growable, "deploy/clusters/autoscaling.yaml has no growable group: nothing for the autoscaler to grow"
    assert c.head.gpus == 0
    for g in c.nodes:
        assert set(g.features) <= set(policy.node_features), f"{g.name} has features the policy does not declare"
        assert g.price == policy.prices[g.node_type], f"{g.name}: price {g.price} is not the policy's"
        assert g.labels == node_labels(g), f"{g.name}: labels are not those raylane.localcluster.node_labels writes"
        assert g.startup is not None and g.lo < g.hi, g.name


def test_kuberay_autoscaler_is_on_with_v2():
    cluster = next(d for d in _yaml_docs(KUBERAY) if d["kind"] == "RayCluster")
    assert cluster["spec"]["enableInTreeAutoscaling"] is True
    opts = cluster["spec"]["autoscalerOptions"]
    assert opts["version"] == "v2", "only autoscaler v2 honours the label selectors of request_resources"
    assert 0 < opts["idleTimeoutSeconds"] <= 3600


def test_kuberay_worker_groups_are_the_cluster_files_growable_groups():
    groups, growable = _kuberay_groups(), _growable()
    assert set(groups) == set(growable), "KubeRay worker groups and deploy/clusters/autoscaling.yaml differ"
    for node_type, (g, gpus, cpus) in groups.items():
        want = growable[node_type]
        assert g["labels"] == node_labels(want), node_type
        assert (g["minReplicas"], g["maxReplicas"], g["replicas"]) == (want.lo, want.hi, want.count), node_type
        assert (gpus, cpus) == (want.gpus, want.cpus), node_type
        limits = g["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["memory"] == f"{int(want.memory)}Gi", node_type


def test_launcher_worker_types_agree_with_the_cluster_file():
    """Every growable group of the cluster file is a launcher type with the same bounds, GPUs, CPUs and labels; a
    launcher type not in it stays fixed (the control plane asks for no node of it)."""
    cfg = yaml.safe_load(LAUNCHER.read_text())
    types, growable = _launcher_types(), _growable()
    assert set(growable) <= set(types), f"launcher lacks node types {set(growable) - set(types)}"
    for node_type, (name, t) in types.items():
        if node_type not in growable:
            assert t["min_workers"] == t["max_workers"], f"{name} grows but is not in the cluster file"
            continue
        want = growable[node_type]
        assert t["labels"] == node_labels(want), name
        assert (t["min_workers"], t["max_workers"]) == (want.lo, want.hi), name
        assert (t["resources"]["GPU"], t["resources"]["CPU"]) == (want.gpus, want.cpus), name
    assert cfg["max_workers"] >= sum(t["max_workers"] for _, t in types.values())
    assert 0 < cfg["idle_timeout_minutes"] <= 60
    head = " ".join(cfg["head_start_ray_commands"])
    assert re.search(r"RAY_enable_autoscaler_v2=1\b[^;]*ray start --head", head), "autoscaler v2 is not on"


def test_start_commands_pass_the_cluster_file_where_it_is():
    """KubeRay's postStart hook names the file where the ConfigMap volume mounts it (and the ConfigMap recipe in the
    header puts autoscaling.yaml under that key); the launcher's head command names it in the synced checkout."""
    text = KUBERAY.read_text()
    cluster = next(d for d in _yaml_docs(KUBERAY) if d["kind"] == "RayCluster")
    ray_head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    path = _cluster_flag(" ".join(ray_head["lifecycle"]["postStart"]["exec"]["command"]))
    volumes = {v["name"]: v for v in cluster["spec"]["headGroupSpec"]["template"]["spec"]["volumes"]}
    mount = next(m for m in ray_head["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/"))
    config_map = volumes[mount["name"]]["configMap"]["name"]
    key = path[len(mount["mountPath"].rstrip("/")) + 1:]
    recipe = re.search(rf"kubectl create configmap {re.escape(config_map)}\b((?:.*\\\n#)*.*)", text)
    assert recipe, f"the header does not say how to create ConfigMap {config_map}"
    files = dict(re.findall(r"--from-file=([\w.-]+)=(\S+)", recipe.group(1)))
    assert key in files, f"ConfigMap {config_map} is not created with key {key}"
    assert (REPO / files[key]).resolve() == AUTOSCALING.resolve()

    cfg = yaml.safe_load(LAUNCHER.read_text())
    path = _cluster_flag(" ".join(cfg["head_start_ray_commands"]))
    assert path.startswith(IMAGE_REPO + "/")
    assert (REPO / path[len(IMAGE_REPO) + 1:]).resolve() == AUTOSCALING.resolve()


def test_cluster_flag_is_read_from_start_control_commands():
    assert _cluster_flag("python deploy/start_control.py --policy p.yaml --cluster /etc/c.yaml --journal j") == \
        "/etc/c.yaml"
    with pytest.raises(AssertionError):
        _cluster_flag("python deploy/start_control.py --policy p.yaml | tee --cluster /etc/c.yaml")


def _image_paths(text: str) -> Set[str]:
    return set(re.findall(re.escape(IMAGE_REPO) + r"/([\w./-]+\w)", text))


def test_paths_into_the_checkout_exist():
    """Commands of the launcher, KubeRay and Docker files name files of this checkout (as the image or the
    launcher's file_mounts place it); each exists."""
    files = [LAUNCHER, KUBERAY, RAYJOB, DEPLOY / "docker" / "Dockerfile"]
    paths = set().union(*(_image_paths(f.read_text()) for f in files))
    assert "deploy/start_control.py" in paths
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"named in deploy/ but not in the repo: {missing}"


def test_rayjob_spec_is_valid_for_the_default_policy():
    entry = _yaml_docs(RAYJOB)[0]["spec"]["entrypoint"]
    assert entry.startswith("python -m raylane.run ")
    (spec,) = _image_paths(entry)
    s = load_spec(REPO / spec, load_policy(REPO / "policies" / "default.yaml"))
    largest = max(n[1] for n in GPU_NODES)
    assert s.gang.resources.gpu <= largest


def test_start_control_help():
    out = subprocess.run([sys.executable, str(DEPLOY / "start_control.py"), "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    for flag in ("--policy", "--journal", "--address", "--timeout"):
        assert flag in out.stdout


def test_start_control_refuses_a_bad_policy_before_connecting(tmp_path):
    bad = tmp_path / "policy.yaml"
    bad.write_text("classes: {}\nteams: {}\nbogus: 1\n")
    out = subprocess.run([sys.executable, str(DEPLOY / "start_control.py"), "--policy", str(bad),
                          "--address", "127.0.0.1:1", "--timeout", "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "bogus" in out.stderr and "connected" not in out.stdout


# ------------------------------------------------------------------------------------------------ metrics


def _rules() -> List[dict]:
    return [r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]


def _dashboard_exprs() -> List[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


def _test_series() -> List[str]:
    tests = yaml.safe_load((PROM / "raylane_rules_test.yml").read_text())["tests"]
    return [s["series"] for t in tests for s in t.get("input_series", [])]


def _all_exprs() -> List[Tuple[str, str]]:
    out = [(f"rule {r.get('record') or r.get('alert')}", r["expr"]) for r in _rules()]
    out += [("dashboard", e) for e in _dashboard_exprs()]
    out += [("rule test input", s) for s in _test_series()]
    return out


def _base_name(exported: str) -> Tuple[str, str]:
    """``ray_raylane_queue_wait_seconds_bucket`` -> (``raylane_queue_wait_seconds``, ``_bucket``)."""
    name = exported[len("ray_"):]
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name not in METRICS:
            return name[: -len(suffix)], suffix
    return name, ""


def test_every_metric_in_rules_dashboard_and_rule_tests_exists():
    for where, expr in _all_exprs():
        for exported in re.findall(r"\bray_\w+", expr):
            name, suffix = _base_name(exported)
            if exported.removesuffix(suffix) in RAY_NATIVE:
                continue
            assert name in METRICS, f"{where}: {exported} is not a metric of raylane.metrics ({expr})"
            if suffix:
                assert METRICS[name].kind == "histogram", f"{where}: {exported} but {name} is a {METRICS[name].kind}"


def test_ray_native_metrics_are_rays():
    import ray

    ray_dir = Path(ray.__file__).parent / "dashboard" / "modules" / "metrics" / "dashboards"
    text = "".join(p.read_text() for p in ray_dir.glob("*.py"))
    for name in RAY_NATIVE:
        assert name in text, f"{name} is not among the installed Ray's dashboard metrics"


def test_labels_used_with_raylane_metrics_exist():
    all_labels = set().union(*(m.labels for m in metrics.ALL), *RAY_NATIVE.values()) | {"le"}
    for where, expr in _all_exprs():
        for exported, matchers in re.findall(r"\b(ray_\w+)\{([^}]*)\}", expr):
            name, suffix = _base_name(exported)
            if exported.removesuffix(suffix) in RAY_NATIVE:
                allowed = RAY_NATIVE[exported.removesuffix(suffix)]
            else:
                allowed = set(METRICS[name].labels) | ({"le"} if suffix == "_bucket" else set())
            used = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
            assert used <= allowed | RAY_LABELS, f"{where}: {exported} has no label {used - allowed - RAY_LABELS}"
        for group in re.findall(r"\b(?:by|on|without|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
            used = {x.strip() for x in group.split(",") if x.strip()}
            assert used <= all_labels, f"{where}: aggregates by unknown labels {used - all_labels} ({expr})"


def test_recorded_series_used_are_defined():
    recorded = {r["record"] for r in _rules() if "record" in r}
    for where, expr in _all_exprs():
        for name in re.findall(r"\b[a-z_]+:[a-z0-9_]+(?::[a-z0-9_]+)?\b", expr):
            assert name in recorded, f"{where}: {name} is recorded by no rule of {[f.name for f in RULE_FILES]}"


def test_queue_targets_are_generated_from_the_default_policy(monkeypatch):
    spec = importlib.util.spec_from_file_location("queue_targets", PROM / "queue_targets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.chdir(REPO)
    assert (PROM / "raylane_targets.yml").read_text() == mod.render("policies/default.yaml"), (
        "deploy/prometheus/raylane_targets.yml is stale: python deploy/prometheus/queue_targets.py "
        "policies/default.yaml > deploy/prometheus/raylane_targets.yml")


def test_dashboard_structure():
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs))
        for t in p.get("targets", []):
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    names = {v["name"] for v in dash["templating"]["list"]}
    for expr in _dashboard_exprs():
        for var in re.findall(r"\$(\w+)", expr):
            assert var in names or var.startswith("__"), f"dashboard uses ${var}, which it does not define"


# ------------------------------------------------------------------------------------------------ promtool


@pytest.fixture(scope="module")
def promtool() -> str:
    found = os.environ.get("PROMTOOL") or shutil.which("promtool")
    beside = Path(sys.executable).parent / "promtool"
    if not found and beside.exists():
        found = str(beside)
    if not found:
        msg = "promtool not found (PATH, $PROMTOOL, the venv); install it with: bash deploy/prometheus/install_promtool.sh"
        if os.environ.get("CI"):
            pytest.fail(msg + " (CI is set: the rule checks must run there, so this fails instead of skipping)")
        pytest.skip(msg)
    return found


def _run(cmd: List[str], cwd: Path = PROM) -> str:
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{' '.join(cmd)}:\n{out.stdout}\n{out.stderr}"
    return out.stdout + out.stderr


def test_promtool_check_rules(promtool):
    _run([promtool, "check", "rules", *[f.name for f in RULE_FILES]])


def test_promtool_rule_unit_tests(promtool):
    assert "SUCCESS" in _run([promtool, "test", "rules", "raylane_rules_test.yml"])


def test_promtool_check_config(promtool):
    _run([promtool, "check", "config", "prometheus.yml"])


def test_dashboard_queries_are_valid_promql(promtool, tmp_path):
    exprs = [re.sub(r"\$(\w+)", ".*", e.replace("$__rate_interval", "5m")) for e in _dashboard_exprs()
             if not e.startswith("label_values(")]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:query:{i}", "expr": e}
                                                        for i, e in enumerate(exprs)]}]}
    (tmp_path / "dashboard_rules.yml").write_text(yaml.safe_dump(rules))
    _run([promtool, "check", "rules", "dashboard_rules.yml"], cwd=tmp_path)
