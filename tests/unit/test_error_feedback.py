"""Error feedback: what was sent plus the residual is what was accumulated, across restarts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedlink.client import UpdatePipeline
from fedlink.client.feedback import RESIDUAL_FILENAME, ErrorFeedback
from fedlink.compress import get_codec
from fedlink.wire import unpack

finite = st.floats(-100, 100, width=32, allow_nan=False)


def pipeline(name: str = "topk", density: float = 0.05, **kw: object) -> UpdatePipeline:
    codec = get_codec(name) if name == "sign" else get_codec(name, density=density)
    return UpdatePipeline(codec=codec, **kw)  # type: ignore[arg-type]


def sent_of(p: UpdatePipeline, update: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    payload = p.process(update, rng)
    return unpack(payload.header, payload.data, update.size)


@given(updates=st.lists(hnp.arrays(np.float32, 40, elements=finite), min_size=1, max_size=6))
def test_topk_sent_plus_residual_equals_accumulated_exactly(updates: list[np.ndarray]) -> None:
    p = pipeline("topk", density=0.1)
    rng = np.random.default_rng(0)
    residual = np.zeros(40, np.float32)
    for update in updates:
        accumulated = update + residual
        sent = sent_of(p, update, rng)
        assert p.feedback is not None and p.feedback.residual is not None
        residual = p.feedback.residual
        np.testing.assert_array_equal(sent + residual, accumulated)


@pytest.mark.parametrize("name", ["topk+q8", "randk+q4", "sign", "topk+bf16"])
def test_sent_plus_residual_equals_accumulated_for_lossy_values(name: str) -> None:
    """Up to float32 rounding of ``accumulated - sent`` (a few ulps of the accumulated)."""
    p = pipeline(name, density=0.05)
    rng = np.random.default_rng(1)
    total_in = np.zeros(500, np.float64)
    total_sent = np.zeros(500, np.float64)
    for step in range(20):
        update = np.random.default_rng(step).standard_normal(500).astype(np.float32)
        before = np.zeros(500, np.float32) if p.feedback is None or p.feedback.residual is None \
            else p.feedback.residual.copy()
        sent = sent_of(p, update, rng)
        assert p.feedback is not None and p.feedback.residual is not None
        accumulated = update + before
        np.testing.assert_allclose(sent + p.feedback.residual, accumulated,
                                   rtol=1e-6, atol=1e-6 * float(np.abs(accumulated).max()))
        total_in += update
        total_sent += sent
    # nothing is lost: everything not yet sent is in the residual
    np.testing.assert_allclose(total_sent + p.feedback.residual, total_in, atol=1e-3)


def test_error_feedback_is_on_for_biased_codecs_only_unless_set() -> None:
    assert pipeline("topk").feedback is not None
    assert UpdatePipeline(codec=get_codec("sign")).feedback is not None
    assert UpdatePipeline(codec=get_codec("qsgd")).feedback is None
    assert UpdatePipeline().feedback is None
    assert pipeline("topk", error_feedback=False).feedback is None
    assert UpdatePipeline(codec=get_codec("fp16"), error_feedback=True).feedback is not None


def test_residual_survives_a_restart(tmp_path: Path) -> None:
    first = pipeline()
    first.attach_state(tmp_path)
    sent_of(first, np.arange(100, dtype=np.float32), np.random.default_rng(0))
    first.save_state()
    assert first.feedback is not None and first.feedback.residual is not None
    assert (tmp_path / RESIDUAL_FILENAME).exists()
    assert not list(tmp_path.glob(".*.tmp"))

    second = pipeline()
    second.attach_state(tmp_path)
    assert second.feedback is not None and second.feedback.residual is not None
    np.testing.assert_array_equal(second.feedback.residual, first.feedback.residual)


def test_unreadable_or_mismatched_residual_starts_from_zero(tmp_path: Path) -> None:
    path = tmp_path / RESIDUAL_FILENAME
    path.write_bytes(b"not a numpy file")
    assert ErrorFeedback(path).residual is None
    np.save(path, np.ones(3, np.float64))
    assert ErrorFeedback(path).residual is None
    np.save(path, np.ones(3, np.float32))
    feedback = ErrorFeedback(path)
    np.testing.assert_array_equal(feedback.accumulate(np.zeros(5, np.float32)), 0.0)
    assert feedback.residual is None
    feedback.reset()
    assert not path.exists()


def test_memory_only_pipeline_saves_nothing(tmp_path: Path) -> None:
    p = pipeline()
    sent_of(p, np.ones(10, np.float32), np.random.default_rng(0))
    p.save_state()
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("codec", ["fp32", "fp32-zlib"])
def test_error_feedback_with_a_lossless_codec_is_refused(codec: str) -> None:
    """Nothing is lost to feed back: the setting could not take effect (and in a virtual
    secure run its residual of zeros once replaced group random-k's)."""
    from fedlink.errors import ConfigError
    from fedlink.experiment.config import ExperimentConfig

    with pytest.raises(ConfigError, match=r"^client\.error_feedback: .* is lossless"):
        ExperimentConfig.from_dict({"client": {"compression": codec, "error_feedback": True}})
    ExperimentConfig.from_dict({"client": {"compression": codec, "error_feedback": False}})
