"""Compression that survives masking: every client of a round keeps the same coordinates.

Masks cancel only coordinate by coordinate, so a client cannot pick its own top-k: the group
keeps one set of ``k = ceil(density * n)`` coordinates, drawn from a seed that the round fixes
(``round_seed``: SHA-256 of the run's public seed and the round id), by the ``randk`` index
rule of protocol 1.1 (``fedlink.compress.sparse.splitmix_indices``). The coordinator and every
client compute the same indices from public values and nothing else travels for them; each
client masks and sends only its ``k`` kept values, and the unmasked sum of those is the sum of
the full updates restricted to the kept coordinates.

The kept values are not rescaled (random-k's ``n / k`` rescaling is unbiased but multiplies
the variance by ``n / k``); what a client did not send stays with it as a residual that joins
its next update (error feedback, ``keep``), so every coordinate is sent eventually.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from fedlink.compress.sparse import kept_count, splitmix_indices
from fedlink.errors import ConfigError
from fedlink.secagg.base import SecAggError


def round_seed(run_seed: int, round_id: int) -> int:
    """The public seed of a round's kept coordinates: the first 8 bytes (little-endian) of
    SHA-256 of ``"fedlink-secagg/randk/{run_seed}/{round_id}"``, top bit cleared (< 2**63)."""
    digest = hashlib.sha256(f"fedlink-secagg/randk/{run_seed}/{round_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass(frozen=True)
class SharedRandK:
    """The group's random-k: ``density`` (0 < density <= 1) of the coordinates, the same for
    every client of a round."""

    density: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.density) and 0 < self.density <= 1):
            raise ConfigError(f"secagg density: a fraction in (0, 1], got {self.density}")

    def indices(self, seed: int, size: int) -> np.ndarray:
        """The kept coordinates of a vector of ``size`` values, ascending."""
        return splitmix_indices(seed, size, kept_count(self.density, size))

    def keep(self, update: np.ndarray, residual: np.ndarray | None,
             indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(kept values, new residual)`` of ``update`` plus the client's ``residual``: the
        values at ``indices`` go out, the rest stays for the next round."""
        total = np.array(update, dtype=np.float64)
        if residual is not None:
            if residual.shape != total.shape:
                raise SecAggError(f"a residual of shape {residual.shape} for an update of "
                                  f"shape {total.shape}")
            total += residual
        kept = total[indices].copy()
        total[indices] = 0.0
        return kept, total

    @staticmethod
    def carry(residual: np.ndarray, indices: np.ndarray, kept: np.ndarray,
              sent: np.ndarray) -> None:
        """Add to ``residual`` (in place) what encoding lost of the kept values: ``kept`` minus
        ``sent``, the values the client's encoded vector stands for (clipping and rounding),
        so that error is fed back too."""
        residual[indices] += np.asarray(kept, np.float64) - np.asarray(sent, np.float64)


def group_indices(density: float, randk_seed: int, round_id: int,
                  size: int) -> np.ndarray | None:
    """The coordinates every member of round ``round_id`` keeps of a ``size``-value update, by
    the run's public ``randk_seed`` (``None``: a ``density`` of 0, unset on the wire, or 1
    keeps every coordinate)."""
    if density in (0, 1):
        return None
    return SharedRandK(density).indices(round_seed(randk_seed, round_id), size)


def kept_size(density: float, size: int) -> int:
    """How many of ``size`` coordinates a group with ``density`` keeps (all for 0 or 1)."""
    return size if density in (0, 1) else kept_count(density, size)


def masked_size(density: float, size: int, weighted: bool) -> int:
    """The values of one member's masked vector for a ``size``-value update: the group's
    kept coordinates, and the weight after them when the sum carries it (``weighted``;
    under distributed DP the coordinator adds up the weights it named instead)."""
    return kept_size(density, size) + (1 if weighted else 0)


def scatter(kept: np.ndarray, indices: np.ndarray, size: int) -> np.ndarray:
    """A vector of ``size`` zeros with ``kept`` at ``indices`` (the decoded sum, in place)."""
    full = np.zeros(size, dtype=np.float64)
    full[indices] = kept
    return full
