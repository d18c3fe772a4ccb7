"""The run report: ``report.md`` plus SVG plots, written into a run folder.

Plots are written by :mod:`fedlink.metrics.svg` as plain SVG text: no plotting library, no
display, and a report costs a small run milliseconds rather than seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedlink.metrics.distribution import LABEL_PLOT, draw_label_distribution, label_section
from fedlink.metrics.events import FLUSH, UPDATE_ACCEPTED, Event
from fedlink.metrics.federated import CURVES_PLOT, SPREAD_PLOT, draw_federated
from fedlink.metrics.formatting import fmt_metric, human_bytes, human_seconds, key_figures
from fedlink.metrics.model_time import PLOTS as MODEL_TIME_PLOTS
from fedlink.metrics.model_time import draw_model_time
from fedlink.metrics.summary import comm_figures, made_elapsed, of_kind, start_elapsed
from fedlink.metrics.svg import Series, line_plot, write_svg
from fedlink.private import private_dir, touch_private

REPORT_FILENAME = "report.md"
"""The file name of the report inside the run folder."""

ACCURACY_VS_ROUND = "accuracy_vs_round.svg"
ACCURACY_VS_TIME = "accuracy_vs_time.svg"
LOSS_VS_ROUND = "loss_vs_round.svg"
PLOT_FILENAMES = (ACCURACY_VS_ROUND, ACCURACY_VS_TIME, LOSS_VS_ROUND, *MODEL_TIME_PLOTS,
                  LABEL_PLOT, CURVES_PLOT, SPREAD_PLOT)
"""Every plot a report may draw into the run folder."""


@dataclass(frozen=True)
class _Series:
    """One line to plot: x and y values, axis labels and the output file name."""

    filename: str
    title: str
    x: list[float]
    y: list[float]
    xlabel: str
    ylabel: str


def write_report(run_dir: Path, events: list[Event], summary: Mapping[str, Any]) -> Path:
    """Write ``report.md`` and its plots into ``run_dir`` (created if needed); return its path.

    A run with no ``flush`` events gets a report that says so, without plots.
    """
    private_dir(run_dir)
    flushes = of_kind(events, FLUSH)
    virtual = summary.get("mode") == "virtual"  # its events' clock is model time
    plots = [s for s in _series(flushes, start_elapsed(events), virtual) if s.x]
    for series in plots:
        _draw(run_dir / series.filename, series)
    path = run_dir / REPORT_FILENAME
    title = summary.get("run_name") or run_dir.name
    text = _markdown(str(title), summary, flushes, plots, _comm_shares(events, flushes))
    # Like the other plots, only for a run that trained (a report of nothing stays quick).
    labels = label_section(draw_label_distribution(run_dir, summary.get("label_distribution")
                                                   or {})) if flushes else ""
    extra = [part for part in (draw_federated(run_dir, events, summary), labels,
                               _model_time_section(run_dir, summary)) if part]
    touch_private(path).write_text(text + "".join(f"\n{part}\n" for part in extra),
                                   encoding="utf-8")
    return path


def _comm_shares(events: list[Event], flushes: list[Event]) -> list[float | None]:
    """Per flush, the communication share of the accepted updates it folded in."""
    by_task = {e.get("task_id"): e for e in of_kind(events, UPDATE_ACCEPTED)}
    return [comm_figures([by_task[t] for t in flush.get("updates") or [] if t in by_task])
            ["comm_share"] for flush in flushes]


def _series(flushes: list[Event], start: float, virtual: bool = False) -> list[_Series]:
    """The plots a run's flush events support (empty series are dropped by the caller); a
    ``virtual`` run's times are model seconds."""
    acc = [e for e in flushes if e.get("accuracy") is not None]
    loss = [e for e in flushes if e.get("loss") is not None]
    accuracy = [float(e["accuracy"]) for e in acc]
    return [
        _Series(ACCURACY_VS_ROUND, "Accuracy vs model version", _versions(acc), accuracy,
                "model version", "accuracy"),
        _Series(ACCURACY_VS_TIME, "Accuracy vs time",
                [made_elapsed(e) - start for e in acc], accuracy,
                "model seconds since run start" if virtual else "seconds since run start",
                "accuracy"),
        _Series(LOSS_VS_ROUND, "Loss vs model version", _versions(loss),
                [float(e["loss"]) for e in loss], "model version", "loss"),
    ]


def _versions(flushes: list[Event]) -> list[float]:
    """The model version after each flush (its round number if the version is missing)."""
    versions = [e.get("model_version") for e in flushes]
    return [float(i if v is None else v) for i, v in enumerate(versions, start=1)]


def _draw(path: Path, series: _Series) -> None:
    """Write one line plot as an SVG file."""
    write_svg(path, line_plot([Series(series.x, series.y)], title=series.title,
                              xlabel=series.xlabel, ylabel=series.ylabel))


def _markdown(
    title: str, summary: Mapping[str, Any], flushes: list[Event], plots: list[_Series],
    shares: list[float | None],
) -> str:
    """The whole report as Markdown text."""
    parts = [f"# Run report: {_cell(title)}", _summary_section(summary)]
    parts.append(_plots_section(flushes, plots))
    parts.append(_refusals_section(summary))
    network = summary.get("network")
    if network:
        parts.append(_network_section(network.get("profiles") or {}))
    parts.append(_rounds_section(flushes, shares))
    return "\n\n".join(parts) + "\n"


def _summary_section(summary: Mapping[str, Any]) -> str:
    """The key figures as a two-column table."""
    rows = [[label, value] for label, value in key_figures(dict(summary))]
    rows.extend(_resilience_rows(summary))
    privacy = summary.get("privacy")
    if isinstance(privacy, Mapping) and privacy.get("epsilon") is not None:
        rows.append(["Privacy", _privacy_text(privacy)])
    reason = summary.get("finish_reason")
    if reason:
        rows.append(["Finish reason", str(reason)])
    return "## Summary\n\n" + _table(["Figure", "Value"], rows)


def _privacy_text(privacy: Mapping[str, Any]) -> str:
    """"epsilon 2.31 at delta 1e-05 (mode, accountant, z, q, steps, S)"."""
    details = [str(privacy.get(k)) for k in ("mode", "accountant") if privacy.get(k)]
    for label, key in (("z", "noise_multiplier"), ("q", "sample_rate"), ("steps", "steps"),
                       ("S", "clip_norm")):
        if privacy.get(key) is not None:
            details.append(f"{label} = {privacy[key]:.4g}")
    return (f"epsilon {float(privacy['epsilon']):.4g} at delta {privacy.get('delta')}"
            f" ({', '.join(details)})")


def _resilience_rows(summary: Mapping[str, Any]) -> list[list[str]]:
    """Rows for what bad networks cost and what resilience saved; only the non-zero ones."""
    figures: list[tuple[str, str, Callable[[float], str]]] = [
        ("Uplink compression (fp32 bytes / bytes sent)", "uplink_compression_ratio",
         lambda ratio: f"{ratio:.1f}x"),
        ("Downlink compression (fp32 models / bytes received)", "downlink_compression_ratio",
         lambda ratio: f"{ratio:.1f}x"),
        ("Saved by delta downloads", "delta_bytes_saved", human_bytes),
        ("Upload bytes resumed (not resent)", "resumed_bytes", human_bytes),
        ("Client retries (reported)", "client_retries_reported", lambda n: str(int(n))),
        ("Client time offline (reported)", "offline_seconds", human_seconds),
        ("Clients that gave up (retry budget spent)", "clients_gave_up",
         lambda n: str(int(n))),
        ("Clients cut off at the run's end (still on the network)", "clients_cut_off",
         lambda n: str(int(n))),
    ]
    return [[label, fmt(summary[key])] for label, key, fmt in figures if summary.get(key)]


def _plots_section(flushes: list[Event], plots: list[_Series]) -> str:
    """Embedded plots, or a note explaining why there are none."""
    if not flushes:
        return "## Plots\n\nNo rounds completed (no flush events), so there is nothing to plot."
    if not plots:
        return "## Plots\n\nNo round recorded an accuracy or a loss, so there is nothing to plot."
    images = [f"![{s.title}]({s.filename})" for s in plots]
    return "## Plots\n\n" + "\n\n".join(images)


def _refusals_section(summary: Mapping[str, Any]) -> str:
    """Refused updates, one row per refusal code with an example detail (an older summary
    without codes: one row per reason), or a note that none were refused."""
    by_code = summary.get("refusals_by_code")
    if by_code:
        rows = [[str(code), str(entry.get("count", 0)), str(entry.get("example") or "")]
                for code, entry in by_code.items()]
        return "## Refused updates\n\n" + _table(["Code", "Count", "Example"], rows)
    reasons = summary.get("refusal_reasons") or {}
    if not reasons:
        return "## Refused updates\n\nNo updates were refused."
    rows = [[reason, str(count)] for reason, count in reasons.items()]
    return "## Refused updates\n\n" + _table(["Reason", "Count"], rows)


def _network_section(profiles: Mapping[str, Mapping[str, Any]]) -> str:
    """Per link profile: what crossed the emulated links and what it cost the clients."""
    header = ["Profile", "Clients", "Accepted", "Refused", "Bytes up", "Bytes down", "Resets",
              "Blackouts", "Stalled", "Retries", "Time on network", "Comm share"]
    rows = [[name, str(row.get("clients", 0)), str(row.get("accepted", 0)),
             str(row.get("refused", 0)), human_bytes(row.get("bytes_up") or 0),
             human_bytes(row.get("bytes_down") or 0), str(row.get("resets", 0)),
             str(row.get("blackouts", 0)), human_seconds(row.get("stalled_s")),
             str(row.get("retries", 0)), human_seconds(row.get("network_seconds")),
             _share(row.get("comm_share"))]
            for name, row in profiles.items()]
    note = ("Bytes are what crossed each emulated link (gRPC framing included); time on "
            "network is the clients' total time downloading, uploading and committing; comm "
            "share is that time over it plus local training.")
    ignored = [f"{name} ({', '.join(row['packet_only'])})" for name, row in profiles.items()
               if row.get("packet_only")]
    if ignored:
        note += (" Info: the TCP proxy tier cannot drop single packets, so these profiles' "
                 "packet-only settings were not applied: " + "; ".join(ignored) + ".")
    return "## Network\n\n" + note + "\n\n" + _table(header, rows)


def _share(value: Any) -> str:
    """A share as a percentage, or ``-`` when unknown."""
    return "-" if value is None else f"{float(value):.0%}"


def _rounds_section(flushes: list[Event], shares: list[float | None]) -> str:
    """One table row per flush, or a note that no round completed; with the share of the
    clients' time spent communicating when they reported it."""
    if not flushes:
        return "## Rounds\n\nNo rounds completed."
    header = ["Round", "Version", "Accuracy", "Loss", "Updates", "Bytes up", "Bytes down",
              "Seconds"]
    rows = [_round_row(i, e) for i, e in enumerate(flushes, start=1)]
    if any(e.get("epsilon") is not None for e in flushes):  # a DP run: epsilon per flush
        header.append("Epsilon")
        for row, flush in zip(rows, flushes, strict=True):
            row.append(fmt_metric(flush.get("epsilon")))
    if any(share is not None for share in shares):
        header.append("Comm share")
        for row, share in zip(rows, shares, strict=True):
            row.append("-" if share is None else f"{share:.0%}")
    return "## Rounds\n\n" + _table(header, rows)


def _round_row(number: int, flush: Event) -> list[str]:
    """The per-round table row of one flush event."""
    return [
        str(number),
        str(flush.get("model_version", "-")),
        fmt_metric(flush.get("accuracy")),
        fmt_metric(flush.get("loss")),
        str(flush.get("num_updates", "-")),
        human_bytes(flush.get("bytes_up") or 0),
        human_bytes(flush.get("bytes_down") or 0),
        human_seconds(flush.get("round_seconds")),
    ]


def _model_time_section(run_dir: Path, summary: Mapping[str, Any]) -> str:
    """A virtual-clock run's model time against its wall time, with plots, and where the
    fleet's time went per round and per link profile; for a run on real time, why there is
    none."""
    model_s = summary.get("model_seconds")
    if model_s is None:
        return ("## Model time\n\nNone: this run ran on real time, so every time in this "
                "report is wall-clock time. A virtual-clock run (`[run] mode = \"virtual\"`) "
                "reports the time a real fleet would take beside the simulation's wall time.")
    parts = ["## Model time", _model_time_intro(float(model_s), summary)]
    parts.extend(f"![{title}]({name})" for title, name in draw_model_time(run_dir, summary))
    rounds = summary.get("time_by_round") or []
    if rounds:
        parts.append("Per round (model time summed over its tasks):\n\n" + _table(
            ["Round", "Tasks", "Communication", "Compute", "Comm share"],
            [[str(r["round"]), *_time_cells(r)] for r in rounds]))
    profiles = summary.get("time_by_profile") or {}
    if profiles:
        parts.append("Per link profile (model time summed over its clients' tasks):\n\n"
                     + _table(
            ["Profile", "Tasks", "Communication", "Compute", "Comm share"],
            [[str(name), *_time_cells(row)] for name, row in profiles.items()]))
    return "\n\n".join(parts)


def _model_time_intro(model_s: float, summary: Mapping[str, Any]) -> str:
    """Model time, wall time and the communication share, in two sentences."""
    wall = summary.get("simulation_seconds")
    speed = f" (model time is {model_s / wall:.3g}x the wall time)" if wall else ""
    text = (f"The run lasted {human_seconds(model_s)} of model time (what the fleet on its "
            f"modelled links and devices would take), simulated in {human_seconds(wall)} of "
            f"wall time{speed}.")
    share = summary.get("communication_share")
    if share is not None:
        text += (f" Communication (downloads, uploads, commits and their round trips) took "
                 f"{_share(share)} of the clients' busy model time, training the rest; time "
                 "paused offline is in neither. A round is the model version its tasks trained "
                 "on, plus one; tasks still running at the end fall in the round after the "
                 "last flush.")
    return text


def _time_cells(row: Mapping[str, Any]) -> list[str]:
    """Tasks, communication and compute model time, and the share, of a time row."""
    return [str(row.get("tasks", 0)), human_seconds(row.get("network_s")),
            human_seconds(row.get("compute_s")), _share(row.get("comm_share"))]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table; the first column is left-aligned, others right."""
    align = [":---"] + ["---:"] * (len(header) - 1)
    lines = [_row(header), _row(align)]
    lines.extend(_row([_cell(c) for c in row]) for row in rows)
    return "\n".join(lines)


def _row(cells: Sequence[str]) -> str:
    """One Markdown table row."""
    return "| " + " | ".join(cells) + " |"


def _cell(text: str) -> str:
    """Escape text for a Markdown table cell (pipes, newlines)."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
