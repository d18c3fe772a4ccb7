"""``fedlink.metrics.federated``: the federated curve from evaluation reports, weighted by
examples, and from the ``fed_eval_*`` metrics of runs written before evaluation tasks."""

from __future__ import annotations

import pytest

from fedlink.metrics import kinds
from fedlink.metrics.federated import federated_figures


def test_reports_are_weighted_by_examples_per_version() -> None:
    events = [kinds.EvaluationIssued.build(client_id=c, task_id=f"e{i}-v{v}", model_version=v)
              for i, (c, v) in enumerate([("a", 0), ("b", 0), ("c", 0), ("a", 2)])]
    events += [kinds.EvaluationReported.build(client_id=c, task_id="e", model_version=v,
                                              num_examples=n, loss=loss, accuracy=acc)
               for c, v, n, loss, acc in [("a", 0, 10, 2.0, 0.2), ("b", 0, 30, 1.0, 0.6),
                                          ("a", 2, 5, 0.5, 0.9)]]
    figures = federated_figures(events)
    curve = figures["federated_evaluation"]
    assert curve["versions"] == [0, 2] and curve["clients"] == [2, 1]
    assert curve["accuracy"] == pytest.approx([(10 * 0.2 + 30 * 0.6) / 40, 0.9])
    assert curve["loss"] == pytest.approx([(10 * 2.0 + 30 * 1.0) / 40, 0.5])
    assert curve["examples"] == [40, 5] and curve["issued"] == [3, 1]
    assert curve["last_client_accuracies"] == [0.9]
    assert figures["final_federated_accuracy"] == pytest.approx(0.9)


def test_runs_from_before_evaluation_tasks_still_read() -> None:
    old = [kinds.UpdateAccepted.build(client_id=c, task_id="t", base_version=0, client_metrics={
        "fed_eval_examples": n, "fed_eval_accuracy": acc, "fed_eval_loss": 1.0})
        for c, n, acc in [("a", 10, 0.5), ("b", 30, 0.1)]]
    curve = federated_figures(old)["federated_evaluation"]
    assert curve["accuracy"] == pytest.approx([(5 + 3) / 40]) and "issued" not in curve
    assert federated_figures([]) == {}
