"""The two models users most often port to sparkgrad, defined in one place.

Both come back uncompiled, so the caller picks the optimizer and loss.

- `walkthrough_mlp`: the TensorFlowOnSpark-on-Databricks walkthrough's MLP,
  784 -> 128 -> 64 -> 10 with ReLU, truncated-normal weights (stddev
  1/sqrt(fan_in)) and zero biases; it outputs logits.
- `horovod_cnn`: the HorovodRunner tutorial's Keras CNN on 28x28x1 images,
  Conv2D(32, 3x3) -> Conv2D(64, 3x3) -> MaxPool 2x2 -> Dropout 0.25 ->
  Flatten -> Dense 128 -> Dropout 0.5 -> Dense 10 softmax, with Keras'
  default initialisers (glorot_uniform, zero biases).
"""

from __future__ import annotations

from sparkgrad.nn.layers import Conv2D, Dense, Dropout, Flatten, MaxPool2D
from sparkgrad.nn.model import Sequential


def walkthrough_mlp(seed: int = 1) -> Sequential:
    """The TensorFlowOnSpark-on-Databricks walkthrough's MLP for 784-feature inputs (flattened 28x28 images).

    784 -> Dense 128 ReLU -> Dense 64 ReLU -> Dense 10, truncated-normal weights (stddev ``1/sqrt(fan_in)``)
    and zero biases; it outputs logits. Returned uncompiled.

    Args:
        seed: Fixes the initial weights, dropout masks and shuffling.
    """
    init = "truncated_normal"
    return Sequential(
        [
            Dense(128, activation="relu", input_shape=(784,), kernel_initializer=init),
            Dense(64, activation="relu", kernel_initializer=init),
            Dense(10, kernel_initializer=init),
        ],
        seed=seed,
    )


def horovod_cnn(seed: int = 1) -> Sequential:
    """The HorovodRunner tutorial's Keras CNN for 28x28x1 images.

    Conv2D(32, 3x3) -> Conv2D(64, 3x3) -> MaxPool 2x2 -> Dropout 0.25 -> Flatten -> Dense 128 ->
    Dropout 0.5 -> Dense 10 softmax, with Keras's default initialisers (glorot_uniform, zero biases).
    Returned uncompiled.

    Args:
        seed: Fixes the initial weights, dropout masks and shuffling.
    """
    return Sequential(
        [
            Conv2D(32, (3, 3), activation="relu", input_shape=(28, 28, 1)),
            Conv2D(64, (3, 3), activation="relu"),
            MaxPool2D(pool_size=(2, 2)),
            Dropout(0.25),
            Flatten(),
            Dense(128, activation="relu"),
            Dropout(0.5),
            Dense(10, activation="softmax"),
        ],
        seed=seed,
    )
