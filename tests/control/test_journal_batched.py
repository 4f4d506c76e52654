"""The journal's group commit (``Journal(batched=True)``), as the control actor uses it: entries appended into one
transaction are durable only once committed, a second connection (another process, or the actor after a crash)
sees exactly the committed ones, and an unbatched journal commits each append. No Ray."""
from raylane.control.journal import Journal


def kinds(path):
    j = Journal(path)
    try:
        return [e.kind for e in j.replay()]
    finally:
        j.close()


def test_batched_entries_are_durable_only_once_committed(tmp_path):
    path = str(tmp_path / "j.db")
    j = Journal(path, batched=True)
    assert not j.pending
    j.append("submitted", "w1", spec={})
    j.append("admitted", "w1")
    assert j.pending
    assert [e.kind for e in j.entries_for("w1")] == ["submitted", "admitted"]  # its own connection sees them
    assert kinds(path) == []  # a restart now would replay none of them: none was acted on
    j.commit()
    assert not j.pending and kinds(path) == ["submitted", "admitted"]
    j.commit()  # nothing pending: nothing to do
    j.append("finished", "w1")
    j.close()  # closing commits what is pending
    assert kinds(path) == ["submitted", "admitted", "finished"]


def test_an_unbatched_journal_commits_each_append(tmp_path):
    path = str(tmp_path / "j.db")
    j = Journal(path)
    j.append("submitted", "w1", spec={})
    assert not j.pending and kinds(path) == ["submitted"]
    j.close()


def test_sequence_numbers_run_on_across_commits(tmp_path):
    j = Journal(str(tmp_path / "j.db"), batched=True)
    seqs = [j.append("event", "w", n=i).seq for i in range(3)]
    j.commit()
    seqs.append(j.append("event", "w", n=3).seq)
    j.commit()
    assert seqs == [1, 2, 3, 4]
    j.close()
