"""The cycle's working snapshot (issue 14, item 7): capacity, quota ledger and holdings change together through
``Working.add``/``remove`` and are put back, exactly, by the revert that ``checkpoint``/``trial_removal`` return."""
import random

from raylane.scheduling import Capacity, QuotaLedger, Resources, find_victims, place
from raylane.scheduling.admission import ADMISSIONS
from raylane.scheduling.ordering import ORDERINGS
from raylane.scheduling.preemption import PreemptionContext
from raylane.scheduling.working import Holdings, Working

from .builders import PROD, PRETRAIN, SWEEP, make_state, node, obj, running, team, wl


def _books(work: Working):
    """Everything a revert must restore, compared by value (floats included, exactly)."""
    cap, ledger = work.cap, work.ledger
    held = work.holdings
    return (dict(cap.free), dict(cap.dev), {k: list(v) for k, v in cap._buckets.items()}, list(cap._keys),
            cap.total_free(), dict(ledger.usage), dict(ledger.pool_used),
            None if held is None else (dict(held.running), dict(held.fresh)))


def _state(fractional=True):
    nodes = [node(f"n{i}").gpus(4) for i in range(1, 5)]
    teams = [team("nlp", gpu=6, borrow=4, lend=2), team("cv", gpu=6, borrow=4)]
    g = 0.3 if fractional else 1
    runs = [running(wl(f"a{i}").team("nlp").gpus(g).workers(2).cls(SWEEP), on=(f"n{1 + i % 4}", f"n{1 + (i + 1) % 4}"))
            for i in range(6)]
    runs += [running(wl(f"b{i}").team("cv").gpus(g).cls(PRETRAIN), on=(f"n{1 + i % 4}",)) for i in range(5)]
    return make_state(nodes, teams, running=runs)


def _working(st, holdings=True):
    snap = st.snapshot()
    cap = Capacity(snap.nodes)
    ledger = QuotaLedger(snap.teams, snap.usage)
    return Working(cap, ledger, Holdings(snap.leases) if holdings else None), snap


def test_trial_removal_reverts_everything_exactly():
    work, snap = _working(_state())
    before = _books(work)
    revert = work.trial_removal(snap.leases[:4])
    assert _books(work) != before  # something changed: the test would see a revert that does nothing
    revert()
    assert _books(work) == before


def test_revert_leaves_no_float_residue_after_many_adds_and_removes():
    # 0.3-GPU leases removed and added back in a shuffled order thousands of times: arithmetic inverses would
    # drift usage by ulps (0.1 + 0.2 - 0.2 != 0.1); a revert restores the recorded values.
    work, snap = _working(_state())
    before = _books(work)
    rnd = random.Random(7)
    revert = work.checkpoint()
    out = []
    for _ in range(3000):
        if out and rnd.random() < 0.5:
            work.add(out.pop(rnd.randrange(len(out))))
        else:
            l = rnd.choice(snap.leases)
            if l not in out:
                work.remove(l)
                out.append(l)
    revert()
    assert _books(work) == before


def test_checkpoints_nest():
    work, snap = _working(_state())
    before = _books(work)
    outer = work.trial_removal(snap.leases[:2])
    middle = _books(work)
    inner = work.trial_removal(snap.leases[2:5])
    assert _books(work) != middle
    inner()
    assert _books(work) == middle
    outer()
    assert _books(work) == before
    assert work.cap._log is None and work.ledger._log is None and work.holdings._log is None  # nothing recorded after


def test_add_is_the_inverse_of_remove_on_devices():
    # A remove gives back exactly the lease's devices; adding the lease takes those same devices again.
    work, snap = _working(_state(), holdings=False)
    lease = snap.leases[0]
    free, dev = dict(work.cap.free), dict(work.cap.dev)
    work.remove(lease)
    assert work.add(lease) == lease.devices
    assert work.cap.free == free and work.cap.dev == dev


def test_a_cordoned_node_gives_and_takes_nothing():
    st = _state(fractional=False)
    st.set_schedulable("n1", False)
    work, snap = _working(st, holdings=False)
    on_n1 = next(l for l in snap.leases if "n1" in l.placement)
    before = _books(work)
    work.remove(on_n1)
    assert work.cap.free["n1"] == Resources()  # nothing offered on a cordoned node, even once a lease there is gone
    work.add(on_n1)
    assert _books(work) == before  # and adding it back takes nothing there: no negative free capacity


def test_find_victims_leaves_the_working_snapshot_as_it_was():
    # Random states and preemptors: whether or not a victim set is found, capacity, ledger and holdings are
    # unchanged afterwards, and the set found does make the preemptor fit.
    rnd = random.Random(3)
    admission = ADMISSIONS.get("quota")
    order = ORDERINGS.get("priority")
    for trial in range(40):
        st = _random_state(rnd)
        work, snap = _working(st)
        ctx = PreemptionContext(snap.leases, work.ledger, admission, order, snap.config, 10_000.0)
        work.holdings = ctx.holdings
        pre = obj(wl("p").team(rnd.choice(["nlp", "cv"])).gpus(rnd.choice([0.5, 1, 2])).workers(rnd.randint(1, 4))
                  .cls(PROD))
        def fits():
            return (admission.check(work.ledger, pre.team, pre.gang.total) is None
                    and place(pre.gang, work.cap, None) is not None)

        before = _books(work)
        candidates = sorted((l for l in snap.leases), key=ctx.cost)
        chosen = find_victims(pre, candidates, work, ctx, fits)
        assert _books(work) == before, trial
        if chosen:
            revert = work.trial_removal(chosen)
            assert fits(), trial
            revert()
            assert _books(work) == before, trial


def _random_state(rnd):
    nodes = [node(f"n{i}").gpus(4) for i in range(1, 5)]
    teams = [team("nlp", gpu=8, borrow=8), team("cv", gpu=8, borrow=8)]
    runs, free = [], {f"n{i}": 4.0 for i in range(1, 5)}
    for i in range(rnd.randint(3, 12)):
        g = rnd.choice([0.25, 0.5, 1, 2])
        nid = rnd.choice([n for n, f in free.items() if f >= g] or [None])
        if nid is None:
            continue
        free[nid] -= g
        runs.append(running(wl(f"r{i}").team(rnd.choice(["nlp", "cv"])).gpus(g)
                            .cls(rnd.choice([SWEEP, PRETRAIN])), on=(nid,), since=0.0))
    return make_state(nodes, teams, running=runs)


def test_capacity_counts_what_gives_back_so_a_cycle_may_trust_an_earlier_no_room():
    # The cycle remembers a gang shape that found no room until ``grown`` moves (cycle._Walk._place_now).
    cap = Capacity([node("n1").gpus(2).obj(), node("n2").gpus(1).obj()])
    one = Resources(gpu=1)
    big = wl("big").gpus(2).workers(2).obj().gang
    assert place(big, cap) is None and cap.grown == 0
    taken = cap.take_placement(("n1",), one)
    assert cap.grown == 0  # a take never makes room
    mark = cap.mark()
    cap.take_placement(("n2",), one)
    cap.rollback(mark)  # putting back what a trial took gives room back
    assert cap.grown == 1
    cap.give_placement(("n1",), one, taken)
    assert cap.grown == 2 and place(wl("w").gpus(2).obj().gang, cap) == ("n1",)
    cap.assign("n2", Resources(), (0.0,))  # less: not counted
    assert cap.grown == 2
    cap.assign("n2", one, (1.0,))  # more: counted
    assert cap.grown == 3 and cap.copy().grown == 0
