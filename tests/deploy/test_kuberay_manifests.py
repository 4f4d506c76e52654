"""The KubeRay manifests of the repository are what KubeRay v1.7.0's CRDs accept: every `ray.io` document of every
YAML file is checked against its kind's v1 schema (deploy/kuberay/crds/) by tests/kuberay_schema.py, which fails on
the fields the API server would silently prune. The checker itself is tested from tables, on small schemas and on
real manifests broken in one place. Pure: no Ray, no cluster.
"""
from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from tests.kuberay_schema import (SCHEMA_FILES, Problem, UnsupportedSchema, check_resource, load_documents,
                                  validate)

REPO = Path(__file__).resolve().parents[2]
_RAY_API = re.compile(r"^\s*apiVersion:\s*[\"']?ray\.io/", re.M)


def _kuberay_manifests() -> List[Tuple[str, Any]]:
    """(id, document) for every top-level `ray.io` document of every YAML file in the repository."""
    found = []
    for dirpath, dirnames, filenames in os.walk(REPO):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in ("__pycache__", "node_modules")
                             and not d.endswith(".egg-info"))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.suffix not in (".yaml", ".yml") or not _RAY_API.search(path.read_text(errors="replace")):
                continue
            for doc in load_documents(path):
                if isinstance(doc, dict) and str(doc.get("apiVersion", "")).startswith("ray.io/"):
                    name_ = (doc.get("metadata") or {}).get("name", "?")
                    found.append((f"{path.relative_to(REPO)}:{doc.get('kind')}/{name_}", doc))
    return found


MANIFESTS = _kuberay_manifests()


# ------------------------------------------------------------------------------------- the repository's manifests


def test_the_repository_has_kuberay_manifests_and_a_schema_for_each_kind_copied():
    kinds = {doc.get("kind") for _, doc in MANIFESTS}
    assert MANIFESTS, "no `apiVersion: ray.io/...` document found in the repository's YAML files"
    unused = set(SCHEMA_FILES) - kinds
    assert not unused, f"deploy/kuberay/crds/ holds schemas no manifest uses: {sorted(unused)}"


@pytest.mark.parametrize("doc", [d for _, d in MANIFESTS], ids=[i for i, _ in MANIFESTS])
def test_manifest_matches_kuberays_crd_schema(doc):
    problems = check_resource(doc)
    assert not problems, "\n".join(map(str, problems))


# ------------------------------------------------------------------------------------- the checker, small schemas

SMALL = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "replicas": {"type": "integer", "format": "int32", "minimum": 0},
        "ratio": {"type": "number"},
        "on": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["token", "disabled"]},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "anything": {"type": "object", "additionalProperties": True},
        "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                  "properties": {"known": {"type": "integer"}}},
        "opaque": {"type": "object"},
        "port": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]},
        "note": {"type": "string", "nullable": True},
        "cpu": {"type": "string", "pattern": "^[0-9]+m?$"},
        "at": {"type": "string", "format": "date-time"},
        "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
        "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "required": ["name"],
                            "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}},
    },
}

# (case, document, [(path, part of the message)]): every problem, in order, and nothing else.
SMALL_CASES = [
    ("valid", {"name": "a", "replicas": 2, "mode": "token", "labels": {"x.io/y": "1"}, "port": 80, "note": None,
               "ratio": 1, "on": False, "cpu": "500m", "at": "2025-01-31T12:00:00Z", "tags": ["a", "b"],
               "ports": [{"name": "a", "port": 1}, {"name": "b", "port": 1}]}, []),
    ("unknown field, with the near name", {"name": "a", "replica": 2},
     [("replica", "unknown field (the API server would prune it); did you mean replicas? allowed: anything, at,")]),
    ("wrong type", {"name": "a", "replicas": "2"}, [("replicas", '"2" is a string; allowed: integer (int32)')]),
    ("a boolean is not an integer", {"name": "a", "replicas": True},
     [("replicas", "true is a boolean; allowed: integer")]),
    ("a float is not an integer", {"name": "a", "replicas": 1.5}, [("replicas", "1.5 is a number; allowed: integer")]),
    ("int32 range", {"name": "a", "replicas": 2**31}, [("replicas", "out of range; allowed: int32")]),
    ("minimum", {"name": "a", "replicas": -1}, [("replicas", "-1 is too small; allowed: >= 0")]),
    ("missing required", {"replicas": 1}, [("name", "missing; it is required here")]),
    ("bad enum", {"name": "a", "mode": "tokens"},
     [("mode", '"tokens" is not allowed; allowed: one of "token", "disabled"')]),
    ("additionalProperties as a schema", {"name": "a", "labels": {"ok": "1", "x.io/n": 1}},
     [('labels["x.io/n"]', "1 is an integer; allowed: string")]),
    ("additionalProperties: true keeps anything", {"name": "a", "anything": {"b": [1, {"c": None}]}}, []),
    ("preserve-unknown-fields keeps unknown subtrees whole",
     {"name": "a", "extra": {"deep": {"er": [1, {"x": None}]}, "known": 3}}, []),
    ("preserve-unknown-fields still checks the fields it names", {"name": "a", "extra": {"known": "3"}},
     [("extra.known", '"3" is a string; allowed: integer')]),
    ("an object that specifies no fields prunes them all", {"name": "a", "opaque": {"k": 1}},
     [("opaque.k", "unknown field (the API server would prune it); allowed: no fields here")]),
    ("int-or-string takes both", {"name": "a", "port": "http"}, []),
    ("int-or-string takes nothing else", {"name": "a", "port": 1.5},
     [("port", "1.5 is a number; allowed: an integer or a string")]),
    ("null where not nullable", {"name": None}, [("name", "null is not allowed here (not nullable")]),
    ("pattern", {"name": "a", "cpu": "8 cores"}, [("cpu", '"8 cores" does not match; allowed: strings matching')]),
    ("minLength", {"name": ""}, [("name", '"" is 0 characters long; allowed: at least 1')]),
    ("date-time", {"name": "a", "at": "yesterday"}, [("at", '"yesterday" is not a date-time')]),
    ("set items are unique", {"name": "a", "tags": ["a", "a"]},
     [("tags[1]", 'duplicate item "a" (also at [0]); allowed: each item once')]),
    ("map-list keys are unique, items are checked with their index",
     {"name": "a", "ports": [{"name": "a"}, {"nam": "b"}, {"name": "a", "port": "1"}]},
     [("ports[1].nam", "unknown field"), ("ports[1].name", "missing"),
      ("ports[2].port", '"1" is a string; allowed: integer'), ("ports[2]", 'duplicate name name="a" (also at [0])')]),
    ("every problem of a document at once", {"replica": 1, "mode": "x", "on": "yes"},
     [("replica", "unknown field"), ("mode", "is not allowed"), ("on", '"yes" is a string; allowed: boolean'),
      ("name", "missing")]),
]


def _assert_problems(problems: List[Problem], expected: List[Tuple[str, str]]) -> None:
    assert [p.path for p in problems] == [path for path, _ in expected], "\n".join(map(str, problems))
    for problem, (_, part) in zip(problems, expected):
        assert part in problem.message, str(problem)


@pytest.mark.parametrize("doc,expected", [c[1:] for c in SMALL_CASES], ids=[c[0] for c in SMALL_CASES])
def test_checker_on_a_small_schema(doc, expected):
    _assert_problems(validate(doc, SMALL), expected)


def test_a_problem_names_its_path_value_and_what_is_allowed():
    (problem,) = validate({"name": "a", "ports": [{"name": "p", "port": "80"}]}, SMALL)
    assert str(problem) == 'ports[0].port: "80" is a string; allowed: integer'


@pytest.mark.parametrize("node", [{"type": "object", "oneOf": []}, {"type": "object", "not": {}},
                                  {"type": "tuple"}, {"type": "array", "x-kubernetes-list-type": "bag"}])
def test_a_schema_keyword_the_checker_does_not_implement_is_refused_not_skipped(node):
    with pytest.raises(UnsupportedSchema):
        validate([] if node["type"] == "array" else {}, node)


# --------------------------------------------------------------------------- the checker, real manifests broken


def _manifest(kind: str) -> Any:
    docs = [d for _, d in MANIFESTS if d.get("kind") == kind]
    assert docs, f"no {kind} manifest in the repository"
    return copy.deepcopy(docs[0])


def _at(doc: Any, path: str) -> Tuple[Any, Any]:
    """The container of the field at `path` (dots and [i]) and the field's key or index."""
    *parents, last = re.findall(r"[^.\[\]]+", path)
    for step in parents:
        doc = doc[int(step)] if isinstance(doc, list) else doc[step]
    return doc, int(last) if isinstance(doc, list) else last


def _set(path, value):
    def change(doc):
        parent, key = _at(doc, path)
        parent[key] = value
    return change


def _rename(path, new):
    def change(doc):
        parent, key = _at(doc, path)
        parent[new] = parent.pop(key)
    return change


def _delete(path):
    def change(doc):
        parent, key = _at(doc, path)
        del parent[key]
    return change


W0 = "spec.workerGroupSpecs[0]"
HEAD_C0 = "spec.headGroupSpec.template.spec.containers[0]"
# (case, kind, change, [(path, part of the message)])
BROKEN = [
    ("misspelled workerGroupSpec", "RayCluster", _rename("spec.workerGroupSpecs", "workerGroupSpec"),
     [("spec.workerGroupSpec", "unknown field (the API server would prune it); did you mean workerGroupSpecs?")]),
    ("replica count as a string", "RayCluster", _set(f"{W0}.minReplicas", "4"),
     [(f"{W0}.minReplicas", '"4" is a string; allowed: integer (int32)')]),
    ("no head group", "RayCluster", _delete("spec.headGroupSpec"), [("spec.headGroupSpec", "required")]),
    ("worker group without maxReplicas", "RayCluster", _delete(f"{W0}.maxReplicas"),
     [(f"{W0}.maxReplicas", "required")]),
    ("bad auth mode", "RayCluster", _set("spec.authOptions.mode", "tokens"),
     [("spec.authOptions.mode", 'allowed: one of "disabled", "token"')]),
    ("a rayStartParams value that is not a string", "RayCluster", _set("spec.headGroupSpec.rayStartParams.num-gpus", 0),
     [("spec.headGroupSpec.rayStartParams.num-gpus", "0 is an integer; allowed: string")]),
    ("a misspelled field deep in the pod template", "RayCluster", _rename(f"{HEAD_C0}.volumeMounts", "volumeMount"),
     [(f"{HEAD_C0}.volumeMount", "did you mean volumeMounts?")]),
    ("a quantity that is not one", "RayCluster", _set(f"{HEAD_C0}.resources.limits.cpu", "8 cores"),
     [(f"{HEAD_C0}.resources.limits.cpu", '"8 cores" does not match')]),
    ("a container port twice", "RayCluster", lambda d: _at(d, f"{HEAD_C0}.ports")[0]["ports"].append(
        {"containerPort": 6379, "name": "gcs2"}),
     [(f"{HEAD_C0}.ports[5]", "duplicate containerPort/protocol containerPort=6379, protocol=null (also at [0])")]),
    ("a misspelled field of the root metadata", "RayCluster", _rename("metadata.name", "nam"),
     [("metadata.nam", "did you mean name?")]),
    ("autoscaling flag as a string", "RayCluster", _set("spec.enableInTreeAutoscaling", "false"),
     [("spec.enableInTreeAutoscaling", '"false" is a string; allowed: boolean')]),
    ("misspelled clusterSelector", "RayJob", _rename("spec.clusterSelector", "clusterSelectors"),
     [("spec.clusterSelectors", "did you mean clusterSelector?")]),
    ("entrypoint CPUs as a string", "RayJob", _set("spec.entrypointNumCpus", "0"),
     [("spec.entrypointNumCpus", '"0" is a string; allowed: number')]),
    ("submitter pod with an unknown field", "RayJob", _set("spec.submitterPodTemplate.spec.restartPolicyy", "Never"),
     [("spec.submitterPodTemplate.spec.restartPolicyy", "did you mean restartPolicy?")]),
    ("a version with no schema copy", "RayJob", _set("apiVersion", "ray.io/v1alpha1"),
     [("apiVersion", '"ray.io/v1alpha1" has no schema copy; allowed: ray.io/v1')]),
    ("a kind with no schema copy", "RayJob", _set("kind", "RayService"),
     [("kind", '"RayService" has no schema copy in deploy/kuberay/crds/')]),
]


@pytest.mark.parametrize("kind,change,expected", [c[1:] for c in BROKEN], ids=[c[0] for c in BROKEN])
def test_checker_on_a_real_manifest_broken_in_one_place(kind, change, expected):
    doc = _manifest(kind)
    assert check_resource(doc) == []
    change(doc)
    _assert_problems(check_resource(doc), expected)
