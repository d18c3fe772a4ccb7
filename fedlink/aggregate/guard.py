"""The last check before a new model version: finite, and not an explosion.

Norm bounding keeps a single update from moving the model far, but an aggregate can still go
wrong (finite values whose sum overflows float32, a server optimizer that diverges, a hook's
bug). ``step_problem`` says what is wrong with going from ``old`` to ``new``, or ``""``; the
engine then keeps ``old`` (and the optimizer's state from before the step) and logs why.
"""

from __future__ import annotations

import numpy as np

from fedlink.aggregate.robust import l2_norm, squares
from fedlink.aggregate.streaming import CHUNK

MAX_STEP_RATIO = 1e3
"""A step longer than this many times ``max(1, ||old||)`` is an explosion, never training."""


def step_problem(old: np.ndarray, new: np.ndarray) -> str:
    """Why ``new`` must not replace ``old`` as the global model ("" when it may).

    Works ``CHUNK`` values at a time: no model-sized temporary.
    """
    flat_old, flat_new = old.reshape(-1), new.reshape(-1)
    bad, total = 0, 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, flat_new.size, CHUNK):
            piece = flat_new[start:start + CHUNK].astype(np.float64)
            bad += int(np.count_nonzero(~np.isfinite(piece)))
            piece -= flat_old[start:start + CHUNK]
            total += squares(piece)
    if bad:
        return f"the new model has {bad} non-finite values (NaN or Inf)"
    step = float(np.sqrt(total))
    limit = MAX_STEP_RATIO * max(1.0, l2_norm(old))
    if not np.isfinite(step) or step > limit:
        return f"the step has norm {step:.3g}, over {MAX_STEP_RATIO:g} x the model's norm"
    return ""
