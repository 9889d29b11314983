"""Mirrors a sparkgrad.nn.Sequential in PyTorch from identical weights, for
the reference comparisons of tests/test_nn_*.py (layouts: NHWC activations,
Keras kernels [C, OC] / [KH, KW, C, OC] on our side)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from sparkgrad.nn import Activation, Conv2D, Dense, Dropout, Flatten
from sparkgrad.nn.layers import AveragePooling2D, MaxPool2D


class TorchMirror:
    """The same network as ``model`` with torch leaf tensors for every parameter."""

    def __init__(self, model) -> None:
        self.model = model
        self.tensors = [torch.tensor(w, dtype=torch.float32, requires_grad=True) for w in model.get_weights()]
        self.shapes = model._core.layer_shapes()

    def forward(self, x: np.ndarray) -> torch.Tensor:
        m = self.model
        h, w, c = self.shapes[0][0]
        t = torch.from_numpy(np.asarray(x, np.float32).reshape(-1, h, w, c)).permute(0, 3, 1, 2)  # NCHW
        flat = h == 1 and w == 1
        if flat:
            t = t.reshape(t.shape[0], -1)
        ti = 0
        for layer, (_, _, (pt, pl, pb, pr)) in zip(m.layers, self.shapes, strict=True):
            if isinstance(layer, Dense):
                kernel, bias = self.tensors[ti], self.tensors[ti + 1]
                ti += 2
                t = t @ kernel + bias
                t = _act(t, layer.activation)
            elif isinstance(layer, Conv2D):
                kernel, bias = self.tensors[ti], self.tensors[ti + 1]
                ti += 2
                t = F.pad(t, (pl, pr, pt, pb))
                t = F.conv2d(t, kernel.permute(3, 2, 0, 1), bias, stride=layer.strides)
                t = _act(t, layer.activation)
            elif isinstance(layer, MaxPool2D):
                t = F.pad(t, (pl, pr, pt, pb), value=-float("inf"))
                t = F.max_pool2d(t, layer.pool_size, stride=layer.strides or layer.pool_size[0])
            elif isinstance(layer, AveragePooling2D):
                s = layer.strides or layer.pool_size[0]
                ones = torch.ones_like(t[:1, :1])
                num = F.avg_pool2d(F.pad(t, (pl, pr, pt, pb)), layer.pool_size, stride=s)
                den = F.avg_pool2d(F.pad(ones, (pl, pr, pt, pb)), layer.pool_size, stride=s)
                t = num / den
            elif isinstance(layer, Flatten):
                t = t.permute(0, 2, 3, 1).reshape(t.shape[0], -1)  # NHWC order, as Keras
            elif isinstance(layer, Activation):
                t = _act(t, layer.activation)
            elif isinstance(layer, Dropout):
                if layer.rate != 0.0:
                    raise ValueError("TorchMirror compares deterministic networks (dropout rate 0)")
            else:
                raise TypeError(type(layer))
        return t  # logits (softmax is folded into the loss)

    def loss(self, x: np.ndarray, y: np.ndarray) -> torch.Tensor:
        logits = self.forward(x)
        if self.model.loss == "categorical_crossentropy":
            target = torch.from_numpy(np.asarray(y, np.float32))
            return -(target * F.log_softmax(logits, dim=1)).sum(1).mean()
        return F.cross_entropy(logits, torch.from_numpy(np.asarray(y).astype(np.int64)))

    def flat_grads(self) -> np.ndarray:
        return np.concatenate([t.grad.detach().numpy().reshape(-1) for t in self.tensors])

    def flat_params(self) -> np.ndarray:
        return np.concatenate([t.detach().numpy().reshape(-1) for t in self.tensors])


def _act(t: torch.Tensor, name: str | None) -> torch.Tensor:
    """Keras 3's activations (with their default arguments) in torch."""
    acts = {
        "relu": torch.relu,
        "tanh": torch.tanh,
        "sigmoid": torch.sigmoid,
        "leaky_relu": lambda v: F.leaky_relu(v, 0.2),
        "elu": F.elu,
        "selu": F.selu,
        "gelu": F.gelu,  # the exact erf form, Keras' approximate=False
        "swish": F.silu,
        "silu": F.silu,
        "softplus": F.softplus,
    }
    return acts[name](t) if name in acts else t  # None, "linear", "softmax" (in the loss)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12))


def torch_optimizer(name: str, params, **kw):
    """torch.optim counterpart of a sparkgrad optimizer configuration."""
    cls = {
        "sgd": torch.optim.SGD,
        "adam": torch.optim.Adam,
        "adamw": torch.optim.AdamW,
        "rmsprop": torch.optim.RMSprop,
        "adadelta": torch.optim.Adadelta,
    }[name]
    return cls(params, **kw)
