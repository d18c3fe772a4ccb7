"""The ``verify_model`` conformance check on recorded call logs: a client that drops the task
whose model came corrupted passes only if it does not go on to use that model."""

from __future__ import annotations

from typing import Any

import pytest

from fedlink.conformance.checks import CHECKS, RunRecord
from fedlink.conformance.probe import Call, CallLog


def _record(*calls: tuple[str, dict[str, Any]]) -> RunRecord:
    """A run whose calls arrived one a second, the first full download of ``e1-v0``
    corrupted."""
    log = CallLog(calls=[Call(name, fields, at=float(i), done=float(i) + 0.5)
                         for i, (name, fields) in enumerate(calls)],
                  injected={"corrupt_model": {"task_id": "e1-v0"}})
    return RunRecord(log=log, events=(), exit_code=0, rounds=1)


def _offer(task_id: str, version: int = 0, inline: bool = False) -> tuple[str, dict[str, Any]]:
    return "GetTask", {"task_id": task_id, "model_version": version, "reply": "Task",
                       "model_inline": inline}


def _download(task_id: str, offset: int = 0) -> tuple[str, dict[str, Any]]:
    return "Download", {"task_id": task_id, "offset": offset, "delta": False}


CORRUPTED = (_offer("e1-v0"), _download("e1-v0"))
"""The evaluation task of version 0 and its corrupted download."""


@pytest.mark.parametrize("later, passed", [
    ((_offer("t1-v0"), ("Commit", {"task_id": "t1-v0"})), False),
    ((_offer("t1-v0"), _download("t1-v0"), ("Commit", {"task_id": "t1-v0"})), True),
    ((_offer("t1-v0", inline=True), ("Commit", {"task_id": "t1-v0"})), True),
    ((_offer("t1-v1", version=1), _download("t1-v1"), ("Commit", {"task_id": "t1-v1"})), True),
    ((), True),
], ids=["trained-on-the-held-corrupt-model", "downloaded-again", "inline-again",
        "only-later-versions", "nothing-after"])
def test_a_dropped_corrupted_task_passes_only_if_its_model_is_not_used_later(
        later: tuple[tuple[str, dict[str, Any]], ...], passed: bool) -> None:
    ok, detail = CHECKS["verify_model"](_record(*CORRUPTED, *later))
    assert ok is passed, detail
    assert "dropped" in detail


def test_a_result_from_the_corrupted_download_fails_and_one_after_a_new_download_passes() -> None:
    report = ("ReportEvaluation", {"task_id": "e1-v0"})
    assert CHECKS["verify_model"](_record(*CORRUPTED, report))[0] is False
    assert CHECKS["verify_model"](_record(*CORRUPTED, _download("e1-v0", 0), report))[0]
