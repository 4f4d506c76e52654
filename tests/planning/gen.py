"""Seeded builders of the worked example and of random small pipelines, shared by tests and tests/bench/bench_plan.py.

Random instances keep every duration a multiple of 15 minutes and every transfer a whole number of minutes
(integer GB over 10, 20, 30 or 60 GB/h, links or node storage), so CP-SAT's minute resolution is exact and its
optimum comparable to the exhaustive search's float one.
"""
from __future__ import annotations

import random
from dataclasses import replace
from typing import List, Optional, Tuple

from raylane.planning import Network, Pipeline, PlanNode, Stage

FEATURES = ("gpu", "ssd")
BANDWIDTHS = (10.0, 20.0, 30.0, 60.0)
STORAGE_GB_PER_H = (10.0, 20.0)


def worked_example() -> Tuple[Pipeline, List[PlanNode], Network]:
    """Issue 13's pipeline on a three-node cluster (see docs/pipelines.md)."""
    pipeline = Pipeline((
        Stage("T1", cpu=8, memory_gb=32, gpu=1, features={"gpu"}, duration_h=3, output_gb=10),
        Stage("T2", cpu=4, memory_gb=16, duration_h=2, output_gb=5, needs=("T1",)),
        Stage("T3", cpu=16, memory_gb=64, features={"ssd"}, duration_h=5, output_gb=20),
        Stage("T4", cpu=8, memory_gb=32, duration_h=4, output_gb=15, needs=("T2", "T3")),
    ))
    nodes = [
        PlanNode("gpu-1", "gpu", cpu=32, memory_gb=128, gpu=4, features={"gpu"}, storage_gbps=1.0),
        PlanNode("ssd-1", "ssd", cpu=32, memory_gb=128, features={"ssd"}, storage_gbps=6.0),
        PlanNode("cpu-1", "cpu", cpu=16, memory_gb=64, storage_gbps=0.5),
    ]
    # 10 GB/h between most nodes; the GPU and SSD nodes share a faster 20 GB/h link.
    network = Network(default_gb_per_h=10.0, links={("gpu-1", "ssd-1"): 20.0})
    return pipeline, nodes, network


def random_instance(rng: random.Random, max_stages: int = 5, min_nodes: int = 2, max_nodes: int = 3,
                    n_stages: Optional[int] = None, tight: bool = False) -> Tuple[Pipeline, List[PlanNode], Network]:
    """``tight``: few dependencies and stages that take half to all of a node's cpu, so capacity binds often."""
    nodes = []
    for i in range(rng.randint(min_nodes, max_nodes)):
        feats = {f for f in FEATURES if rng.random() < 0.4}
        nodes.append(PlanNode(f"n{i}", rng.choice("abc"), cpu=rng.choice((8, 16)),
                              memory_gb=rng.choice((32, 64)), gpu=4 if "gpu" in feats else 0, features=feats))
    stages = []
    for i in range(n_stages or rng.randint(2, max_stages)):
        home = rng.choice(nodes)  # a node that can hold it, so the stage is feasible
        feats = {f for f in sorted(home.features) if rng.random() < 0.5}  # sorted: set order varies by process
        per_type = {t: rng.randint(1, 16) / 4 for t in "abc" if rng.random() < 0.3}
        needs = tuple(f"s{j}" for j in range(i) if rng.random() < (0.15 if tight else 0.4))
        cpu = home.cpu * rng.choice((0.5, 0.75, 1.0)) if tight else min(home.cpu, rng.choice((2, 4, 8)))
        stages.append(Stage(
            f"s{i}", cpu=cpu, memory_gb=min(home.memory_gb, rng.choice((8, 16, 32))),
            gpu=1 if "gpu" in feats else 0, features=feats, duration_h=rng.randint(2, 16) / 4,
            durations_h=per_type, output_gb=rng.randint(0, 20), needs=needs))
    links = {(a.name, b.name): rng.choice(BANDWIDTHS) for a in nodes for b in nodes
             if a.name < b.name and rng.random() < 0.5}
    network = Network(default_gb_per_h=rng.choice(BANDWIDTHS), links=links)
    # Drawn last, so the rest of the instance is what it was before storage counted: about one node in three gets
    # storage of 10 or 20 GB/h (as GB/s), slower than most links, so it binds (exaggerated, like the links).
    nodes = [replace(n, storage_gbps=rng.choice(STORAGE_GB_PER_H) / 3600) if rng.random() < 0.3 else n
             for n in nodes]
    return Pipeline(tuple(stages)), nodes, network


def locality_instance(rng: random.Random, n_stages: Optional[int] = None, min_stages: int = 3, max_stages: int = 7,
                      n_nodes: Optional[int] = None) -> Tuple[Pipeline, List[PlanNode], Network]:
    """A small locality-heavy pipeline: outputs of 10-60 GB on links of 10-30 GB/h (transfers of 20 min to 6 h, as
    long as the stages), mostly chains and fork-joins (each stage needs the one before it with probability 0.7 and
    any other earlier one with 0.2), and each stage fastest on a different node type (0.25-4 h by type), so a planner
    that chases the fastest node pays for it in transfers. Durations in quarter hours, transfers whole minutes."""
    types = "abc"
    nodes = [PlanNode(f"n{i}", types[i % 3], cpu=16, memory_gb=64) for i in range(n_nodes or rng.randint(2, 4))]
    stages = []
    for i in range(n_stages or rng.randint(min_stages, max_stages)):
        needs = tuple(f"s{j}" for j in range(i) if rng.random() < (0.7 if j == i - 1 else 0.2))
        per_type = {t: rng.randint(1, 16) / 4 for t in types}
        stages.append(Stage(f"s{i}", cpu=rng.choice((4, 8, 16)), memory_gb=16, duration_h=max(per_type.values()),
                            durations_h=per_type, output_gb=rng.randint(10, 60), needs=needs))
    links = {(a.name, b.name): rng.choice((10.0, 20.0, 30.0)) for a in nodes for b in nodes
             if a.name < b.name and rng.random() < 0.5}
    return Pipeline(tuple(stages)), nodes, Network(default_gb_per_h=rng.choice((10.0, 20.0)), links=links)
