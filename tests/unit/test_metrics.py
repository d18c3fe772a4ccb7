"""Tests of fedlink.metrics: event log, summary, report, console output."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from fedlink.metrics import (
    EventLog,
    RunProgress,
    human_bytes,
    human_seconds,
    print_summary,
    read_events,
    summarize,
    write_report,
    write_summary,
)

SVG_ROOT = "{http://www.w3.org/2000/svg}svg"


class FakeClock:
    """A clock the test advances by hand."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def ev(kind: str, elapsed: float, **fields: Any) -> dict[str, Any]:
    """A hand-made event."""
    return {"t": 1_700_000_000.0 + elapsed, "elapsed": elapsed, "kind": kind, **fields}


def hand_made_run() -> list[dict[str, Any]]:
    """A small run: 2 clients, 2 flushes, 3 accepted and 2 refused updates."""
    return [
        ev("run_started", 0.5, config={"run_name": "demo"}),
        ev("client_joined", 1.0, client_id="a", name="phone-a", num_examples=100),
        ev("client_joined", 1.1, client_id="b", name="phone-b", num_examples=50),
        ev("client_joined", 1.2, client_id="a", name="phone-a", num_examples=100),
        ev("task_issued", 1.5, client_id="a", task_id="t1", model_version=0),
        ev("download_finished", 2.0, client_id="a", task_id="t1", bytes=4000),
        ev("download_finished", 2.1, client_id="b", task_id="t2", bytes=4000),
        ev("update_accepted", 3.0, client_id="a", task_id="t1", base_version=0, staleness=0,
           num_examples=100, steps_completed=10, bytes_up=1000, weight=100.0),
        ev("update_accepted", 3.5, client_id="b", task_id="t2", base_version=0, staleness=0,
           num_examples=50, steps_completed=5, bytes_up=1000, weight=25.0),
        ev("flush", 4.0, model_version=1, num_updates=2, accuracy=0.6, loss=1.2,
           bytes_up=2000, bytes_down=8000, round_seconds=3.5),
        ev("update_refused", 5.0, client_id="b", task_id="t3", reason="too stale",
           reason_code="too_stale", code="FAILED_PRECONDITION", bytes_up=500),
        ev("update_refused", 5.1, client_id="a", task_id="t4", reason="too stale",
           reason_code="too_stale", code="FAILED_PRECONDITION"),
        ev("download_finished", 5.5, client_id="a", task_id="t5", bytes=300),
        ev("update_accepted", 6.0, client_id="a", task_id="t5", base_version=0, staleness=1,
           num_examples=100, steps_completed=10, bytes_up=250, weight=50.0),
        ev("flush", 7.0, model_version=2, num_updates=1, accuracy=0.55, loss=1.4,
           bytes_up=750, bytes_down=300, round_seconds=3.0),
        ev("client_timeout", 8.0, client_id="b"),
        ev("client_left", 8.5, client_id="a"),
        ev("run_finished", 10.5, reason="max_rounds"),
    ]


# --- event log ---------------------------------------------------------------------------


def test_event_log_writes_jsonl_readable_back_with_numpy_values(tmp_path: Path) -> None:
    path = tmp_path / "run" / "events.jsonl"
    with EventLog(path) as log:
        log.emit("run_started", config={"lr": np.float32(0.5), "seed": np.int64(7)})
        log.emit("flush", model_version=np.int32(3), accuracy=np.float64(0.875),
                 weights=np.arange(3, dtype=np.float32), ok=np.bool_(True),
                 loss=float("nan"), shape=(2, 3))
    for line in path.read_text().splitlines():
        json.loads(line)  # every line is strict JSON on its own
    events = read_events(path)
    assert events == log.events
    assert [e["kind"] for e in events] == ["run_started", "flush"]
    assert events[0]["config"] == {"lr": 0.5, "seed": 7}
    flush = events[1]
    assert flush["model_version"] == 3 and flush["accuracy"] == 0.875
    assert flush["weights"] == [0.0, 1.0, 2.0] and flush["ok"] is True
    assert flush["loss"] is None and flush["shape"] == [2, 3]
    assert isinstance(flush["t"], float) and flush["elapsed"] >= events[0]["elapsed"] >= 0


def test_emit_adds_time_fields_and_filters_by_kind() -> None:
    clock, wall = FakeClock(100.0), FakeClock(1_700_000_000.0)
    log = EventLog(None, clock=clock, wall_clock=wall)
    clock.now, wall.now = 102.5, 1_700_000_002.5
    event = log.emit("client_joined", client_id="a", name="phone", num_examples=10)
    assert event == {"t": 1_700_000_002.5, "elapsed": 2.5, "kind": "client_joined",
                     "client_id": "a", "name": "phone", "num_examples": 10}
    log.emit("client_left", client_id="a")
    assert [e["kind"] for e in log.of_kind("client_left")] == ["client_left"]
    assert len(log.events) == 2 and log.path is None


def test_emit_flushes_each_line_before_returning(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        log.emit("run_started", config={})
        assert len(read_events(path)) == 1


def test_emit_rejects_reserved_fields_unserialisable_values_and_closed_log() -> None:
    log = EventLog(None)
    with pytest.raises(ValueError, match="reserved"):
        log.emit("flush", elapsed=1.0)
    with pytest.raises(TypeError):
        log.emit("flush", blob=object())
    log.close()
    with pytest.raises(ValueError, match="closed"):
        log.emit("flush")
    assert log.events == []


def test_event_log_appends_to_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        log.emit("run_started", config={})
    with EventLog(path) as log:
        log.emit("run_finished", reason="done")
    assert [e["kind"] for e in read_events(path)] == ["run_started", "run_finished"]


def test_concurrent_emits_from_threads_give_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    threads, per_thread = 8, 200
    payload = "x" * 2000  # long lines make interleaving visible if writes were not locked
    with EventLog(path) as log:
        def work(n: int) -> None:
            for i in range(per_thread):
                log.emit("client_joined", client_id=f"c{n}", num_examples=i, name=payload)

        workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    lines = path.read_text().splitlines()
    assert len(lines) == threads * per_thread
    events = [json.loads(line) for line in lines]
    assert all(e["name"] == payload for e in events)
    for n in range(threads):
        mine = [e["num_examples"] for e in events if e["client_id"] == f"c{n}"]
        assert mine == list(range(per_thread))
    assert len(log.events) == threads * per_thread


def test_read_events_ignores_torn_last_line_but_not_corruption(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    good = json.dumps(ev("run_started", 0.0, config={}))
    path.write_text(good + "\n" + '{"t": 1.0, "elap')
    assert [e["kind"] for e in read_events(path)] == ["run_started"]
    path.write_text(good + "\n{not json}\n" + good + "\n")
    with pytest.raises(ValueError, match=":2:"):
        read_events(path)


# --- summary -----------------------------------------------------------------------------


def test_summary_matches_hand_computed_values() -> None:
    config = {"run_name": "demo", "rounds": 2}
    summary = summarize(hand_made_run(), config)
    assert summary["run_name"] == "demo"
    assert summary["final_accuracy"] == 0.55
    assert summary["final_loss"] == 1.4
    assert summary["best_accuracy"] == 0.6
    assert summary["final_model_version"] == 2
    assert summary["rounds"] == 2
    # from the first task (1.5), not the run's start (0.5): the wait for clients is apart
    assert summary["wall_seconds"] == pytest.approx(9.0)  # 10.5 - 1.5
    assert summary["startup_seconds"] == pytest.approx(1.0)
    assert summary["bytes_up"] == 1000 + 1000 + 500 + 250
    assert summary["bytes_down"] == 4000 + 4000 + 300
    assert summary["tasks_issued"] == 1
    assert summary["updates_accepted"] == 3
    assert summary["updates_refused"] == 2
    assert summary["refusal_reasons"] == {"too stale": 2}
    assert summary["refusal_codes"] == {"FAILED_PRECONDITION": 2}
    assert summary["refusals_by_code"] == {"too_stale": {"count": 2, "example": "too stale"}}
    assert summary["mean_staleness"] == pytest.approx(1 / 3)
    assert summary["max_staleness"] == 1
    assert summary["clients"] == 2
    assert summary["clients_left"] == 1
    assert summary["client_timeouts"] == 1
    assert summary["finish_reason"] == "max_rounds"
    assert summary["config"] == config


def test_summary_of_unfinished_and_empty_runs() -> None:
    unfinished = [e for e in hand_made_run() if e["kind"] != "run_finished"]
    assert summarize(unfinished, {})["wall_seconds"] == pytest.approx(7.0)  # 8.5 - 1.5
    empty = summarize([], {})
    assert empty["rounds"] == 0 and empty["wall_seconds"] == 0.0
    assert empty["final_accuracy"] is None and empty["best_accuracy"] is None
    assert empty["bytes_up"] == 0 and empty["refusal_reasons"] == {}
    assert empty["run_name"] is None


def test_write_summary_is_sorted_indented_json(tmp_path: Path) -> None:
    summary = summarize(hand_made_run(), {"run": {"name": "nested"}})
    path = tmp_path / "summary.json"
    write_summary(path, summary)
    text = path.read_text()
    assert json.loads(text) == summary and summary["run_name"] == "nested"
    assert text == json.dumps(summary, indent=2, sort_keys=True) + "\n"
    assert not list(tmp_path.glob("*.tmp"))


# --- report ------------------------------------------------------------------------------


def test_report_writes_markdown_and_svg_plots(tmp_path: Path) -> None:
    events = hand_made_run()
    run_dir = tmp_path / "run"
    path = write_report(run_dir, events, summarize(events, {"run_name": "demo"}))
    assert path == run_dir / "report.md"
    text = path.read_text()
    assert text.startswith("# Run report: demo")
    for plot in ("accuracy_vs_round.svg", "accuracy_vs_time.svg", "loss_vs_round.svg"):
        assert ET.parse(run_dir / plot).getroot().tag == SVG_ROOT
        assert f"]({plot})" in text
    assert "| too_stale | 2 | too stale |" in text  # one row per refusal code
    assert "| 1 | 1 | 0.6000 | 1.2000 | 2 | 2.0 kB | 8.0 kB | 3.50 s |" in text
    assert "| 2 | 2 | 0.5500 | 1.4000 | 1 | 750 B | 300 B | 3.00 s |" in text
    assert "| Bytes up | 2.8 kB |" in text


def test_report_without_loss_skips_loss_plot(tmp_path: Path) -> None:
    events = [ev("flush", 1.0, model_version=1, num_updates=1, accuracy=0.5, loss=None,
                 bytes_up=1, bytes_down=1, round_seconds=1.0)]
    write_report(tmp_path, events, summarize(events, {}))
    assert (tmp_path / "accuracy_vs_round.svg").exists()
    assert not (tmp_path / "loss_vs_round.svg").exists()
    assert "loss_vs_round.svg" not in (tmp_path / "report.md").read_text()


def test_zero_flush_run_report_says_so(tmp_path: Path) -> None:
    events = [e for e in hand_made_run() if e["kind"] != "flush"]
    run_dir = tmp_path / "empty-run"
    path = write_report(run_dir, events, summarize(events, {}))
    text = path.read_text()
    assert text.startswith("# Run report: empty-run")
    assert "No rounds completed" in text
    assert not list(run_dir.glob("*.svg"))
    assert ".svg" not in text
    assert write_report(tmp_path / "nothing", [], summarize([], {})).exists()


def test_report_escapes_pipes_in_refusal_reasons(tmp_path: Path) -> None:
    events = [ev("update_refused", 1.0, client_id="a", task_id="t", reason="a|b",
                 code="INVALID_ARGUMENT")]
    text = write_report(tmp_path, events, summarize(events, {})).read_text()
    assert "| invalid_update | 1 | a\\|b |" in text


# --- console -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "expected"),
    [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (1_234_567, "1.2 MB"),
     (999_950, "1.0 MB"), (3 * 10**9, "3.0 GB")],
)
def test_human_bytes(n: int, expected: str) -> None:
    assert human_bytes(n) == expected


def test_human_bytes_rejects_negative_and_non_finite() -> None:
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            human_bytes(bad)


def test_human_seconds() -> None:
    assert human_seconds(None) == "-"
    assert human_seconds(0.4213) == "0.42 s"
    assert human_seconds(12.34) == "12.3 s"
    assert human_seconds(245) == "4m 05s"
    assert human_seconds(7380) == "2h 03m"


def test_run_progress_draws_on_a_terminal() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=140)
    with RunProgress(5, console=console) as progress:
        progress.update(2, 0.5, 1_234_567, 10_000)
    out = buf.getvalue()
    assert "round 2/5" in out and "0.5000" in out and "1.2 MB" in out and "10.0 kB" in out


@pytest.mark.parametrize("terminal", [True, False])
def test_run_progress_silent_when_disabled_or_not_a_terminal(terminal: bool) -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=terminal)
    with RunProgress(3, console=console, enabled=not terminal) as progress:
        for r in range(1, 4):
            progress.update(r, 0.1 * r, 100 * r, 200 * r)
    assert buf.getvalue() == ""


def test_print_summary_shows_key_figures_and_report_path(tmp_path: Path) -> None:
    """The report's path when it was written, else (``--no-report``) the summary's: never a
    path to a file that does not exist."""
    summary = summarize(hand_made_run(), {"run_name": "demo"})
    for written in (False, True):
        if written:
            (tmp_path / "report.md").write_text("# report\n")
        buf = io.StringIO()
        print_summary(summary, tmp_path, console=Console(file=buf, width=200))
        out = buf.getvalue()
        assert "demo" in out and "0.5500" in out and "2.8 kB" in out
        assert "Ended" in out and str(summary["finish_reason"]) in out
        assert (str(tmp_path / "report.md") in out) is written
        assert (str(tmp_path / "summary.json") in out) is not written


def test_metrics_imports_neither_grpc_nor_torch_nor_matplotlib_eagerly() -> None:
    code = (
        "import sys, fedlink.metrics\n"
        "bad = [m for m in ('grpc', 'torch', 'matplotlib') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.strip() == ""


def test_report_has_a_per_profile_network_table_when_the_summary_has_one(tmp_path: Path) -> None:
    summary = {"run_name": "net", "network": {"profiles": {
        "3g": {"clients": 4, "accepted": 20, "refused": 1, "bytes_up": 2_000_000,
               "bytes_down": 1_000_000, "resets": 3, "blackouts": 0, "stalled_s": 0.0,
               "retries": 5, "network_seconds": 12.5}}}}

    report = write_report(tmp_path, [], summary).read_text()

    assert "## Network" in report
    row = next(line for line in report.splitlines() if line.startswith("| 3g |"))
    assert "| 4 | 20 | 1 | 2.0 MB | 1.0 MB | 3 |" in row
    assert "| 5 |" in row
