"""What fit returns: per-epoch metrics and per-log-interval step metrics (a leaf module)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class History:
    """Per-epoch metrics (``history``, Keras-style) and per-log-interval step metrics (``steps``)."""

    history: dict[str, list[float]] = field(default_factory=dict)
    steps: list[dict[str, float]] = field(default_factory=list)
    epoch: list[int] = field(default_factory=list)

    def add_epoch(self, epoch: int, logs: Mapping[str, float]) -> None:
        self.epoch.append(epoch)
        for k, v in logs.items():
            self.history.setdefault(k, []).append(float(v))
