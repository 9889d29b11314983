"""sparkgrad.nn: Keras-shaped models trained in C on oneDNN (`Sequential`, or `Model` of Keras'
functional API).

```python
from sparkgrad.nn import SGD, Dense, Sequential

model = Sequential([Dense(128, activation="relu", input_shape=(784,)),
                    Dense(64, activation="relu"), Dense(10)], seed=1)
model.compile(optimizer=SGD(0.07), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
model.fit(x, y, batch_size=100, epochs=5)
```
"""

from sparkgrad.nn import callbacks, losses, metrics, models, optimizers, schedules
from sparkgrad.nn.callbacks import EarlyStopping, LearningRateScheduler, ReduceLROnPlateau, TerminateOnNaN
from sparkgrad.nn.distributed import DistributedOptimizer
from sparkgrad.nn.graph import Input, KerasTensor
from sparkgrad.nn.history import History
from sparkgrad.nn.layers import (
    Activation,
    Add,
    Average,
    AveragePooling2D,
    AvgPool2D,
    BatchNormalization,
    Concatenate,
    Conv2D,
    Dense,
    Dot,
    Dropout,
    Embedding,
    Flatten,
    LayerNormalization,
    Maximum,
    MaxPool2D,
    MaxPooling2D,
    Minimum,
    Multiply,
    Reshape,
    Subtract,
)
from sparkgrad.nn.model import Model, ParamTensor, Sequential
from sparkgrad.nn.optimizers import SGD, Adadelta, Adagrad, Adam, AdamW, RMSprop
from sparkgrad.nn.preprocessing import (
    CategoryEncoding,
    Discretization,
    Hashing,
    IntegerLookup,
    Normalization,
    StringColumn,
    StringLookup,
)
from sparkgrad.nn.saved import load_model, model_from_bytes, model_to_bytes, save_model
from sparkgrad.nn.schedules import CosineDecay, ExponentialDecay, PiecewiseConstantDecay
from sparkgrad.nn.state import TrainState
from sparkgrad.nn.threads import configure_threads, get_num_threads, set_num_threads

__all__ = [
    "CategoryEncoding",
    "Discretization",
    "Hashing",
    "IntegerLookup",
    "Normalization",
    "StringColumn",
    "StringLookup",
    "Sequential",
    "Model",
    "Input",
    "KerasTensor",
    "save_model",
    "load_model",
    "model_to_bytes",
    "model_from_bytes",
    "History",
    "ParamTensor",
    "TrainState",
    "DistributedOptimizer",
    "Dense",
    "Conv2D",
    "MaxPool2D",
    "MaxPooling2D",
    "AveragePooling2D",
    "AvgPool2D",
    "Dropout",
    "Flatten",
    "Activation",
    "Reshape",
    "Add",
    "Subtract",
    "Multiply",
    "Average",
    "Maximum",
    "Minimum",
    "Concatenate",
    "Dot",
    "BatchNormalization",
    "LayerNormalization",
    "Embedding",
    "models",
    "losses",
    "metrics",
    "optimizers",
    "SGD",
    "Adam",
    "AdamW",
    "RMSprop",
    "Adadelta",
    "Adagrad",
    "schedules",
    "ExponentialDecay",
    "PiecewiseConstantDecay",
    "CosineDecay",
    "callbacks",
    "EarlyStopping",
    "ReduceLROnPlateau",
    "LearningRateScheduler",
    "TerminateOnNaN",
    "set_num_threads",
    "get_num_threads",
    "configure_threads",
]
