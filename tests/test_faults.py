"""Fault injection (raylane.launchers.faults) on the local runner, without Ray: the holds and stops that the
end-to-end preemption tests rely on to be independent of the machine's speed."""
from raylane.launchers.faults import Faults
from workloads.train_lm import LocalHooks, train

CONFIG = {"max_steps": 30, "checkpoint_every": 10, "batch_size": 4, "warmup_steps": 2, "eval_every": 0,
          "corpus": {"max_bytes": 50_000}, "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16}}


def polled_steps(root, answer):
    """Local hooks whose stop poll records the last reported step at every call and answers ``answer(polls)``."""
    polls = []

    def stop():
        polls.append(hooks.reports[-1][0] if hooks.reports else 0)
        return answer(polls)

    hooks = LocalHooks(root, stop=stop)
    return hooks, polls


def test_hold_at_step_holds_a_fresh_attempt_until_asked_then_a_resume_trains_through(tmp_path):
    faults = Faults(marker_dir=str(tmp_path / "markers"), hold_at_step=10)
    # Asked to stop at the third poll after step 10: the attempt polls without training until then.
    hooks, polls = polled_steps(tmp_path, lambda polls: polls.count(10) == 3)
    result = train(CONFIG, hooks=faults(hooks))
    assert (result.status, result.step) == ("yielded", 10)
    assert polls.count(10) == 3 and max(polls) == 10

    # Resumed from step 10, nothing asks it to stop: it does not hold.
    hooks, polls = polled_steps(tmp_path, lambda polls: False)
    result = train(CONFIG, hooks=faults(hooks))
    assert (result.status, result.step, result.resumed_from_step) == ("finished", 30, 10)
    assert polls == [0, *range(11, 30)]  # one poll before each step (none reported yet before the first)
