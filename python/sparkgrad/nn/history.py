"""What fit returns: per-epoch metrics and per-log-interval step metrics (a leaf module)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class History:
    """What `Sequential.fit` returns: per-epoch metrics, Keras-style, and per-log-interval step metrics.

    After ``h = model.fit(x, y, epochs=3, validation_data=(vx, vy))``, ``h.history["val_accuracy"]`` is a
    list of three floats.
    """

    history: dict[str, list[float]] = field(default_factory=dict)
    """One list per metric, one value per completed epoch.

    ``loss``, ``accuracy``; ``val_loss`` and ``val_accuracy`` with validation data; whatever callbacks added.
    """
    steps: list[dict[str, float]] = field(default_factory=list)
    """One dict per log interval (``log_every`` steps).

    ``step`` (the model's step after the interval), and the interval's ``loss``, ``accuracy`` and ``lr``
    (learning rate).
    """
    epoch: list[int] = field(default_factory=list)
    """The 0-based index of each completed epoch, parallel to the lists of `history`."""

    def add_epoch(self, epoch: int, logs: Mapping[str, float]) -> None:
        """Records one completed epoch's metrics (fit calls it after the epoch's callbacks ran)."""
        self.epoch.append(epoch)
        for k, v in logs.items():
            self.history.setdefault(k, []).append(float(v))
