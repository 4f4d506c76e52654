"""GPU devices on a real Ray cluster: the core's decisions on fractional gangs agree with Ray's placement.

One node with 2 logical GPUs. Each step asks the core (``cycle`` on a ``ClusterState`` built from Ray's node table,
as the control actor builds it) whether a gang fits, then asks Ray, with a placement group whose bundles are pinned
to the node the core chose (as the control actor reserves a gang): a gang the core admits must be placed by Ray,
one the core refuses must not be. The issue's example: two workers of 0.6 GPU leave 0.8 GPU free on the node but no
device with room for 0.5, and Ray agrees. Also, without Ray: the devices a lease holds are journaled with its
admission and read back on recovery.
"""
import pytest

ray = pytest.importorskip("ray")

from raylane.control.state import bundle_for  # noqa: E402
from raylane.control.state_nodes import nodes_from_ray  # noqa: E402
from raylane.control.journal import Entry  # noqa: E402
from raylane.control.records import Record, State  # noqa: E402
from raylane.scheduling import ClusterState, Gang, Resources, SchedulerConfig, Workload, WorkloadClass, cycle  # noqa: E402
from raylane.scheduling.types import node_devices  # noqa: E402
from tests.raytest import start_cluster, stop_cluster, wait_for  # noqa: E402

JOB = WorkloadClass("job", priority=10, preemptible=False)


def gang_of(wid: str, workers: int, gpu: float, t: float) -> Workload:
    return Workload(wid, "team", JOB, Gang(workers, Resources(gpu=gpu, cpu=0.25), "pack"), t)


@pytest.mark.ray
def test_core_and_ray_agree_on_fractional_gangs():
    from ray.util.placement_group import placement_group, remove_placement_group

    cluster = start_cluster(gpu_nodes=(("gpu-a", ["gpu-sim"]),), gpus=2, cpus=4)
    groups = []
    try:
        ray.init(address=cluster.address, namespace="raylane-devices-test", log_to_driver=False)
        gpu_nodes = [n for n in nodes_from_ray(ray.nodes()) if n.capacity.gpu > 0]
        assert [n.devices for n in gpu_nodes] == [(1.0, 1.0)]  # one device per GPU Ray counts
        nid = gpu_nodes[0].id
        st = ClusterState(gpu_nodes, {}, SchedulerConfig(admission="none", backfill="none"))

        def core_admits(w: Workload):
            st.enqueue(w)
            res = cycle(st.snapshot(), w.submit_time)
            if not res.admitted:
                st.dequeue(w.id)
                return None
            (a,) = res.admitted
            st.start(a, w.submit_time)
            return a

        def ray_places(w: Workload, node_id: str, wait_s: float) -> bool:
            pg = placement_group([bundle_for(w.gang.per_worker)] * w.gang.workers, strategy="PACK",
                                 bundle_label_selector=[{"ray.io/node-id": node_id}] * w.gang.workers)
            groups.append(pg)
            ready, _ = ray.wait([pg.ready()], timeout=wait_s)
            return bool(ready)

        # 1. A gang of two 0.6 GPU workers: one per device (0.6 + 0.6 > 1), as Ray's rule has it.
        a = core_admits(gang_of("a", 2, 0.6, 1.0))
        assert a is not None and a.placement == (nid, nid) and sorted(a.devices) == [(0,), (1,)]
        assert ray_places(a.workload, nid, wait_s=60), "Ray did not place the gang the core admitted"
        assert st.nodes[nid].free.gpu == pytest.approx(0.8) and node_devices(st.nodes[nid]) == (0.4, 0.4)

        # 2. A gang of two 0.4 GPU workers fits, one on each device, in the core and in Ray; when it ends, each
        #    device is back to exactly 0.4 free.
        c = core_admits(gang_of("c", 2, 0.4, 2.0))
        assert c is not None and c.placement == (nid, nid) and sorted(c.devices) == [(0,), (1,)]
        assert ray_places(c.workload, nid, wait_s=60), "Ray did not place the gang the core admitted"
        assert node_devices(st.nodes[nid]) == (0.0, 0.0)
        st.finish("c", 3.0)
        remove_placement_group(groups.pop())
        assert node_devices(st.nodes[nid]) == (0.4, 0.4)
        wait_for(lambda: abs(ray.available_resources().get("GPU", 0) - 0.8) < 1e-6, what="0.8 GPU free in Ray")

        # 3. 0.8 GPU free, but no device has 0.5: the core refuses, and Ray cannot place it either. (Last: Ray
        #    keeps the share of a pinned bundle it could not place even after its group is removed.)
        b = gang_of("b", 1, 0.5, 4.0)
        assert core_admits(b) is None
        assert not ray_places(b, nid, wait_s=5), "Ray placed a 0.5 GPU bundle the core said does not fit"
    finally:
        for pg in groups:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - the cluster is stopped next anyway
                pass
        stop_cluster(cluster)


def test_devices_are_journaled_with_the_admission_and_cleared_on_requeue():
    rec = Record("w1", {"team": "t"}, 0.0)
    rec.apply(Entry(0, 1.0, "admitted", "w1", {"placement": ["n1", "n1"], "devices": [[0], [1]], "pg_name": "p"}))
    assert rec.state is State.ADMITTED and rec.devices == ((0,), (1,))
    rec.apply(Entry(0, 2.0, "requeued", "w1", {}))
    assert rec.devices == () and rec.placement == ()
    old = Record("w2", {"team": "t"}, 0.0)  # a journal written before devices were recorded
    old.apply(Entry(0, 1.0, "admitted", "w2", {"placement": ["n1"]}))
    assert old.devices == ()
