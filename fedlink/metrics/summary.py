"""Run summaries: the headline figures of a run, computed from its event log.

:func:`summarize` returns a JSON-ready dict with these fields:

======================== ===================================================================
``run_name``             ``config["run_name"]``, ``config["name"]`` or
                         ``config["run"]["name"]``;
                         None when the config names no run
``final_accuracy``       accuracy of the last ``flush`` (None without flushes or evaluation)
``final_loss``           loss of the last ``flush`` (None likewise)
``best_accuracy``        highest accuracy over all flushes (None likewise)
``final_model_version``  ``model_version`` of the last flush (None without flushes)
``rounds``               number of ``flush`` events
``wall_seconds``         ``elapsed`` from the first ``task_issued`` (else the first
                         ``run_started``, else the first event) to the last ``run_finished``
                         (or the last event); 0.0 for an empty log
``startup_seconds``      from the first ``run_started`` to the first ``task_issued``: the
                         wait for clients to start, not part of ``wall_seconds``
``bytes_up``             sum of ``bytes_up`` over ``update_accepted`` and ``update_refused``
                         events (a refused update that was received still cost its upload;
                         in a secure run, a member's requests of every phase: keys, shares,
                         masked update and unmask answers, with the answers that came after
                         their group flushed, ``secure_answer_late``)
``bytes_down``           sum of ``bytes`` over ``download_finished`` events: every payload
                         byte the coordinator sent (each stream, cut or whole, and each
                         inline payload; ``fedlink.coordinator.downloads``)
``bytes_down_model``, ``bytes_down_delta``, ``bytes_down_evaluation``  the same for training
                         tasks' full models, training tasks' deltas, and evaluation tasks
``bytes_down_wasted``    ``bytes_down`` less the ``bytes`` of ``download_used`` events (one
                         payload per accepted result): what no accepted update or
                         evaluation used; None for a log written before it was counted
``uplink_compression_ratio``  what the accepted updates would have cost as fp32
                         (``4 x num_parameters`` of ``run_started`` each) over the
                         ``bytes_up`` they did cost; 1.0 for fp32, None without accepted
                         updates or a ``num_parameters``
``downlink_compression_ratio``  what the models clients downloaded would have cost as full
                         fp32 downloads (``4 x num_parameters`` per task with a
                         ``download_finished`` event) over the ``bytes_down`` they did cost
                         (the broadcast codec and delta downloads both count); None without
                         downloads or a ``num_parameters``
``delta_bytes_saved``    sum of ``bytes_saved`` over ``download_used`` (and, in older logs,
                         ``download_finished``) events: bytes a
                         delta download saved against downloading the whole model (0 when
                         no client downloaded a delta)
``tasks_issued``         number of ``task_issued`` events
``updates_accepted``     number of ``update_accepted`` events
``updates_refused``      number of ``update_refused`` events
``refusal_reasons``      ``reason`` -> count over ``update_refused`` events
``refusal_codes``        ``code`` (the gRPC status code name) -> count over ``update_refused``
                         events
``refusals_by_code``     ``reason_code`` (a ``fedlink.refusals.RefusalCode`` value: why, in
                         one word) -> ``{"count": n, "example": reason}``, the ``reason`` of
                         the first such refusal as an example, most common first; a refusal
                         without a ``reason_code`` (a run written before codes) counts as the
                         code its gRPC status implies, else ``none``
``mean_staleness``       mean ``staleness`` of accepted updates (None if none accepted)
``max_staleness``        largest ``staleness`` of accepted updates (None if none accepted)
``clients``              number of distinct ``client_id`` values in ``client_joined`` events
``clients_left``         number of ``client_left`` events
``client_timeouts``      number of ``client_timeout`` events
``false_client_timeouts``  ``client_timeout`` events for silence (``cause`` ``silent``) whose
                         task's update was accepted later: live clients taken for dead
``client_retries_reported``  sum of ``retries`` the clients reported with their updates
                         (``update_accepted``, ``update_refused``) and when they left
                         (``client_left``); 0 when none reported
``resumed_bytes``        sum of ``resumed_bytes`` reported likewise: upload bytes clients did
                         not resend after a break because the coordinator held them
``offline_seconds``      sum of ``offline_seconds`` reported likewise: time clients spent
                         unable to reach the coordinator (0.0 when none)
``compute_seconds``      sum of ``train_seconds`` reported with accepted updates
``network_seconds``      sum of ``network_seconds`` (downloading and uploading) reported with
                         accepted updates
``comm_share``           the share of the clients' task time spent communicating:
                         ``network_seconds / (network_seconds + compute_seconds)`` over the
                         accepted updates that report both (None when none does)
``finish_reason``        ``reason`` of the last ``run_finished`` (None if it never finished)
``updates_clipped``      updates whose norm the coordinator clipped (the flush guard's or
                         the streaming norm bound's), summed over the flushes
``updates_downweighted`` updates whose weight the flush guard capped, likewise
``updates_dropped``      updates the flush guard left out of their flush, likewise
``evaluation_errors``    number of flushes whose central evaluation raised (their
                         ``evaluation_error``); 0 when none did
``evaluation_error``     the ``evaluation_error`` of the last such flush (None when none)
``empty_flushes``        flushes that aggregated no update (every update of their round was
                         refused): each left the model as it was
``evaluations_issued``, ``evaluations_reported``, ``evaluations_declined``  federated
                         evaluation tasks handed out, the client reports accepted, and the
                         tasks clients declined, unable to score (``[coordinator.evaluation]``;
                         0 without)
``flushes_refused``      flushes whose model step was refused (``flush_refused``: non-finite or
                         exploding): each left the model as it was too
``warning``              what makes the run's figures mislead, in sentences joined by ``"; "``
                         (None when nothing does): empty or refused flushes, secure sums of
                         updates that did no work, failed central evaluations, federated
                         evaluation that no client reported;
                         a simulation adds a final accuracy near chance (``add_warning``)
``privacy``              the ``privacy`` record ``run_finished`` carries (the guarantee as
                         the run ended), else that of the last ``flush`` that carries one (a
                         DP flush hook's report: ``epsilon``, ``delta``, ``noise_multiplier``,
                         ``sample_rate``, ``steps``, ``accountant``, ``clip_norm``, ``mode``,
                         ...); None for a run without differential privacy
``secure_groups_lost``   number of ``secure_group_lost`` events: secure groups lost before
                         their flush (one the run's end cut short is not); None for a run
                         without secure aggregation
``secure_updates_without_work``  updates summed although their client completed no local
                         step (a secure sum weighs every member alike); None likewise
``accuracy_by_time``     only for a run with model time (virtual clock: its flushes carry
                         ``model_seconds``): per flush, ``model_version``, ``accuracy``,
                         ``model_seconds`` and ``simulation_seconds`` (wall time), see
                         ``fedlink.metrics.model_time``
``config``               the configuration passed in, as plain JSON data
======================== ===================================================================
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedlink.metrics.events import (
    CLIENT_JOINED,
    CLIENT_LEFT,
    CLIENT_TIMEOUT,
    DOWNLOAD_FINISHED,
    DOWNLOAD_USED,
    FLUSH,
    RUN_FINISHED,
    RUN_STARTED,
    SECURE_ANSWER_LATE,
    TASK_ISSUED,
    UPDATE_ACCEPTED,
    UPDATE_REFUSED,
    Event,
    to_jsonable,
)
from fedlink.metrics.kinds import (
    EvaluationDeclined,
    EvaluationIssued,
    EvaluationReported,
    FlushRefused,
)
from fedlink.metrics.model_time import model_time_figures
from fedlink.private import private_dir, touch_private
from fedlink.refusals import code_for_status

SUMMARY_FILENAME = "summary.json"
"""The conventional file name of a run summary inside a run folder."""


def summarize(events: list[Event], config: Mapping[str, Any]) -> dict[str, Any]:
    """Compute the run summary (fields in the module docstring) from ``events``."""
    summary: dict[str, Any] = {"run_name": run_name(config)}
    flushes = unique_flushes(events)
    summary.update(_accuracy_figures(flushes))
    summary.update(_traffic_figures(events))
    summary.update(_update_figures(events))
    summary.update(_guard_figures(flushes))
    summary.update(_client_figures(events))
    summary.update(_resilience_figures(events))
    summary.update(comm_figures(of_kind(events, UPDATE_ACCEPTED)))
    summary["privacy"] = _privacy_record(flushes, of_kind(events, "run_finished"))
    summary["secure_groups_lost"] = (len(of_kind(events, "secure_group_lost"))
                                     if _secure(config) else None)
    failed = [str(e["evaluation_error"]) for e in flushes if e.get("evaluation_error")]
    summary["evaluation_errors"] = len(failed)
    summary["evaluation_error"] = failed[-1] if failed else None
    summary.update(_outcome_figures(events, flushes, _secure(config)))
    summary["warning"] = "; ".join(_run_warnings(summary)) or None
    summary.update(model_time_figures(events, flushes))
    summary["wall_seconds"] = wall_seconds(events)
    summary["startup_seconds"] = max(0.0, first_task_elapsed(events) - start_elapsed(events))
    summary["config"] = to_jsonable(config)
    return summary


def _outcome_figures(events: list[Event], flushes: list[Event], secure: bool) -> dict[str, Any]:
    """What came of the run's work, for its warnings: empty and refused flushes, federated
    evaluation tasks issued, reported and declined, and (``secure``) summed updates that did
    no work."""
    versions = {e.get("model_version") for e in flushes}  # made after the run's last: none
    refused_steps = list({e.get("model_version"): e  # a resumed log may repeat one
                          for e in of_kind(events, FlushRefused.KIND)
                          if e.get("model_version") in versions}.values())
    idle = sum(1 for e in of_kind(events, UPDATE_ACCEPTED) if e.get("steps_completed") == 0)
    return {
        "secure_updates_without_work": idle if secure else None,
        "empty_flushes": sum(1 for e in flushes if e.get("num_updates") == 0),
        "evaluations_issued": len(of_kind(events, EvaluationIssued.KIND)),
        "evaluations_reported": len(of_kind(events, EvaluationReported.KIND)),
        "evaluations_declined": len(of_kind(events, EvaluationDeclined.KIND)),
        "flushes_refused": len(refused_steps),
        "flush_refused_reason": refused_steps[-1].get("reason") if refused_steps else None,
    }


def add_warning(summary: dict[str, Any], warning: str | None) -> None:
    """Add ``warning`` (if any) to ``summary["warning"]``, after those already there."""
    if warning:
        summary["warning"] = "; ".join(w for w in (summary.get("warning"), warning) if w)


STALLED = "stalled"
"""How the finish reason of a simulation that could no longer move begins."""


def _run_warnings(summary: Mapping[str, Any]) -> list[str]:
    """What in a run's own record makes its figures mislead: a simulation that stalled
    before its end, federated evaluation that no client reported, flushes that aggregated
    nothing or whose step was refused (the run still ends "completed N rounds"), secure sums
    of updates that did no work, and flushes that central evaluation failed."""
    warnings = []
    reason = summary["finish_reason"] or ""
    if reason.startswith(STALLED):
        warnings.append(
            f"the run ended before its rounds were done, {reason}: no flush could come any "
            f"more. Look at the clients' availability and the flush rule ([coordinator.flush] "
            f"goal, min_updates)")
    if summary["evaluations_issued"] and not summary["evaluations_reported"]:
        warnings.append(
            f"federated evaluation issued {summary['evaluations_issued']} tasks and no client "
            f"reported a score ({summary['evaluations_declined']} declined: no local example, "
            f"or a score that is not a finite number, as each client's log says; the others "
            f"expired): the summary has no federated figures")
    empty, rounds = summary["empty_flushes"], summary["rounds"]
    if empty:
        refusals = ", ".join(f"{entry['count']} {code}"
                             for code, entry in summary["refusals_by_code"].items())
        warnings.append(_unmoved(
            empty, rounds, "no flush aggregated an update", "flushes aggregated no update",
            f": every update of their rounds was refused (the run's refusals: "
            f"{refusals or 'none'}). Look at the refusals in events.jsonl"))
    if summary["flushes_refused"]:
        warnings.append(_unmoved(
            summary["flushes_refused"], rounds, "every flush's model step was refused",
            "flushes' model steps were refused",
            f" ({summary['flush_refused_reason']}). Look at [coordinator] "
            f"server_optimizer_options and the updates' norms (flush_refused events)"))
    idle = summary["secure_updates_without_work"]
    if idle:
        warnings.append(
            f"{idle} of {summary['updates_accepted']} updates in secure sums completed no local "
            f"step: a secure sum weighs every member alike, so they pulled their groups' means "
            f"towards zero. Give clients more time ([coordinator.flush] deadline_s) or fewer "
            f"local steps")
    errors = summary["evaluation_errors"]
    if errors:
        warnings.append(
            f"central evaluation raised in {errors} of {rounds} flushes "
            f"({summary['evaluation_error']}): their accuracy is missing, and a target "
            f"accuracy could not end the run at them")
    return warnings


def _unmoved(count: int, rounds: int, every: str, some: str, why: str) -> str:
    """A warning that ``count`` of the run's ``rounds`` flushes left the model as it was:
    ``every`` (when all did) or ``some``, then ``why``."""
    head = (f"{every}, so the final model is the initial one" if count == rounds
            else f"{count} of {rounds} {some}")
    return head + why


def _secure(config: Mapping[str, Any]) -> bool:
    """Whether the recorded config ran secure aggregation (``[coordinator.secure]``)."""
    coordinator = config.get("coordinator")
    secure = coordinator.get("secure") if isinstance(coordinator, Mapping) else None
    return isinstance(secure, Mapping) and bool(secure.get("enabled"))


def write_summary(path: Path, summary: Mapping[str, Any]) -> None:
    """Write ``summary`` as indented, key-sorted JSON, atomically (write, fsync, rename)."""
    text = json.dumps(to_jsonable(summary), indent=2, sort_keys=True, allow_nan=False) + "\n"
    private_dir(path.parent)
    tmp = touch_private(path.with_name(path.name + ".tmp"))
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def of_kind(events: Iterable[Event], kind: str) -> list[Event]:
    """The events of one kind, in their original order."""
    return [e for e in events if e.get("kind") == kind]


def run_name(config: Mapping[str, Any]) -> str | None:
    """The run's name from its config, or None when it names none."""
    run = config.get("run")
    candidates = [config.get("run_name"), config.get("name")]
    if isinstance(run, Mapping):
        candidates.append(run.get("name"))
    return next((str(c) for c in candidates if c), None)


def start_elapsed(events: list[Event]) -> float:
    """``elapsed`` of the first ``run_started`` event, else of the first event, else 0.0."""
    started = of_kind(events, RUN_STARTED)
    first = started[0] if started else (events[0] if events else None)
    return float(first["elapsed"]) if first is not None else 0.0


def first_task_elapsed(events: list[Event]) -> float:
    """``elapsed`` of the first ``task_issued`` event, else the run's start."""
    issued = of_kind(events, TASK_ISSUED)
    return float(issued[0]["elapsed"]) if issued else start_elapsed(events)


def wall_seconds(events: list[Event]) -> float:
    """Seconds from the run's first task to ``run_finished`` (or the last event)."""
    if not events:
        return 0.0
    finished = of_kind(events, RUN_FINISHED)
    end = finished[-1] if finished else max(events, key=lambda e: float(e["elapsed"]))
    return max(0.0, float(end["elapsed"]) - first_task_elapsed(events))


def made_elapsed(flush: Mapping[str, Any]) -> float:
    """When a flush's version was made, on its log's clock: a served run reports a version
    after its central evaluation (the event's ``elapsed``), by which time the next round's
    updates may have come; its ``made_elapsed`` is when it was made."""
    made = flush.get("made_elapsed")
    return float(flush["elapsed"] if made is None else made)


def unique_flushes(events: list[Event]) -> list[Event]:
    """``flush`` events, one per model version (the last written wins), in version order.

    A coordinator restarted from its ``state_dir`` writes again the flush events it may not
    have written before it stopped, so a version can appear twice in a resumed run's log.
    """
    by_version: dict[Any, Event] = {}
    for event in of_kind(events, FLUSH):
        by_version[event.get("model_version")] = event
    return sorted(by_version.values(), key=lambda e: (e.get("model_version") is None,
                                                      e.get("model_version") or 0))


def _accuracy_figures(flushes: list[Event]) -> dict[str, Any]:
    """Final/best accuracy, final loss, final version and round count from flush events."""
    last = flushes[-1] if flushes else {}
    accuracies = [float(e["accuracy"]) for e in flushes if e.get("accuracy") is not None]
    return {
        "final_accuracy": _opt_float(last.get("accuracy")),
        "final_loss": _opt_float(last.get("loss")),
        "best_accuracy": max(accuracies) if accuracies else None,
        "final_model_version": last.get("model_version"),
        "rounds": len(flushes),
    }


def _traffic_figures(events: list[Event]) -> dict[str, Any]:
    """Total bytes up (accepted and refused updates, and secure unmask answers that came after
    their group flushed) and down (finished downloads), and the compression ratios."""
    uploads = (of_kind(events, UPDATE_ACCEPTED) + of_kind(events, UPDATE_REFUSED)
               + of_kind(events, SECURE_ANSWER_LATE))
    return {
        "bytes_up": _total(uploads, "bytes_up"),
        **bytes_down_figures(events),
        "uplink_compression_ratio": uplink_compression_ratio(events),
        "downlink_compression_ratio": downlink_compression_ratio(events),
    }


def bytes_down_figures(events: list[Event]) -> dict[str, Any]:
    """``bytes_down`` in all and by kind, and the part no accepted result used."""
    sent = of_kind(events, DOWNLOAD_FINISHED)
    evaluation = [e for e in sent if e.get("evaluation")]
    training = [e for e in sent if not e.get("evaluation")]
    total = _total(sent, "bytes")
    counted = any(e.get("completed") is not None for e in sent)  # written since 1.1
    return {
        "bytes_down": total,
        "bytes_down_model": _total([e for e in training if not e.get("delta")], "bytes"),
        "bytes_down_delta": _total([e for e in training if e.get("delta")], "bytes"),
        "bytes_down_evaluation": _total(evaluation, "bytes"),
        "bytes_down_wasted": (total - _total(of_kind(events, DOWNLOAD_USED), "bytes")
                              if counted or not sent else None),
    }


def uplink_compression_ratio(events: list[Event]) -> float | None:
    """fp32 bytes of the accepted updates over the bytes they took (None when unknown)."""
    accepted = of_kind(events, UPDATE_ACCEPTED)
    return _fp32_ratio(events, len(accepted), _total(accepted, "bytes_up"))


def downlink_compression_ratio(events: list[Event]) -> float | None:
    """fp32 bytes of the models downloaded (one per task) over the bytes they took."""
    downloads = of_kind(events, DOWNLOAD_FINISHED)
    tasks = {e.get("task_id") for e in downloads}
    return _fp32_ratio(events, len(tasks), _total(downloads, "bytes"))


def _fp32_ratio(events: list[Event], vectors: int, nbytes: int) -> float | None:
    """What ``vectors`` model-sized fp32 vectors would take over ``nbytes`` (None when the
    run's ``num_parameters`` is unknown or no byte moved)."""
    started = [e for e in of_kind(events, RUN_STARTED) if e.get("num_parameters")]
    if not started or not nbytes:
        return None
    return 4 * int(started[-1]["num_parameters"]) * vectors / nbytes


def _update_figures(events: list[Event]) -> dict[str, Any]:
    """Counts of tasks and updates, refusal tallies and staleness statistics."""
    accepted = of_kind(events, UPDATE_ACCEPTED)
    refused = of_kind(events, UPDATE_REFUSED)
    staleness = [int(e["staleness"]) for e in accepted if e.get("staleness") is not None]
    return {
        "tasks_issued": len(of_kind(events, TASK_ISSUED)),
        "updates_accepted": len(accepted),
        "updates_refused": len(refused),
        "refusal_reasons": _tally(refused, "reason"),
        "refusal_codes": _tally(refused, "code"),
        "refusals_by_code": refusals_by_code(refused),
        "mean_staleness": sum(staleness) / len(staleness) if staleness else None,
        "max_staleness": max(staleness) if staleness else None,
    }


def _guard_figures(flushes: list[Event]) -> dict[str, Any]:
    """Updates the flush guard clipped, down-weighted and dropped, over the run's flushes."""
    return {key: sum(int(e.get(key) or 0) for e in flushes)
            for key in ("updates_clipped", "updates_downweighted", "updates_dropped")}


def _client_figures(events: list[Event]) -> dict[str, Any]:
    """Distinct clients joined, departures, timeouts and the finish reason."""
    joined = {e.get("client_id") for e in of_kind(events, CLIENT_JOINED)}
    finished = of_kind(events, RUN_FINISHED)
    return {
        "clients": len(joined),
        "clients_left": len(of_kind(events, CLIENT_LEFT)),
        "client_timeouts": len(of_kind(events, CLIENT_TIMEOUT)),
        "false_client_timeouts": false_client_timeouts(events),
        "finish_reason": finished[-1].get("reason") if finished else None,
    }


def false_client_timeouts(events: Iterable[Mapping[str, Any]]) -> int:
    """``client_timeout`` events for silence whose task's update was accepted later: the
    coordinator took a live client for dead. Older logs (no ``cause``) count those whose
    reason says ``no heartbeat``."""
    timed_out: set[tuple[Any, Any]] = set()
    false = 0
    for event in events:
        kind, key = event.get("kind"), (event.get("client_id"), event.get("task_id"))
        if kind == CLIENT_TIMEOUT and (event.get("cause") == "silent" or (
                event.get("cause") is None
                and str(event.get("reason") or "").startswith("no heartbeat"))):
            timed_out.add(key)
        elif kind == UPDATE_ACCEPTED and key in timed_out:
            timed_out.discard(key)
            false += 1
    return false


def _resilience_figures(events: list[Event]) -> dict[str, Any]:
    """Bytes saved by delta downloads, and what clients reported about retries and outages."""
    reports = (of_kind(events, UPDATE_ACCEPTED) + of_kind(events, UPDATE_REFUSED)
               + of_kind(events, CLIENT_LEFT))
    return {
        "delta_bytes_saved": _total(of_kind(events, DOWNLOAD_FINISHED)
                                    + of_kind(events, DOWNLOAD_USED), "bytes_saved"),
        "client_retries_reported": _total(reports, "retries"),
        "resumed_bytes": _total(reports, "resumed_bytes"),
        "offline_seconds": float(sum(float(e.get("offline_seconds") or 0.0)
                                     for e in reports)),
    }


def refusals_by_code(refused: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``update_refused`` events grouped by refusal code: count and one example detail each."""
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for event in refused:
        code = _refusal_code(event)
        counts[code] += 1
        examples.setdefault(code, str(event.get("reason") or ""))
    return {code: {"count": count, "example": examples[code]}
            for code, count in counts.most_common()}


def _refusal_code(event: Mapping[str, Any]) -> str:
    """An event's ``reason_code``; for an older run's event, what its status code implies."""
    code = event.get("reason_code")
    if code:
        return str(code)
    return code_for_status(str(event.get("code") or "")).value


def comm_figures(accepted: list[Event]) -> dict[str, Any]:
    """Compute and network seconds the clients reported with ``accepted`` updates, and the
    communication share of the updates that report both (None when none does)."""
    timed = [e for e in accepted
             if e.get("train_seconds") is not None and e.get("network_seconds") is not None]
    compute = sum(float(e["train_seconds"]) for e in timed)
    network = sum(float(e["network_seconds"]) for e in timed)
    total = compute + network
    return {"compute_seconds": compute, "network_seconds": network,
            "comm_share": network / total if timed and total > 0 else None}


def _privacy_record(flushes: list[Event], finished: list[Event]) -> dict[str, Any] | None:
    """The ``privacy`` field of ``run_finished`` (the record as the run ended), else of the
    last flush that has one (None when none has)."""
    records = [e["privacy"] for e in [*flushes, *finished]
               if isinstance(e.get("privacy"), Mapping)]
    return dict(records[-1]) if records else None


def _total(events: list[Event], field: str) -> int:
    """Sum of an integer ``field`` over ``events`` (missing or null counts as 0)."""
    return sum(int(e.get(field) or 0) for e in events)


def _tally(events: list[Event], field: str) -> dict[str, int]:
    """``field`` value -> count, most common first (missing values count as ``unknown``)."""
    counts = Counter(str(e.get(field) or "unknown") for e in events)
    return dict(counts.most_common())


def _opt_float(value: Any) -> float | None:
    """``float(value)``, or None when value is None."""
    return None if value is None else float(value)


NEAR_CHANCE = 0.1
"""A final accuracy within this share of the way from chance to 1 is "near chance"."""


def near_chance_warning(final_accuracy: float | None, num_classes: int | None) -> str | None:
    """The summary's ``warning`` when a classifier ended near chance (``1 / num_classes``):
    a run that learned nothing reads like any other in a table of figures."""
    if final_accuracy is None or not num_classes or num_classes < 2:
        return None
    chance = 1.0 / num_classes
    if final_accuracy > chance + NEAR_CHANCE * (1.0 - chance):
        return None
    return (f"final accuracy {final_accuracy:.3f} is near chance ({chance:.3f} for "
            f"{num_classes} classes): the model learned little. Look at [coordinator.training] "
            f"(local_epochs, batch_size, learning_rate), [coordinator] rounds and the flush "
            f"goal, or the data's labels")

