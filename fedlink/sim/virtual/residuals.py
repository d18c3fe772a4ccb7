"""Error-feedback residuals of a virtual population, within a memory budget, spilled to disk.

With a biased codec every client that has trained keeps a residual: one float32 vector of the
model's size. A population of 10^6 with a 100k-parameter model would need 400 GB in memory,
so ``ResidualStore`` keeps the most recently used residuals in memory up to
``[virtual] residual_memory_mb`` and writes the rest to one file of fixed-size slots (one per
spilled client, allocated on first spill; client -> slot is a dict entry), read back when the
client is selected again. Costs: in memory, the budget plus about 100 bytes per spilled client;
on disk, ``4 x parameters`` bytes per client that has trained. Reads and writes are
positioned (``os.pread``/``os.pwrite``) on one descriptor, in the loop's thread.
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

MB = 1 << 20


class ResidualStore:
    """Residual per client index: recent ones in memory, the rest in a slot file."""

    def __init__(self, memory_mb: float, directory: Path | None = None) -> None:
        self.budget = memory_mb * MB  # math.inf: never spill
        self._memory: OrderedDict[int, np.ndarray] = OrderedDict()
        self._held = 0
        self._slots: dict[int, int] = {}
        self._size = 0  # bytes per residual, fixed by the first one spilled
        self._directory = directory
        self._fd: int | None = None
        self.spilled_bytes = 0

    def take(self, index: int) -> np.ndarray | None:
        """Client ``index``'s residual (``None``: it has none yet), read back if spilled."""
        kept = self._memory.pop(index, None)
        if kept is not None:
            self._held -= kept.nbytes
            return kept
        slot = self._slots.get(index)
        if slot is None or self._fd is None:
            return None
        data = os.pread(self._fd, self._size, slot * self._size)
        return np.frombuffer(data, dtype=np.float32).copy()

    def put(self, index: int, residual: np.ndarray | None) -> None:
        """Keep client ``index``'s residual; spill the least recently used beyond the budget."""
        if residual is None:
            return
        residual = np.ascontiguousarray(residual, dtype=np.float32)
        self._memory[index] = residual
        self._held += residual.nbytes
        while self._held > self.budget and self._memory:
            oldest, vector = self._memory.popitem(last=False)
            self._held -= vector.nbytes
            self._spill(oldest, vector)

    @property
    def in_memory(self) -> int:
        """Residuals held in memory now."""
        return len(self._memory)

    @property
    def on_disk(self) -> int:
        """Clients with a slot in the spill file."""
        return len(self._slots)

    def close(self) -> None:
        """Close (and, being temporary, remove) the spill file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _spill(self, index: int, vector: np.ndarray) -> None:
        if self._fd is None:
            self._fd = self._open()
            self._size = vector.nbytes
        if vector.nbytes != self._size:
            raise ValueError(f"residual of {vector.nbytes} bytes; the store holds {self._size}")
        slot = self._slots.setdefault(index, len(self._slots))
        os.pwrite(self._fd, vector.tobytes(), slot * self._size)
        self.spilled_bytes = len(self._slots) * self._size

    def _open(self) -> int:
        # unlinked at once: the file lives as long as the descriptor, and no crash leaves it
        fd, name = tempfile.mkstemp(prefix="fedlink-residuals-", dir=self._directory)
        os.unlink(name)
        return fd
