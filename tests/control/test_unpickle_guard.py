"""raylane.control.unpickle without Ray's cluster: what the control plane's process unpickles (plain data and
exception classes) and what it refuses before calling it. The same guard on a live control actor, reached through
its handle with crafted arguments: tests/control/test_redteam.py."""
from __future__ import annotations

import datetime
import os
import pickle

import pytest

from raylane.control import unpickle
from raylane.errors import PermissionDeniedError


class Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_plain_data_comes_through_as_it_was():
    value = {"spec": {"name": "x", "gang": {"workers": 2}}, "n": 3, "f": 1.5, "t": (1, 2), "s": {1, 2},
             "fs": frozenset({3}), "b": b"\x00", "none": None, "when": datetime.datetime(2026, 12, 1),
             "ba": bytearray(b"xy")}
    for proto in (2, 4, 5):
        assert unpickle.loads(pickle.dumps(value, protocol=proto)) == value


def test_exception_classes_of_python_ray_and_raylane_come_through():
    err = unpickle.loads(pickle.dumps(PermissionDeniedError("no")))
    assert isinstance(err, PermissionDeniedError) and str(err) == "no"
    assert isinstance(unpickle.loads(pickle.dumps(ValueError("v"))), ValueError)


def test_a_pickle_that_names_a_function_is_refused_before_it_runs(tmp_path):
    unpickle.refusals()
    target = tmp_path / "ran"
    with pytest.raises(unpickle.Refused, match="posix.mkdir"):
        unpickle.loads(pickle.dumps(Evil(str(target))))
    assert not target.exists()
    names, more = unpickle.refusals()
    assert names == ["posix.mkdir"] and more == 0
    assert unpickle.refusals() == ([], 0)  # drained


@pytest.mark.parametrize("module,name", [("builtins", "eval"), ("builtins", "exec"), ("builtins", "getattr"),
                                         ("os", "system"), ("subprocess", "Popen"),
                                         ("raylane.control.gate", "Gate"), ("builtins", "object.__subclasses__"),
                                         ("raylane.errors", "PermissionDeniedError.__init__")])
def test_names_outside_the_allowed_ones_are_refused(module, name):
    # GLOBAL opcode by hand: whatever the pickle names, find_class decides.
    data = b"c" + module.encode() + b"\n" + name.encode() + b"\n."
    with pytest.raises(unpickle.Refused):
        unpickle.loads(data)
    unpickle.refusals()


def test_drain_writes_one_audit_row_for_many_refusals(tmp_path):
    rows = []
    for i in range(unpickle.KEEP + 5):
        with pytest.raises(unpickle.Refused):
            unpickle.loads(pickle.dumps(Evil(str(tmp_path / f"d{i}"))))
    unpickle.drain(lambda *row: rows.append(row))
    assert len(rows) == 1
    what, outcome, reason = rows[0]
    assert (what, outcome) == ("unpickle", "refused")
    assert f"{unpickle.KEEP + 5} call(s)" in reason and "posix.mkdir" in reason and "(and 5 more)" in reason
    unpickle.drain(lambda *row: rows.append(row))
    assert len(rows) == 1  # nothing new: no row


def test_install_guards_rays_modules_and_uninstall_puts_them_back():
    pytest.importorskip("ray")
    import ray._private.serialization as serialization

    before = serialization.pickle
    unpickle.install()
    try:
        assert unpickle.installed()
        assert serialization.pickle.dumps is before.dumps  # the rest of ray.cloudpickle is Ray's own
        with pytest.raises(unpickle.Refused):
            serialization.pickle.loads(pickle.dumps(Evil("/nonexistent/x")))
        unpickle.install()  # idempotent
    finally:
        unpickle.uninstall()
        unpickle.refusals()
    assert serialization.pickle is before and not unpickle.installed()


def test_raylanes_enumerations_come_through_and_their_other_names_do_not():
    from raylane.control.api import ReportKind
    from raylane.control.records import State

    kind = next(iter(ReportKind))
    assert unpickle.loads(pickle.dumps({"kind": kind, "state": State.PENDING})) == {"kind": kind,
                                                                                   "state": State.PENDING}
    for module, name in (("raylane.control.api", "ControlClient"), ("raylane.control.records", "Record"),
                         ("raylane.control.api", "ReportKind.__new__")):
        with pytest.raises(unpickle.Refused):
            unpickle.loads(b"c" + module.encode() + b"\n" + name.encode() + b"\n.")
    unpickle.refusals()
