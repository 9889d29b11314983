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
    """step: optimizer steps taken by fit (the global step under a parameter
    server); epoch: epochs completed; epoch_pos: rows of the current epoch
    already trained (0 at an epoch end); rng: the model RNG (seed, counter);
    epoch_rng: the RNG at the start of the current epoch, from which its
    shuffle is redrawn on resume (None: not started); optimizer_kind,
    optimizer_steps, optimizer_slots: the optimizer's state ("" when none)."""

    step: int = 0
    epoch: int = 0
    epoch_pos: int = 0
    rng: tuple[int, int] = (0, 0)
    epoch_rng: tuple[int, int] | None = None
    optimizer_kind: str = ""
    optimizer_steps: int = 0
    optimizer_slots: np.ndarray = field(default_factory=_no_slots)

    def copy(self) -> TrainState:
        return dataclasses.replace(self, optimizer_slots=self.optimizer_slots.copy())
