"""Reading tests/fixtures/tf/expected.json, the values TensorFlow decoded from its own fixtures, and
finding an interpreter with TensorFlow for the tests that run it."""

from __future__ import annotations

import base64
import math
import os
import pathlib
import sys

import pytest

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "tf"


def plain(x):
    """expected.json's encoding (bytes as b64, non-finite floats as repr) back to Python."""
    if isinstance(x, dict) and "b64" in x:
        return base64.b64decode(x["b64"])
    if isinstance(x, dict) and "float" in x:
        return float(x["float"])
    if isinstance(x, list):
        return [plain(v) for v in x]
    return x


def same(a, b) -> bool:
    """Exact equality, including -0.0 vs 0.0 and inf."""
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return float(a) == float(b) and math.copysign(1, float(a)) == math.copysign(1, float(b))
    return a == b


def tf_python() -> str:
    """An interpreter that imports TensorFlow: $SPARKGRAD_TF_PYTHON, else this one if it has it;
    without either the calling test is skipped."""
    env = os.environ.get("SPARKGRAD_TF_PYTHON")
    if env:
        return env
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        pytest.skip("tensorflow not importable and SPARKGRAD_TF_PYTHON not set")
    return sys.executable
