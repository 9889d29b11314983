"""A trained model as one self-describing file: architecture, weights, input transform.

Checkpoints (sparkgrad.nn.checkpoint) hold weights and training state for a
model the reader already built; a saved model also carries what is needed to
build it, so a scoring worker, a Spark ML ``Model`` or an MLflow flavor can
load it knowing nothing else. Layout (little-endian)::

    magic "SGMODEL\\x00"  u32 version  u32 header_len  header (UTF-8 JSON)
    params float32[num_params]  state float32[num_state]?  mean float32[features]?  std float32[features]?
    u32 crc32 of everything before it

The state (``model.buffers``: BatchNormalization's moving statistics) is
there in version 3, which a model with such layers is written as. Version 4
is a model with preprocessing layers (sparkgrad.nn.preprocessing): the
header's "preprocessing" lists each input's layers (type, arguments and
their vocabulary or statistics), and its header may be up to 1 GiB.

The JSON header names the layers and their arguments (the layer classes of
sparkgrad.nn.layers), the input shape, the seed (a functional model, version
2: its inputs' names, shapes and dtypes, the tensors each layer reads and the
outputs; a chain is written as version 1, which every release reads), the input transform's scale
and whether mean/std follow, and optionally the loss and metrics the model was
compiled with (a loaded model is compiled again with them and SGD, so evaluate
works; the optimizer state is not kept: that is what checkpoints are for).
Every error names the source and the byte offset or header field.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import zlib
from typing import Any

import numpy as np

from sparkgrad.errors import ModelError
from sparkgrad.nn import layers as _layers
from sparkgrad.nn import losses as _losses
from sparkgrad.nn import metrics as _metrics

MAGIC = b"SGMODEL\x00"
# 2: functional models (a "graph" in the header); 3: a non-trainable state buffer after the parameters. Each
# model is written as the lowest version that holds it (a chain without state as 1, which every release reads).
VERSION = 4
VERSIONS = (1, 2, 3, 4)
_PREFIX = struct.Struct("<8sII")
_MAX_HEADER = 1 << 20
_MAX_HEADER_PREP = 1 << 30  # version 4: vocabularies live in the header

# every layer class of sparkgrad.nn.layers, by its name (a new layer class is saved without a change here)
LAYER_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in vars(_layers).values()
    if isinstance(cls, type)
    and issubclass(cls, _layers.Layer)
    and not cls.__name__.startswith("_")
    and cls is not _layers.Layer
}


def _layer_config(layer: _layers.Layer) -> dict[str, Any]:
    name = type(layer).__name__
    if name not in LAYER_TYPES:
        raise ModelError(f"layer {layer!r}: type {name} cannot be saved (one of {sorted(LAYER_TYPES)})")
    args = {}
    for f in dataclasses.fields(layer):
        v = getattr(layer, f.name)
        args[f.name] = list(v) if isinstance(v, tuple) else v
    return {"type": name, "args": args}


def _prep_configs(model) -> list | None:
    """Each input's preprocessing layers as configurations with their state, or None without any."""
    chains = getattr(model, "_chains", None)
    if not chains or not any(chains):
        return None
    state = model.preprocessing_state()
    return [
        None
        if c is None
        else [{"type": type(x).__name__, "args": x.get_config(), "state": v} for x, v in zip(c, vals, strict=True)]
        for c, vals in zip(chains, state, strict=True)
    ]


def _prep_layers(configs: list, source: str) -> list:
    from sparkgrad.nn.preprocessing import PREPROCESSING_TYPES

    out = []
    for chain in configs:
        if chain is None:
            out.append(None)
            continue
        layers = []
        for c in chain:
            try:
                layer = PREPROCESSING_TYPES[c["type"]](**c["args"])
                layer._load_state(c.get("state") or {})
            except (KeyError, TypeError, ValueError) as e:
                raise _fail(source, f"header's preprocessing layer {c.get('type')!r} ({e})") from None
            layers.append(layer)
        out.append(layers)
    return out


def model_to_bytes(model) -> bytes:
    """The saved-model bytes of a `Sequential`: architecture, weights and input transform in one blob.

    `model_from_bytes` turns them back into a model without the code that built it.

    The loss and metrics it was compiled with are kept; the optimizer state is not (checkpoints keep it).
    The format is little-endian: magic ``SGMODEL\\0``, version, a JSON header, the float32 parameters,
    the transform's mean and std, and a CRC32 of everything before it.
    """
    scale, mean, std = model.input_transform
    from sparkgrad.nn.model import Sequential

    chain = isinstance(model, Sequential)  # written as version 1, which every release reads
    losses = model.loss_object if isinstance(model.loss_object, list) else [model.loss_object]
    header = {
        "format": "sparkgrad.saved_model",
        "name": model.name,
        "seed": int(model.seed),
        "input_shape": list(model.input_shape) if chain else None,
        "layers": [_layer_config(layer) for layer in model.layers],
        "num_params": int(model.num_params),
        "num_state": int(model.buffers.size),
        "precision": getattr(model, "precision", "fp32"),
        "input_transform": {"scale": scale, "mean": mean is not None, "std": std is not None},
        "loss": model.loss,
        "loss_config": _losses.serialize(model.loss_object) if model.loss_object is not None and chain else None,
        "metrics": [_metrics.serialize(m) for m in model.metrics],
    }
    if not chain:
        header["graph"] = {
            "inputs": [{"name": t.name, "shape": list(t.shape[1:]), "dtype": t.dtype} for t in model.inputs],
            "reads": model._reads,
            "shares": model._shares,
            "outputs": [model.layers.index(t.layer) + len(model.inputs) for t in model.outputs],
            "outputs_as_dict": bool(model._outputs_as_dict),
            "output_names": list(model.output_names),
            "losses": [_losses.serialize(lo) for lo in losses] if model.loss_object is not None else None,
            "loss_weights": list(getattr(model, "loss_weights", [1.0] * len(model.outputs))),
            "metrics": [[_metrics.serialize(m) for m in g] for g in model._metric_groups],
        }
    prep = _prep_configs(model)
    if prep is not None:
        header["preprocessing"] = prep
    text = json.dumps(header, sort_keys=True).encode()
    version = 4 if prep is not None else 3 if model.buffers.size else 1 if chain else 2
    parts = [_PREFIX.pack(MAGIC, version, len(text)), text, np.ascontiguousarray(model.params, np.float32).tobytes()]
    if model.buffers.size:
        parts.append(np.ascontiguousarray(model.buffers, np.float32).tobytes())
    for a in (mean, std):
        if a is not None:
            parts.append(np.ascontiguousarray(a, np.float32).tobytes())
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


def _fail(source: str, what: str) -> ModelError:
    return ModelError(f"{source}: not a loadable sparkgrad saved model: {what}")


def model_from_bytes(data: bytes | bytearray | memoryview, source: str = "<bytes>"):
    """Builds the model that `model_to_bytes` wrote.

    A model saved after compile comes back compiled with the same loss and metrics and a plain SGD
    optimizer, so `Sequential.evaluate` and `Sequential.predict` work at once.

    Args:
        data: The saved-model bytes.
        source: What names the bytes in error messages (a path, a URI).

    Raises:
        ModelError: The bytes are not a saved model (bad magic, version, length, header or CRC); the
            message names ``source`` and the byte offset or header field.
    """
    from sparkgrad.nn.graph import KerasTensor
    from sparkgrad.nn.model import Model, Sequential

    data = memoryview(data).cast("B")
    if len(data) < _PREFIX.size + 4:
        raise _fail(source, f"{len(data)} bytes, shorter than the {_PREFIX.size + 4}-byte frame")
    magic, version, hlen = _PREFIX.unpack_from(data, 0)
    if magic != MAGIC:
        raise _fail(source, f"bad magic {bytes(magic)!r} at offset 0 (expected {MAGIC!r})")
    if version not in VERSIONS:
        raise _fail(
            source,
            f"format version {version} at offset 8; this sparkgrad reads versions {', '.join(map(str, VERSIONS))}",
        )
    if hlen > (_MAX_HEADER_PREP if version >= 4 else _MAX_HEADER) or _PREFIX.size + hlen + 4 > len(data):
        raise _fail(source, f"header length {hlen} at offset 12 runs past the end ({len(data)} bytes)")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if zlib.crc32(data[:-4]) != crc:
        raise _fail(
            source, f"crc32 mismatch over bytes 0..{len(data) - 4} (stored {crc:#010x} at offset {len(data) - 4})"
        )
    try:
        header = json.loads(bytes(data[_PREFIX.size : _PREFIX.size + hlen]))
        specs = [(LAYER_TYPES[c["type"]], c["args"]) for c in header["layers"]]
        graph = header.get("graph")
        shape = tuple(int(v) for v in (header["input_shape"] if graph is None else graph["inputs"][0]["shape"]))
        transform = header["input_transform"]
    except KeyError as e:
        raise _fail(source, f"header field {e} is missing or names an unknown layer type") from None
    except (ValueError, TypeError) as e:
        raise _fail(source, f"header at offset {_PREFIX.size} is not the expected JSON ({e})") from None
    built = []
    for i, (cls, args) in enumerate(specs):
        args = dict(args)
        args["input_shape"] = shape if i == 0 and graph is None else None
        try:
            built.append(cls(**args))
        except (TypeError, ValueError) as e:
            raise _fail(source, f"layer {i} ({cls.__name__}) arguments {args}: {e}") from None
    seed, name = int(header.get("seed", 0)), str(header.get("name", "sequential"))
    if graph is None:
        model = Sequential(built, seed=seed, name=name)
    else:
        try:
            raw = [KerasTensor((None, *i["shape"]), i["dtype"], i["name"]) for i in graph["inputs"]]
            tensors = list(raw)
            for i, chain in enumerate(_prep_layers(header.get("preprocessing") or [None] * len(raw), source)):
                for layer in chain or []:
                    tensors[i] = layer(tensors[i])
            shares = graph.get("shares") or [-1] * len(built)
            for k, (reads, owner) in enumerate(zip(graph["reads"], shares, strict=True)):
                layer = built[k] if owner < 0 else built[owner]  # a shared layer: the same object again
                ins = [tensors[r] for r in reads]
                tensors.append(layer(ins if getattr(layer, "merge", False) else ins[0]))
            outs = [tensors[o] for o in graph["outputs"]]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise _fail(source, f"header's graph does not describe a model ({e!r})") from None
        keys = graph.get("output_names")
        outputs = dict(zip(keys, outs, strict=True)) if graph.get("outputs_as_dict") else outs
        model = Model(raw, outputs, seed=seed, name=name)
    if model.num_params != int(header.get("num_params", -1)):
        raise _fail(source, f"header says {header.get('num_params')} parameters, the layers make {model.num_params}")
    nstate = int(model.buffers.size)
    if nstate != int(header.get("num_state", 0)):
        raise _fail(source, f"header says {header.get('num_state', 0)} state values, the layers make {nstate}")
    off = _PREFIX.size + hlen
    features = int(np.prod(shape))
    want = off + 4 * (model.num_params + nstate) + 4 * features * (bool(transform["mean"]) + bool(transform["std"])) + 4
    if want != len(data):
        raise _fail(source, f"{len(data)} bytes, the header describes {want}")
    model.params[:] = np.frombuffer(data, np.float32, model.num_params, off)
    off += 4 * model.num_params
    model.buffers[:] = np.frombuffer(data, np.float32, nstate, off)
    off += 4 * nstate
    arrays = {}
    for key in ("mean", "std"):
        if transform[key]:
            arrays[key] = np.frombuffer(data, np.float32, features, off).copy()
            off += 4 * features
    if transform["scale"] is not None or arrays:
        model.set_input_transform(transform["scale"], arrays.get("mean"), arrays.get("std"))
    if header.get("loss"):
        kw = {"precision": header["precision"]} if header.get("precision", "fp32") != "fp32" else {}
        loss = header.get("loss_config") or header["loss"]  # files saved before the loss table hold the name alone
        metrics = list(header.get("metrics") or [])
        if graph is not None and graph.get("losses"):
            loss, metrics = graph["losses"], graph["metrics"]
            kw["loss_weights"] = graph["loss_weights"]
            if len(loss) == 1:
                loss, metrics = loss[0], metrics[0]
        try:
            model.compile(optimizer="sgd", loss=loss, metrics=metrics, **kw)
        except ValueError as e:
            raise _fail(source, f"header's loss {loss!r} or metrics {metrics!r}: {e}") from None
    return model


def save_model(model, path: str | os.PathLike) -> None:
    """Writes ``model_to_bytes(model)`` to ``path`` atomically (a temporary file, then a rename)."""
    from sparkgrad.nn.checkpoint import write_atomic

    write_atomic(os.fspath(path), model_to_bytes(model))


def load_model(path: str | os.PathLike):
    """Reads a model that `save_model` wrote (see `model_from_bytes`).

    Raises:
        ModelError: The file cannot be read or is not a saved model; the message names the file.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ModelError(f"{path}: cannot read the saved model: {e.strerror or e}") from None
    return model_from_bytes(data, path)
