"""``fedlink compare``: time to target, speed-up over the first run, the report and its plots."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fedlink.cli import main
from fedlink.errors import ConfigError
from fedlink.metrics import EventLog, summarize, write_summary
from fedlink.metrics.compare import COMPARE_FILENAME, load_run, speedups, write_comparison


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(root: Path, name: str, flushes: list[tuple[float, float]], refused: int = 0,
         first_task: float | None = None, **summary: object) -> Path:
    """A run folder whose flushes come at (seconds, accuracy), each after one 1000 B update
    (the first task issued at ``first_task`` seconds; ``summary``: entries it adds)."""
    clock = _Clock()
    run_dir = root / name
    with EventLog(run_dir / "events.jsonl", clock=clock, wall_clock=clock) as log:
        log.emit("run_started", config={})
        if first_task is not None:
            clock.now = first_task
            log.emit("task_issued", client_id="c", task_id="t0", model_version=0)
        for version, (seconds, accuracy) in enumerate(flushes, start=1):
            clock.now = seconds
            log.emit("update_accepted", client_id="c", task_id=f"t{version}", bytes_up=1000,
                     staleness=0)
            log.emit("flush", model_version=version, accuracy=accuracy, num_updates=1)
        clock.now += 1.0  # refusals after the last flush
        for i in range(refused):
            log.emit("update_refused", client_id="c", task_id=f"r{i}", code="FAILED_PRECONDITION",
                     reason_code="too_stale",
                     reason=f"too stale: task 'r{i}' was for version {i}", bytes_up=500)
        log.emit("run_finished", reason="done")
        events = log.events
    write_summary(run_dir / "summary.json",
                  {**summarize(events, {"run": {"name": name}}), **summary})
    return run_dir


def test_time_to_target_and_speedup_against_the_first_run(tmp_path: Path) -> None:
    sync = load_run(_run(tmp_path, "sync", [(10.0, 0.5), (20.0, 0.8), (30.0, 0.92)]))
    elastic = load_run(_run(tmp_path, "elastic", [(2.0, 0.6), (5.0, 0.91), (6.0, 0.95)],
                            refused=2))
    assert sync.seconds_to(0.9) == 30.0 and elastic.seconds_to(0.9) == 5.0
    assert speedups([sync, elastic], 0.9) == [1.0, 6.0]
    assert speedups([sync, elastic], 0.99) == [None, None]  # never reached
    assert elastic.megabytes_up == (0.001, 0.002, 0.003)

    report = write_comparison([sync, elastic], tmp_path / "cmp", 0.9).read_text()
    assert "| elastic | 5.00 s | 2 | 0.00 | 6.00x |" in report
    assert "| too_stale | 0 | 2 |" in report  # refusals by code
    for plot in ("accuracy_vs_time.svg", "accuracy_vs_version.svg", "accuracy_vs_bytes.svg"):
        root = ET.parse(tmp_path / "cmp" / plot).getroot()
        svg = "{http://www.w3.org/2000/svg}"
        assert len(root.findall(f".//{svg}polyline[@class='series']")) == 2  # one per run
        assert len(root.findall(f".//{svg}polyline[@class='reference']")) == 1  # the target
        legend = [t.text for t in root.iter(f"{svg}text") if t.text in ("sync", "elastic")]
        assert sorted(legend) == ["elastic", "sync"]


def test_the_command_prints_the_ratio_last(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    a = _run(tmp_path, "a", [(8.0, 0.7), (16.0, 0.9)])
    b = _run(tmp_path, "b", [(4.0, 0.9)])
    assert main(["compare", str(a), str(b), "--output", str(tmp_path / "out")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "time-to-target speed-up of b over a: 4.00x" in lines
    assert lines[-1] == f"comparison: {tmp_path / 'out' / COMPARE_FILENAME}"


def test_a_folder_that_is_not_a_run_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a run folder"):
        load_run(tmp_path)


def test_a_summary_written_before_refusal_codes_still_compares_by_kind_of_reason(
        tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "old", [(2.0, 0.95)], refused=2)
    summary = (run_dir / "summary.json").read_text()
    old = summary.replace('"refusals_by_code"', '"written_before_codes"')
    (run_dir / "summary.json").write_text(old)
    report = write_comparison([load_run(run_dir)], tmp_path / "cmp", 0.9).read_text()
    assert "| Reason | old |" in report
    assert "| too stale: task '...' was for version N | 2 |" in report


def test_times_count_from_the_first_task_and_a_virtual_run_is_timed_in_model_seconds(
        tmp_path: Path) -> None:
    """The wait for clients before the first task is not the run's (as in its
    ``wall_seconds``); a virtual run's times and run time are model seconds, and the report
    says so, instead of setting model seconds beside this machine's wall seconds."""
    real = load_run(_run(tmp_path, "real", [(12.0, 0.9)], first_task=2.0))
    virtual = load_run(_run(tmp_path, "virtual", [(30.0, 0.9)], first_task=0.0,
                            mode="virtual", model_seconds=31.0, wall_seconds=0.4))
    assert real.seconds_to(0.9) == 10.0 and real.run_seconds == pytest.approx(11.0)
    assert virtual.seconds_to(0.9) == 30.0 and virtual.run_seconds == 31.0
    report = write_comparison([real, virtual], tmp_path / "cmp", 0.9).read_text()
    assert "| virtual | 30.0 s | 1 | 0.00 | - | 0.900 | 31.0 s |" in report  # no speed-up
    assert "Virtual runs (virtual): their times are model seconds" in report
    assert speedups([real, virtual], 0.9) == [1.0, None]


def test_no_speed_up_joins_model_seconds_to_wall_seconds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real = _run(tmp_path, "real", [(12.0, 0.9)], first_task=0.0)
    virtual = _run(tmp_path, "virtual", [(30.0, 0.9)], first_task=0.0, mode="virtual",
                   model_seconds=31.0)
    assert main(["compare", str(real), str(virtual), "--output", str(tmp_path / "out")]) == 0
    assert ("time-to-target speed-up of virtual over real: n/a (model seconds against wall "
            "seconds)") in capsys.readouterr().out


def test_a_run_that_learned_nothing_sets_no_target_and_its_warning_is_repeated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its accuracy is its initial model's: as the best every run reached, it would make
    every run "reach" the target at once."""
    good = _run(tmp_path, "good", [(2.0, 0.5), (4.0, 0.9)])
    stuck = _run(tmp_path, "stuck", [(2.0, 0.12), (4.0, 0.12)], empty_flushes=2,
                 warning="no flush aggregated an update")
    assert main(["compare", str(good), str(stuck), "--output", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert "good: reached 0.900 after 4.0 s" in captured.out
    assert "stuck: reached 0.900 never" in captured.out
    assert "fedlink: warning: stuck: no flush aggregated an update" in captured.err
    report = (tmp_path / "out" / COMPARE_FILENAME).read_text()
    assert "## Warnings\n\n- **stuck**: no flush aggregated an update" in report
    assert main(["compare", str(stuck), "--output", str(tmp_path / "out2")]) != 0
    assert "no run learned anything (every flush left its model as it was): give --target" \
        in capsys.readouterr().err


def test_a_version_counts_from_when_it_was_made_not_when_it_was_evaluated(
        tmp_path: Path) -> None:
    """A served run reports a flush after central evaluation, by which time the next
    round's update may have come: neither its time nor its bytes are the version's."""
    clock = _Clock()
    run_dir = tmp_path / "served"
    with EventLog(run_dir / "events.jsonl", clock=clock, wall_clock=clock) as log:
        log.emit("task_issued", client_id="c", task_id="t0", model_version=0)
        clock.now = 1.0
        log.emit("update_accepted", client_id="c", task_id="t1", bytes_up=1000, staleness=0)
        clock.now = 1.5
        log.emit("update_accepted", client_id="c", task_id="t2", bytes_up=1000, staleness=0)
        clock.now = 3.0  # evaluation took 2 s
        log.emit("flush", model_version=1, accuracy=0.9, num_updates=1, made_elapsed=1.0)
        events = log.events
    write_summary(run_dir / "summary.json", summarize(events, {"run": {"name": "served"}}))
    run = load_run(run_dir)
    assert run.seconds_to(0.9) == 1.0 and run.megabytes_up == (0.001,)
