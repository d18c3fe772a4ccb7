"""``fedlink netcheck``'s advice: what a measured link suggests for chunk size, codec, deadline
and staleness."""

from __future__ import annotations

from fedlink.netcheck.advice import advise
from fedlink.netcheck.probe import Goodput, NetcheckResult


def _link(up_kbps: float, down_kbps: float, rtt_ms: float, model_bytes: int,
          stalls: int = 0) -> NetcheckResult:
    return NetcheckResult(target="h:1", rtt_ms=rtt_ms, rtt_min_ms=rtt_ms, jitter_ms=1.0,
                          up=Goodput(up_kbps, 1, (up_kbps,)),
                          down=Goodput(down_kbps, 1, (down_kbps,)), stalls=stalls, resets=0,
                          model_bytes=model_bytes, seconds=1.0)


def test_a_fast_link_keeps_fp32_and_large_chunks() -> None:
    advice = advise(_link(100_000, 100_000, 1.0, 400_000))
    assert (advice.codec, advice.density, advice.chunk_bytes) == ("fp32", None, 1024 * 1024)
    assert not advice.expect_staleness


def test_a_3g_link_with_a_big_model_gets_topk_and_a_long_deadline() -> None:
    # 750 kbit/s up: a 4 MB fp32 update would take ~43 s; 5 s fit ~470 kB of top-k
    advice = advise(_link(750, 1500, 200.0, 4_000_000))
    assert advice.codec == "topk" and advice.density is not None
    assert 0.05 < advice.density < 0.12
    assert advice.chunk_bytes == 32 * 1024  # ~0.5 s of 750 kbit/s, a power of two
    assert advice.deadline_s > 3 * 4_000_000 * 8 / 1_500_000  # three downloads at least
    assert advice.expect_staleness  # a task spends over 10 s on the network


def test_half_size_fits_and_stalls_mean_staleness() -> None:
    advice = advise(_link(1500, 4000, 80.0, 1_500_000, stalls=1))
    assert advice.codec == "fp16"
    assert advice.expect_staleness
    assert any("stalls or resets were seen" in note for note in advice.notes)
