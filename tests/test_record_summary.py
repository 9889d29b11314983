"""TensorBoard event files, read back with the real tensorboard package."""

from __future__ import annotations

import os

import numpy as np
import pytest
from sparkgrad.data import tfrecord_iterator
from sparkgrad.errors import StateError
from sparkgrad.summary import EventWriter

tb_loader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def test_tensorboard_reads_scalars_and_histograms(tmp_path):
    with EventWriter(tmp_path) as w:
        for step in range(5):
            w.scalar("loss", 1.0 / (step + 1), step)
        w.scalars({"acc": 0.5, "lr": 0.1}, step=7)
        w.histogram("weights", np.arange(100, dtype=np.float32), step=3, bins=10)
    (name,) = os.listdir(tmp_path)
    assert name.startswith("events.out.tfevents.") and name == os.path.basename(w.path)

    events = list(tb_loader.LegacyEventFileLoader(w.path).Load())
    assert events[0].file_version == "brain.Event:2" and events[0].wall_time > 0
    assert events[1].step == 0 and events[1].summary.value[0].tag == "loss"

    acc = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"loss", "acc", "lr"}
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == [0, 1, 2, 3, 4]
    np.testing.assert_allclose([e.value for e in loss], [1.0, 0.5, 1 / 3, 0.25, 0.2], rtol=1e-6)
    assert acc.Scalars("lr")[0].step == 7
    (h,) = acc.Histograms("weights")
    assert h.step == 3 and h.histogram_value.num == 100 and h.histogram_value.max == 99
    assert sum(h.histogram_value.bucket) == 100


def test_flush_makes_whole_records_visible(tmp_path):
    w = EventWriter(tmp_path, flush_secs=3600)
    w.scalar("x", 1.0, 1)
    assert len(list(tfrecord_iterator(w.path))) == 1  # only the file_version event so far
    w.flush()
    assert len(list(tfrecord_iterator(w.path))) == 2
    w.close()
    with pytest.raises(StateError, match="closed"):
        w.scalar("x", 1.0, 2)
