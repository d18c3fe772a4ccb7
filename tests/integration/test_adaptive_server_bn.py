"""The guide's "Bring your own" BatchNorm CNN with an adaptive server optimizer.

FedYogi and FedAdam step the model's weights; its BatchNorm running statistics are buffers,
averaged, never stepped (``docs/model-state.md``). Stepped as weights, a ``running_var``
went negative after one round and the CNN ended at 0.656 where FedAvg reaches 0.98. The
guide's own code (``docs/extending.md``) runs here, with only ``server_optimizer`` added to
its config and the optimizer's default learning rate (what a user who names it gets).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
CONFIG_START = '"coordinator": {"rounds": 10,'


def _readme_code(server_optimizer: str) -> str:
    section = GUIDE.read_text().split("## Bring your own", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert code.count(CONFIG_START) == 1, "the guide's config changed: update this test"
    return code.replace(CONFIG_START, f'"coordinator": {{"server_optimizer": '
                                      f'"{server_optimizer}", "rounds": 10,')


@pytest.mark.timeout(360)
@pytest.mark.parametrize("server_optimizer", ["fedyogi", "fedadam"])
def test_readme_cnn_learns_with_adaptive_server_optimizers(
        server_optimizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # its run folder goes to ./runs
    torch.manual_seed(0)  # the snippet builds its CNN before anything seeds it
    namespace: dict[str, object] = {}
    exec(compile(_readme_code(server_optimizer), "docs/extending.md", "exec"), namespace)
    result = namespace["result"]
    summary = result.summary  # type: ignore[attr-defined]
    assert summary["config"]["coordinator"]["server_optimizer"] == server_optimizer
    assert summary["rounds"] == 10
    assert summary["final_accuracy"] >= 0.95, summary["final_accuracy"]
    state = result.model  # type: ignore[attr-defined]
    variances = [k for k in state if k.endswith("running_var")]
    assert variances and all(bool((state[k] > 0).all()) for k in variances)
    assert all(bool(torch.isfinite(v.float()).all()) for v in state.values())
