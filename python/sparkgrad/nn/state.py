"""The state of a training run (a leaf module): what a checkpoint holds
besides the parameters, and what fit reads and advances.

``Sequential.state`` is the live TrainState of a model (step, epoch, rows of
the current epoch, the RNG state at the start of the epoch); the model RNG's
current state lives in C and the optimizer state in the optimizer, so
``Sequential.train_state()`` returns a complete snapshot and
``Sequential.restore_train_state()`` puts one back, whole. Checkpoints write
and read nothing else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np


def _no_slots() -> np.ndarray:
    return np.zeros(0, np.float32)


@dataclass
class TrainState:
    """The state of a training run besides the parameters: what a checkpoint holds and fit resumes from.

    ``model.state`` is the live state fit reads and advances; `Sequential.train_state` returns a complete
    snapshot (with the RNG and the optimizer's state) and `Sequential.restore_train_state` puts one back.
    """

    step: int = 0
    """Optimizer steps taken by fit (under a parameter server: the global step)."""
    epoch: int = 0
    """Epochs completed."""
    epoch_pos: int = 0
    """Rows of the current epoch already trained (0 at an epoch end)."""
    rng: tuple[int, int] = (0, 0)
    """The model RNG (dropout masks, shuffling) as ``(seed, counter)``."""
    epoch_rng: tuple[int, int] | None = None
    """The RNG at the start of the current epoch, from which its shuffle is redrawn on resume (None: not started)."""
    optimizer_kind: str = ""
    """The optimizer's `kind` (``"adam"``, ...), ``""`` when the snapshot holds no optimizer state."""
    optimizer_steps: int = 0
    """The optimizer's step count."""
    optimizer_slots: np.ndarray = field(default_factory=_no_slots)
    """The optimizer's slots (momentum, moments), flat float32; empty when none."""

    def copy(self) -> TrainState:
        """A deep copy (the slot array is copied too)."""
        return dataclasses.replace(self, optimizer_slots=self.optimizer_slots.copy())
