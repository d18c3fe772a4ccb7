"""A restarted coordinator takes back what its earlier process sent for unsettled tasks
(``DownloadLedger.restore``), so that a download used after the restart is not counted
wasted."""

from __future__ import annotations

from pathlib import Path

from fedlink.coordinator.downloads import MODEL, RESTORED_KINDS, DownloadLedger
from fedlink.metrics.events import EventLog


def _finished(task: str, sent: int, offset: int = 0, completed: bool = True,
              client: str = "c0") -> dict[str, object]:
    return {"kind": "download_finished", "client_id": client, "task_id": task, "bytes": sent,
            "offset": offset, "delta": False, "evaluation": False, "completed": completed}


def test_a_download_cut_before_the_restart_and_resumed_after_it_is_used_whole() -> None:
    ledger = DownloadLedger()
    ledger.restore([_finished("t1", 500, completed=False)])  # cut: its size is not known
    ledger.sent("c0", "t1", MODEL, 1000, 500, to_end=True)  # the rest, after the restart
    used = ledger.settle("c0", "t1", used=True)
    assert used is not None and (used["bytes"], used["wasted"]) == (1000, 0)


def test_only_tasks_left_unsettled_are_taken_back() -> None:
    ledger = DownloadLedger()
    ledger.restore([
        _finished("t1", 1000), {"kind": "update_accepted", "client_id": "c0", "task_id": "t1"},
        _finished("t2", 1000),  # open at the stop
        _finished("t3", 1000, client="gone"), {"kind": "client_left", "client_id": "gone"},
    ])
    assert len(ledger) == 1
    used = ledger.settle("c0", "t2", used=True)
    assert used is not None and (used["bytes"], used["wasted"]) == (1000, 0)


def test_an_earlier_log_with_a_malformed_line_still_restores(tmp_path: Path) -> None:
    """A log an older version left with a line glued onto a torn one: the line is passed
    over, not a crash at the restart."""
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        log.emit("download_finished", client_id="c0", task_id="t1", bytes=700, offset=0,
                 delta=False, evaluation=False, completed=True)
    with path.open("a", encoding="utf-8") as f:
        f.write('{"t": 1, "elapsed": 0.5, "ki{"t": 2, "elapsed": 1, "kind": "flush"}\n')
    with EventLog(path) as log:
        ledger = DownloadLedger()
        ledger.restore(log.earlier(RESTORED_KINDS))
    used = ledger.settle("c0", "t1", used=True)
    assert used is not None and used["bytes"] == 700
