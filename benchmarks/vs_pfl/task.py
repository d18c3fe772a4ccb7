"""The task fedlink and pfl-research both run for ``vs_pfl_ratio`` (``sim_scale.py``).

A population of ``users`` whose data is made only when a user is sampled: user ``u`` holds
between ``MIN_EXAMPLES`` and ``MAX_EXAMPLES`` digits images drawn from the training pool by a
generator seeded by (``SEED``, ``u``): the same user has the same examples in both frameworks.
An MLP 64-64-10, plain local SGD for one epoch of minibatches of ``BATCH_SIZE``, updates
weighted by examples, the server averaging them (learning rate 1). numpy only: the pfl side
imports this module from its own virtualenv, where fedlink is not installed.
"""

from __future__ import annotations

import numpy as np

FEATURES = 64
CLASSES = 10
HIDDEN = (64, 64)
BATCH_SIZE = 16
LEARNING_RATE = 0.3
MIN_EXAMPLES = 8
MAX_EXAMPLES = 32
SEED = 16


def user_indices(user: int, pool: int) -> np.ndarray:
    """Indices into the training pool (of ``pool`` examples) of user ``user``'s examples."""
    rng = np.random.default_rng([SEED, user])
    count = int(rng.integers(MIN_EXAMPLES, MAX_EXAMPLES + 1))
    return rng.integers(pool, size=count)
