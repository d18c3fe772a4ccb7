"""The conformance check is itself checked: each deliberately broken client (a mutant of the
edge client, ``conformance_mutant.py``) fails the check its mutation breaks, and the honest
edge client passes every check (``test_conformance.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedlink.conformance import CHECKS

pytestmark = pytest.mark.timeout(240)

HERE = Path(__file__).resolve().parent
MUTANT = HERE / "conformance_mutant.py"

BROKEN: dict[str, tuple[str, tuple[str, ...]]] = {
    "never_join": ("join", ()),
    "exit_3": ("task", ()),
    "restart_download": ("resume_download", ()),
    "restart_upload": ("resume_upload", ()),
    "drop_on_lost_reply": ("idempotent_commit", ()),
    "no_delta": ("delta", ()),
    "stop_on_refusal": ("refusal", ()),
    "reuse_upload_id": ("new_upload_id", ()),
    "no_verify": ("verify_model", ()),
    "no_heartbeat": ("heartbeat", ()),
    "ignore_retry_hint": ("retry_hint", ()),
    "no_rejoin": ("rejoin", ()),
    "no_evaluate": ("evaluate", ()),
    "decline_evaluations": ("evaluate", ()),
    "no_metrics": ("metrics", ()),
    "no_leave": ("leave", ()),
    "no_inline": ("inline", ("--codecs", "fp32")),
    "distrust_delta": ("codec", ("--codecs", "fp16")),
    "naive_qsgd": ("lossy_update", ("--update-codecs", "qsgd")),
    "numpy_randk": ("lossy_update", ("--update-codecs", "randk+q8")),
    "no_values_checksum": ("lossy_update", ("--update-codecs", "sign")),
    "no_unmask": ("secure_round", ()),
    "plain_in_secure": ("secure_round", ()),
    "drop_on_lost_masked_reply": ("secure_retry", ()),
    "no_key_shares": ("secure_dropout", ()),
    "wrong_mask_sign": ("secure_round", ()),
    "reveal_both": ("secure_dropout", ()),
    "numpy_graph": ("secure_options", ()),
}
"""Mutant -> (the check it must fail, extra options narrowing the run to that check)."""


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("edge") / "local.npz"
    rng = np.random.default_rng(0)  # 64 features, 10 classes: the edge client's logreg
    np.savez(path, x=rng.normal(size=(200, 64)).astype(np.float32),
             y=rng.integers(0, 10, size=200))
    return path


def run_mutant(name: str, data: Path, out: Path, *extra: str) -> tuple[int, dict[str, bool],
                                                                       str]:
    cmd = (f"{sys.executable} {MUTANT} {name} --server {{server}} --data {data} "
           f"--compression {{update_codec}}")
    result = subprocess.run([sys.executable, "-m", "fedlink", "conformance", "--client-cmd",
                             cmd, "--json", str(out), "--timeout-s", "60", *extra],
                            capture_output=True, text=True, timeout=220)
    verdicts = json.loads(out.read_text()) if out.exists() else {}
    return result.returncode, verdicts, result.stdout + result.stderr


def test_every_check_has_a_mutant_that_fails_it() -> None:
    assert {check for check, _ in BROKEN.values()} == set(CHECKS)


@pytest.mark.parametrize("name", list(BROKEN))
def test_the_mutant_fails_its_check(name: str, data: Path, tmp_path: Path) -> None:
    check, extra = BROKEN[name]
    if check.startswith("secure"):
        pytest.importorskip("cryptography")
    code, verdicts, output = run_mutant(name, data, tmp_path / "verdicts.json",
                                        "--only", check, *extra)
    assert code == 1, output
    failed = [verdict for verdict, passed in verdicts.items() if not passed]
    assert failed and all(v.split(": ")[-1] == check for v in failed), output
    assert f"FAIL  {failed[0]}" in output
    if name == "exit_3":  # the client's own status, as it gave it
        assert "client exit code 3" in output
    assert DETAILS.get(name, "") in output


DETAILS = {
    "no_unmask": "(group 1) without SecureUnmask",
    "plain_in_secure": "the client does not speak secure aggregation",
    "drop_on_lost_masked_reply": "sent 1 time(s)",
    "no_key_shares": "key shares for []",
    "wrong_mask_sign": "a client's masked update or unmask answer is wrong",
    "reveal_both": "not its neighbours that the unmask request names so",
    "numpy_graph": "(group 1) without SecureShare",
}
"""What the failed verdict must say for the secure mutants (the coordinator alone could not
tell: the others' answers unmask a sum without the client's)."""


@pytest.mark.parametrize("check", ["heartbeat", "retry_hint", "metrics", "new_upload_id",
                                   "secure_round", "secure_retry", "secure_dropout",
                                   "secure_options"])
def test_the_unmutated_client_passes_the_checks_run_alone(check: str, data: Path,
                                                          tmp_path: Path) -> None:
    """The narrowed runs above fail because of the mutation, not because of the narrowing."""
    if check.startswith("secure"):
        pytest.importorskip("cryptography")
    code, verdicts, output = run_mutant("honest", data, tmp_path / "verdicts.json",
                                        "--only", check)
    assert code == 0 and verdicts == {check: True}, output
