"""`raylane queue`'s rendering (no Ray): a drawn table for a short queue, plain aligned columns for a long one, the
same cells either way, a pipeline's stages under it."""
import io
import time

from rich.console import Console

from raylane.cli.cluster import QUEUE_COLUMNS, queue_cells, queue_table, queue_text


def row(wid, position=None, reason="", **kw):
    return {"id": wid, "team": "team-a", "class": "pretrain", "state": "PENDING", "resources": "1 x (1 GPU)",
            "waited_s": 3.4, "position": position, "reason": reason, "detail": None, **kw}


def rows():
    """The rows, made when a test runs: the ETA cell counts from now."""
    return [
        row("solo-1", 1, "team team-a uses 4 of 2 GPU nominal; this gang needs 2", eta_start=time.time() + 725),
        row("stage-b", 3, pipeline="pipe-1", stage="finetune"),
        row("pipe-1", None, kind="pipeline", state="RUNNING"),
        row("stage-a", None, pipeline="pipe-1", stage="pretrain", state="RUNNING"),
        row("other", 2, "", detail="waits for its input"),
    ]


def test_cells_put_each_pipelines_stages_under_it_in_their_order():
    cells = queue_cells(rows())
    assert [c[0] for c in cells] == ["solo-1", "pipe-1", " └ finetune (stage-b)", " └ pretrain (stage-a)", "other"]
    assert cells[0][5:] == ("3s", "1", "~12m", "team team-a uses 4 of 2 GPU nominal; this gang needs 2")
    assert cells[-1][6:] == ("2", "-", "waits for its input")
    assert all(len(c) == len(QUEUE_COLUMNS) for c in cells)


def test_plain_columns_align_and_keep_every_cell_whole():
    lines = queue_text(rows()).splitlines()
    assert lines[0].split() == list(QUEUE_COLUMNS)
    starts = [lines[0].index(col) for col in QUEUE_COLUMNS]
    for line, cells in zip(lines[1:], queue_cells(rows())):
        for start, cell in zip(starts, cells):
            assert line[start:start + len(cell)] == cell, (line, cell)


def test_the_drawn_table_holds_the_same_cells():
    out = io.StringIO()
    Console(file=out, width=400).print(queue_table(rows()))
    text = out.getvalue()
    for cells in queue_cells(rows()):
        for cell in cells:
            assert cell.strip() in text


def test_the_eta_cell_says_in_how_long_the_forecast_start_is():
    from raylane.cli.cluster import eta_cell

    assert [eta_cell(None, 0), eta_cell(30, 0), eta_cell(600, 0), eta_cell(5400, 0), eta_cell(2 * 86400, 0)] == [
        "-", "now", "~10m", "~1.5h", "~2.0d"]
