"""Protocol behaviours, each judged from the calls of a run (``CallLog``) and its events.

A check returns a ``Verdict``: passed or not, and a sentence saying what was seen. Checks
are registered by name in ``CHECKS`` in the order a client meets the behaviours
(``docs/protocol.md``); a scenario names the checks its faults make meaningful.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedlink.conformance.probe import Call, CallLog
from fedlink.metrics import Event

REPEATED_REFUSAL_LIMIT = 3
"""A refused upload id committed more often than this is a client looping on its refusal."""

REPORTED_METRICS = ("retries", "resumed_bytes", "offline_seconds", "train_seconds", "train_loss")
"""The ``CommitRequest.metrics`` keys the run summary reads (``docs/protocol.md`` section 9)."""


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
    """The client's own exit status (negative: the signal that ended it); None: not run."""
    rounds: int
    killed: bool = False
    """The client was still running at the timeout and was killed."""
    codec: str = ""
    """The update codec the client was asked to send (lossy scenarios), else empty."""
    slow_commit_s: float = 0.0
    stopped: str = ""
    """Why the runner stopped the client before it exited (empty: it did not)."""

    @property
    def exit_text(self) -> str:
        """The client's exit, for a verdict's detail."""
        if self.stopped:
            return f"client stopped by the runner: {self.stopped}"
        if self.killed:
            return f"client killed at the timeout (exit status {self.exit_code})"
        return f"client exit code {self.exit_code}"

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
                    f"{record.rounds} rounds, {record.exit_text}")


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
    streams = [c for c in record.log.of("Upload") if c.fields.get("upload_id") == upload_id]
    later = streams[1:]  # after the cut one
    sizes = [c.fields["num_bytes"] for c in record.log.of("Commit")
             if c.fields["upload_id"] == upload_id]
    held = asked[-1].fields["committed_offset"] if asked else None
    accepted = upload_id in record.accepted_uploads()
    if asked and sizes and held == sizes[0]:
        # the first chunk was the whole update: nothing left to resume, commit at once
        passed = accepted and not later
        seen = (f"its first chunk held all {held} bytes: {len(later)} further stream(s), "
                f"then {'accepted' if accepted else 'not accepted'}")
    else:
        resumed = [c for c in later if c.fields["offset"] > 0]
        passed = bool(asked) and bool(resumed) and accepted and not any(
            c.fields["offset"] == 0 for c in later)
        seen = (f"UploadStatus said {held} bytes held; resumed at offset "
                f"{resumed[0].fields['offset'] if resumed else 'none'}"
                f"{'' if accepted else ', not accepted'}")
    return passed, (f"upload {upload_id} cut after its first chunk; {len(asked)} UploadStatus "
                    f"queries; {seen}")


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


@check("new_upload_id")
def _new_upload_id(record: RunRecord) -> tuple[bool, str]:
    """After ``DATA_LOSS`` an upload id is spent: no byte or commit goes to it again."""
    corrupt = record.log.injected.get("corrupt_upload")
    if corrupt is None:
        return False, "no streamed upload to corrupt"
    upload_id = corrupt["upload_id"]
    refused = [c for c in record.log.of("Commit")
               if c.fields["upload_id"] == upload_id and c.outcome == "DATA_LOSS"]
    if not refused:
        return False, f"upload {upload_id} was corrupted but never committed"
    reused = [c for c in record.log.after(refused[0].done)
              if c.name in ("Upload", "Commit") and c.fields.get("upload_id") == upload_id]
    fresh = [c for c in record.log.after(refused[0].done) if c.name == "Commit"
             and c.fields["upload_id"] != upload_id and c.outcome == "OK"]
    calls = ", ".join(sorted({f"{c.name} ({c.outcome})" for c in reused})) or "none"
    return not reused and bool(fresh), (
        f"after DATA_LOSS on {upload_id}: calls with that id again: {calls}; "
        f"{len(fresh)} later update(s) under a new id accepted")


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
                    f"{len(fell_back)} refetched in full, {record.exit_text}")


@check("heartbeat")
def _heartbeat(record: RunRecord) -> tuple[bool, str]:
    """A task held longer than ``heartbeat_interval_s`` (its commit slowed) is heartbeated."""
    slow = record.log.injected.get("slow_commit_s")
    if slow is None:
        return False, "no commit to slow down: did the client commit?"
    beats = [c for c in record.log.of("Heartbeat") if c.fields["task_id"] == slow["task_id"]]
    return bool(beats), (f"commit of task {slow['task_id']} held {record.slow_commit_s:g} s; "
                         f"{len(beats)} heartbeat(s) for it, "
                         f"{len(record.log.of('Heartbeat'))} in all")


@check("leave")
def _leave(record: RunRecord) -> tuple[bool, str]:
    """The client says goodbye once the run is over."""
    finished = [c for c in record.log.of("GetTask") if c.fields.get("reply") == "Finished"]
    if not finished:
        return False, "the client never heard that the run was over"
    left = [c for c in record.log.after(finished[0].at) if c.name == "Leave"]
    return bool(left), f"{len(left)} Leave call(s) after the run finished"


@check("verify_model")
def _verify_model(record: RunRecord) -> tuple[bool, str]:
    """A model whose bytes do not match ``model.checksum`` is never used: downloaded again."""
    corrupt = record.log.injected.get("corrupt_model")
    if corrupt is None:
        return False, "no full model download to corrupt: did the client download the model?"
    task_id = corrupt["task_id"]
    calls = [c for c in record.log.calls if c.fields.get("task_id") == task_id]
    first = next(i for i, c in enumerate(calls) if c.name == "Download"
                 and not c.fields["delta"] and c.fields["offset"] == 0)
    used = next((i for i, c in enumerate(calls) if i > first
                 and c.name in ("Commit", "ReportEvaluation")), None)
    if used is None:
        passed, seen = _dropped_corrupt_model(record, task_id, calls[first].at)
    else:
        again = [c for c in calls[first + 1:used] if c.name == "Download"]
        passed = bool(again)
        seen = (f"{len(again)} download(s) again before its {calls[used].name}"
                + ("" if again else ": the corrupted model was used"))
    return passed, f"first model download of task {task_id} corrupted; {seen}"


def _dropped_corrupt_model(record: RunRecord, task_id: str, corrupted_at: float
                           ) -> tuple[bool, str]:
    """A task dropped after its model came corrupted proves nothing by itself (a client drops
    a task for other reasons too): the client must not keep that model either, so the next
    task on the same version that it answers must come with the model again (downloaded or
    inline), not from what the client held."""
    version = next(c.fields["model_version"] for c in record.log.of("GetTask")
                   if c.fields.get("task_id") == task_id)
    for later in record.log.after(corrupted_at):
        other = later.fields.get("task_id")
        if later.name != "GetTask" or other == task_id \
                or later.fields.get("model_version") != version:
            continue
        calls = [c for c in record.log.calls if c.fields.get("task_id") == other]
        result = next((c for c in calls if c.name in ("Commit", "ReportEvaluation")), None)
        if result is None:
            continue
        fetched = later.fields.get("model_inline") or any(
            c.name == "Download" and c.at < result.at for c in calls)
        return bool(fetched), (f"the task was dropped, and task {other} of the same version "
                               + ("had the model again" if fetched else
                                  "used the model the client held: the corrupted one"))
    return True, "the task was dropped (no result sent for it), and no later one used its model"


@check("metrics")
def _metrics(record: RunRecord) -> tuple[bool, str]:
    """Every commit reports at least one of the metrics section 9 defines, all finite and
    non-negative (``train_loss``: finite)."""
    commits = [c for c in record.log.of("Commit") if c.outcome == "OK"]
    if not commits:
        return False, "no commit accepted"
    bare = [c for c in commits if not set(c.fields["metrics"]) & set(REPORTED_METRICS)]
    bad = sorted({key for c in commits for key, value in c.fields["metrics"].items()
                  if key in REPORTED_METRICS and not _valid_metric(key, value)})
    keys = sorted({k for c in commits for k in c.fields["metrics"]})
    return not bare and not bad, (f"{len(commits) - len(bare)} of {len(commits)} commit(s) "
                                  f"report metrics ({', '.join(keys) or 'none'})"
                                  + (f"; invalid: {', '.join(bad)}" if bad else ""))


def _valid_metric(key: str, value: float) -> bool:
    return math.isfinite(value) and (key == "train_loss" or value >= 0)


@check("evaluate")
def _evaluate(record: RunRecord) -> tuple[bool, str]:
    """The client advertises ``evaluate`` and answers evaluation tasks with a report of
    scores (a decline, which carries none, does not count: the probe's model can be
    scored)."""
    advertised = any("evaluate" in c.fields["capabilities"] for c in record.log.of("Join"))
    tasks = {c.fields["task_id"] for c in record.log.of("GetTask")
             if c.fields.get("kind") == "EVALUATE"}
    reported = {c.fields["task_id"] for c in record.log.of("ReportEvaluation")
                if c.outcome == "OK" and c.fields.get("metrics")}
    committed = tasks & {c.fields["task_id"] for c in record.log.of("Commit")}
    passed = advertised and bool(reported) and not committed
    return passed, (f"capability {'advertised' if advertised else 'not advertised'}; "
                    f"{len(tasks)} evaluation task(s), {len(reported & tasks)} reported"
                    + (f", {len(committed)} answered with a Commit" if committed else ""))


@check("retry_hint")
def _retry_hint(record: RunRecord) -> tuple[bool, str]:
    """After ``RESOURCE_EXHAUSTED`` with a ``RetryInfo``, the next call waits at least that."""
    overload = record.log.injected.get("overload_s")
    if overload is None:
        return False, "no GetTask to refuse: did the client ask for a task?"
    refused = next(c for c in record.log.of("GetTask") if c.outcome == "RESOURCE_EXHAUSTED")
    after = record.log.after(refused.done)
    if not after:
        return False, "no call after the overload refusal"
    waited = after[0].at - refused.done
    hint = overload["retry_after_s"]
    return waited >= hint, (f"GetTask refused with a {hint:g} s retry hint; next call "
                            f"({after[0].name}) {waited:.2f} s later")


@check("rejoin")
def _rejoin(record: RunRecord) -> tuple[bool, str]:
    """A client the coordinator no longer knows (``UNAUTHENTICATED``) joins again, once."""
    forgot = record.log.injected.get("forget_client")
    if forgot is None:
        return False, "no GetTask after an accepted update to refuse"
    joins = [c for c in record.log.after(forgot["at"]) if c.name == "Join"]
    accepted = [c for c in record.log.after(forgot["at"])
                if c.name == "Commit" and c.outcome == "OK"]
    passed = 1 <= len(joins) <= 2 and bool(accepted)
    return passed, (f"GetTask refused UNAUTHENTICATED; {len(joins)} Join(s) after it, "
                    f"{len(accepted)} update(s) accepted after it")


@check("lossy_update")
def _lossy_update(record: RunRecord) -> tuple[bool, str]:
    """Every round's update sent with the lossy codec asked for, and accepted: its bytes and
    its ``values_checksum`` (of what the coordinator decodes) agree with the spec.

    The ``values_checksum`` is required here: it is the coordinator's only view of whether
    the client decodes as section 6 says (the ``qsgd`` rounding, the ``randk`` indices);
    without it a wrong encoder's update is accepted and trains on other values."""
    if not record.codec:
        return False, "the client command has no {update_codec} placeholder"
    commits = record.log.of("Commit")
    encodings = sorted({c.fields["encoding"] for c in commits})
    refused = [c for c in commits if c.outcome not in ("OK", "REPLY_LOST")]
    unchecked = [c for c in commits if not c.fields["values_checksum"]]
    accepted = len(set(record.accepted_tasks()))
    passed = (accepted >= record.rounds and encodings == [record.codec] and not refused
              and not unchecked and record.exit_code == 0)
    outcomes = ", ".join(sorted({c.outcome for c in refused}))
    return passed, (f"{accepted} updates accepted for {record.rounds} rounds, encodings "
                    f"{', '.join(encodings) or 'none'}, {len(refused)} refused"
                    + (f" ({outcomes})" if outcomes else "")
                    + (f", {len(unchecked)} without values_checksum" if unchecked else "")
                    + f", {record.exit_text}")


SECURE_PHASES = ("SecureAdvertise", "SecureShare", "SecureMasked", "SecureUnmask")
"""The calls that deliver one training task in a secure run, in order (section 14)."""
DONE = ("OK", "REPLY_LOST")


@check("secure_round")
def _secure_round(record: RunRecord) -> tuple[bool, str]:
    """Every round's update delivered through the four ``Secure*`` calls and inside a
    flushed sum (its ``update_accepted`` event), no roster left without a ``SecureShare``,
    never a plain ``Commit``, exit code 0."""
    plain = record.log.of("Commit")
    groups = {c.fields["task_id"]: c.fields["group"] for c in record.log.of("SecureAdvertise")
              if c.outcome == "OK"}
    if not groups:
        return False, _no_secure_group(record, plain)
    missing = {task: [name for name in SECURE_PHASES if not _done(record, name, task)]
               for task in groups}
    complete = [task for task, gaps in missing.items() if not gaps]
    summed = set(groups) & set(record.accepted_tasks())
    left = _left_rosters(record)
    passed = (len(summed & set(complete)) >= record.rounds and not plain and not left
              and record.exit_code == 0)
    gaps = "; ".join([f"task {task} (group {group}) without SecureShare: it advertised again "
                      f"instead of sharing with the roster it was answered"
                      for task, group in left]
                     + [f"task {task} (group {groups[task]}) without {', '.join(names)}"
                        for task, names in missing.items() if names])
    return passed, (f"{len(groups)} task(s) in secure groups, {len(complete)} through all four "
                    f"calls, {len(summed)} inside a flushed sum for {record.rounds} rounds"
                    + (f"; {gaps}" if gaps else "") + _failed_secure_calls(record)
                    + (f"; {len(plain)} plain Commit(s)" if plain else "")
                    + f", {record.exit_text}")


@check("secure_options")
def _secure_options(record: RunRecord) -> tuple[bool, str]:
    """As ``secure_round``, in groups with SecAgg+, group random-k and distributed DP: the
    client computed the graph, the kept coordinates and the noised encoding as the protocol
    states them (else its calls are refused, or its group unmasks to a sum that is never
    flushed)."""
    return _secure_round(record)


def _left_rosters(record: RunRecord) -> list[tuple[str, int]]:
    """``(task, group)`` of each roster the client was answered and then left without a
    ``SecureShare``, advertising again for the same task into another group instead: a
    client that cannot use the roster it got (one that looks for other neighbours than the
    group's graph names), which a later group's graph could match by chance. A retry (the
    same keys, answered with the same group) is not leaving."""
    calls = sorted(record.log.of("SecureAdvertise") + record.log.of("SecureShare"),
                   key=lambda c: c.at)
    answered: dict[str, int] = {}  # task -> the group whose roster came, no share since
    left = []
    for call in calls:
        task = call.fields["task_id"]
        if call.name == "SecureShare":
            answered.pop(task, None)
            continue
        group = call.fields.get("group") if call.outcome in DONE else None
        if task in answered and group != answered[task]:
            left.append((task, answered.pop(task)))
        if group is not None:
            answered[task] = group
    return left


def _failed_secure_calls(record: RunRecord) -> str:
    """How many ``Secure*`` calls were refused or failed, and the first one's answer."""
    failed = [c for name in SECURE_PHASES for c in record.log.of(name)
              if c.outcome not in DONE]
    if not failed:
        return ""
    first = min(failed, key=lambda c: c.at)
    return (f"; {len(failed)} Secure* call(s) refused or failed, the first {first.name} "
            f"{first.outcome}: {first.fields.get('detail', '')}")


def _done(record: RunRecord, name: str, task_id: str) -> bool:
    """Whether the call ``name`` for ``task_id`` was carried out."""
    return any(c.fields["task_id"] == task_id and c.outcome in DONE for c in record.log.of(name))


def _no_secure_group(record: RunRecord, plain: Sequence[Call]) -> str:
    """Why no task of the client reached a secure group, as far as the calls tell."""
    refused = [c for c in record.log.of("SecureAdvertise") if c.outcome not in DONE]
    if refused:
        return (f"{len(refused)} SecureAdvertise call(s), none answered with a roster "
                f"({refused[-1].outcome}: {refused[-1].fields.get('detail', '')}), "
                f"{record.exit_text}")
    if plain:
        return (f"no Secure* call: the client does not speak secure aggregation; it sent "
                f"{len(plain)} plain Commit(s) ({plain[0].outcome}), but a secure run takes an "
                f"update only masked, through SecureAdvertise, SecureShare, SecureMasked and "
                f"SecureUnmask (docs/protocol.md section 14); {record.exit_text}")
    return (f"no SecureAdvertise call: the client never delivered a task through the Secure* "
            f"calls (docs/protocol.md section 14); {record.exit_text}")


@check("secure_retry")
def _secure_retry(record: RunRecord) -> tuple[bool, str]:
    """A ``SecureMasked`` whose reply was lost is sent again with the same content, gets the
    same answer, and the update is counted once."""
    lost = record.log.injected.get("lose_masked_reply")
    if lost is None:
        return False, "no SecureMasked to lose the reply of: did the client send a masked update?"
    tries = [c for c in record.log.of("SecureMasked") if c.fields["task_id"] == lost["task_id"]]
    again = tries[1:]
    same_content = all(c.fields["content"] == lost["content"] for c in again)
    answer = (lost["survivors"], lost["dropped"])
    answered = [c for c in again if c.outcome == "OK"
                and (c.fields["survivors"], c.fields["dropped"]) == answer]
    counted = record.accepted_tasks().count(lost["task_id"])
    passed = bool(answered) and same_content and counted == 1
    return passed, (f"reply to the SecureMasked of task {lost['task_id']} lost; sent "
                    f"{len(tries)} time(s), "
                    + ("the same content" if same_content else "with other content")
                    + f", {len(answered)} answered the same, counted {counted} time(s)")


@check("secure_dropout")
def _secure_dropout(record: RunRecord) -> tuple[bool, str]:
    """A member shared its keys and vanished: the client's unmask holds a share of that
    member's mask key and of each other survivor's seed, never both for one member (every
    other member is a neighbour here), and the group's sum counts its update."""
    heard = next((c for c in record.log.of("SecureMasked")
                  if c.outcome in DONE and c.fields["dropped"]), None)
    if heard is None:
        return False, ("no group of the client's with a dropped member: did it deliver a masked "
                       "update?")
    task = heard.fields["task_id"]
    index = next(c.fields["index"] for c in record.log.of("SecureAdvertise")
                 if c.fields["task_id"] == task and c.outcome == "OK")
    dropped, survivors = set(heard.fields["dropped"]), set(heard.fields["survivors"]) - {index}
    answer = next((c for c in record.log.of("SecureUnmask")
                   if c.fields["task_id"] == task and c.outcome == "OK"), None)
    if answer is None:
        return False, f"member(s) {sorted(dropped)} dropped; no SecureUnmask for task {task}"
    keys, seeds = set(answer.fields["key_owners"]), set(answer.fields["seed_owners"])
    summed = task in record.accepted_tasks()
    passed = dropped <= keys and survivors <= seeds and not keys & seeds and summed
    return passed, (f"member(s) {sorted(dropped)} dropped, survivors {sorted(survivors)} "
                    f"besides the client; its unmask: key shares for {sorted(keys)}, seed shares "
                    f"for {sorted(seeds)}"
                    + (f", both for {sorted(keys & seeds)}" if keys & seeds else "")
                    + f"; its update {'inside' if summed else 'not in'} the flushed sum")
