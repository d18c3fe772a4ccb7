"""Protocol behaviours, each judged from the calls of a run (``CallLog``) and its events.

A check returns a ``Verdict``: passed or not, and a sentence saying what was seen. Checks
are registered by name in ``CHECKS`` in the order a client meets the behaviours
(``docs/protocol.md``); a scenario names the checks its faults make meaningful.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedlink.conformance.probe import CallLog
from fedlink.metrics import Event

REPEATED_REFUSAL_LIMIT = 3
"""A refused upload id committed more often than this is a client looping on its refusal."""


@dataclass(frozen=True)
class Verdict:
    """The outcome of one behaviour check."""

    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class RunRecord:
    """What one scenario's run left: its calls, its events and the client's exit."""

    log: CallLog
    events: Sequence[Event]
    exit_code: int | None
    rounds: int

    def accepted_tasks(self) -> list[str]:
        """Task ids of accepted updates, in order."""
        return [str(e["task_id"]) for e in self.events if e["kind"] == "update_accepted"]

    def accepted_uploads(self) -> set[str]:
        """Upload ids whose ``Commit`` was answered OK (or carried out, reply lost)."""
        return {str(c.fields["upload_id"]) for c in self.log.of("Commit")
                if c.outcome in ("OK", "REPLY_LOST")}


Check = Callable[[RunRecord], tuple[bool, str]]
CHECKS: dict[str, Check] = {}


def check(name: str) -> Callable[[Check], Check]:
    """Register a behaviour check under ``name``."""

    def register(fn: Check) -> Check:
        CHECKS[name] = fn
        return fn

    return register


def judge(names: Sequence[str], record: RunRecord, prefix: str = "") -> list[Verdict]:
    """Run the checks ``names`` on ``record``."""
    verdicts = []
    for name in names:
        passed, detail = CHECKS[name](record)
        verdicts.append(Verdict(prefix + name, passed, detail))
    return verdicts


@check("join")
def _join(record: RunRecord) -> tuple[bool, str]:
    joined = [e for e in record.events if e["kind"] == "client_joined"]
    return bool(joined), f"{len(joined)} client(s) joined"


@check("task")
def _task(record: RunRecord) -> tuple[bool, str]:
    tasks = [c for c in record.log.of("GetTask") if c.fields["reply"] == "Task"]
    accepted = record.accepted_tasks()
    passed = bool(tasks) and len(set(accepted)) >= record.rounds and record.exit_code == 0
    return passed, (f"{len(tasks)} task replies, {len(accepted)} updates accepted for "
                    f"{record.rounds} rounds, client exit code {record.exit_code}")


@check("resume_download")
def _resume_download(record: RunRecord) -> tuple[bool, str]:
    cut = record.log.injected.get("cut_download")
    if cut is None:
        return False, "no model download to cut: did the client download the model?"
    again = [c for c in record.log.of("Download")
             if c.fields["task_id"] == cut["task_id"] and c.fields["offset"] > 0]
    passed = bool(again) and cut["task_id"] in record.accepted_tasks()
    return passed, (f"download of task {cut['task_id']} cut after its first chunk; "
                    f"resumed from offset {again[0].fields['offset'] if again else None}")


@check("resume_upload")
def _resume_upload(record: RunRecord) -> tuple[bool, str]:
    cut = record.log.injected.get("cut_upload")
    if cut is None:
        return False, "no streamed upload to cut: did the client use Upload?"
    upload_id = cut["upload_id"]
    asked = [c for c in record.log.of("UploadStatus") if c.fields["upload_id"] == upload_id]
    resumed = [c for c in record.log.of("Upload")
               if c.fields.get("upload_id") == upload_id and c.fields["offset"] > 0]
    passed = bool(asked) and bool(resumed) and upload_id in record.accepted_uploads()
    return passed, (f"upload {upload_id} cut after its first chunk; {len(asked)} UploadStatus "
                    f"queries, resumed at offset "
                    f"{resumed[0].fields['offset'] if resumed else None}")


@check("idempotent_commit")
def _idempotent_commit(record: RunRecord) -> tuple[bool, str]:
    lost = record.log.injected.get("lose_commit_reply")
    if lost is None:
        return False, "no commit to lose the reply of"
    repeats = [c for c in record.log.of("Commit") if c.fields["upload_id"] == lost["upload_id"]]
    counted = record.accepted_tasks().count(lost["task_id"])
    passed = len(repeats) >= 2 and repeats[-1].outcome == "OK" and counted == 1
    return passed, (f"reply to commit {lost['upload_id']} lost; committed {len(repeats)} "
                    f"times with the same id, counted {counted} time(s)")


@check("delta")
def _delta(record: RunRecord) -> tuple[bool, str]:
    offered = {c.fields["task_id"]: c.fields for c in record.log.of("GetTask")
               if c.fields.get("delta")}
    by_delta = {c.fields["task_id"] for c in record.log.of("Download")
                if c.fields["delta"] and c.outcome == "OK"}
    by_delta |= {t for t, f in offered.items() if f["delta_inline"]}
    full = {c.fields["task_id"] for c in record.log.of("Download") if not c.fields["delta"]}
    used = [t for t in offered if t in by_delta and t not in full
            and t in record.accepted_tasks()]
    return bool(used), (f"{len(offered)} task(s) offered a delta; {len(used)} trained from "
                        f"the delta without a full download")


@check("refusal")
def _refusal(record: RunRecord) -> tuple[bool, str]:
    corrupt = record.log.injected.get("corrupt_upload")
    if corrupt is None:
        return False, "no streamed upload to corrupt"
    upload_id = corrupt["upload_id"]
    commits = record.log.of("Commit")
    tries = [c for c in commits if c.fields["upload_id"] == upload_id]
    refused = [i for i, c in enumerate(commits) if c.fields["upload_id"] == upload_id
               and c.outcome == "DATA_LOSS"]
    later = [c for c in commits[refused[0] + 1:] if c.fields["upload_id"] != upload_id
             and c.outcome == "OK"] if refused else []
    passed = bool(refused) and bool(later) and len(tries) <= REPEATED_REFUSAL_LIMIT
    return passed, (f"upload {upload_id} corrupted: {len(refused)} DATA_LOSS answer(s), "
                    f"committed {len(tries)} time(s); {len(later)} later commit(s) with a "
                    f"new upload id accepted")


@check("inline")
def _inline(record: RunRecord) -> tuple[bool, str]:
    tasks = [c for c in record.log.of("GetTask") if c.fields["reply"] == "Task"
             and (c.fields["model_inline"] or c.fields["delta_inline"])]
    commits = [c for c in record.log.of("Commit") if c.fields["inline"] and c.outcome == "OK"]
    return bool(tasks) and bool(commits), (f"{len(tasks)} task(s) with an inline payload, "
                                           f"{len(commits)} inline commit(s) accepted")


@check("codec")
def _codec(record: RunRecord) -> tuple[bool, str]:
    """Every round's update accepted, no call failed, a delta offered and verified (a client
    that cannot verify a model rebuilt from a delta falls back to downloading it in full)."""
    accepted = len(set(record.accepted_tasks()))
    failed = [c for c in record.log.calls if c.outcome not in ("OK", "REPLY_LOST")]
    offered = {c.fields["task_id"] for c in record.log.of("GetTask") if c.fields.get("delta")}
    fell_back = offered & {c.fields["task_id"] for c in record.log.of("Download")
                           if not c.fields["delta"]}
    passed = (accepted >= record.rounds and not failed and bool(offered) and not fell_back
              and record.exit_code == 0)
    return passed, (f"{accepted} updates accepted for {record.rounds} rounds, "
                    f"{len(failed)} failed call(s), {len(offered)} delta(s) offered and "
                    f"{len(fell_back)} refetched in full, client exit code {record.exit_code}")
