"""write_gantt writes a real PNG: planned alone, and planned above a measured run on other node names."""
import struct

from raylane.planning import PLANNERS, Placement, Plan
from raylane.planning.gantt import write_gantt
from tests.planning.gen import worked_example


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24]), len(data)


def test_planned_and_actual_charts(tmp_path):
    pipeline, nodes, network = worked_example()
    plan = PLANNERS.get("cpsat").plan(pipeline, nodes, network)
    one = tmp_path / "plan.png"
    assert write_gantt(one, pipeline, plan, title="worked example", network=network) == str(one)
    (w1, h1), n1 = _png_size(one)
    assert n1 > 10_000 and w1 >= 800
    # A measured run: minutes instead of hours, other node names, T4 missing (never ran).
    actual = Plan(tuple(Placement(p.stage, "ray-" + p.node, p.start_h / 60, p.finish_h / 60)
                        for p in plan.placements if p.stage != "T4"), 5 / 60, planner="actual")
    two = tmp_path / "both.png"
    write_gantt(two, pipeline, plan, actual=actual)
    (w2, h2), n2 = _png_size(two)
    assert w2 == w1 and h2 > h1 * 1.5 and n2 > n1
