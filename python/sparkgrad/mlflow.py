"""An MLflow model flavor for sparkgrad.nn models, and its python_function (pyfunc) face.

```python
import sparkgrad.mlflow

info = sparkgrad.mlflow.log_model(model, name="model")          # in an MLflow run
model = sparkgrad.mlflow.load_model(info.model_uri)             # a sparkgrad.nn model again
mlflow.pyfunc.load_model(info.model_uri).predict(x)             # x: ndarray or pandas DataFrame
mlflow.pyfunc.spark_udf(spark, info.model_uri, "array<float>")  # scoring in Spark tasks
```

The artifact is a directory in MLflow's model layout: ``MLmodel`` (flavors
``sparkgrad`` and ``python_function``, the signature), the environment files
(requirements.txt, conda.yaml, python_env.yaml) and ``data/model.sgmodel``,
the saved-model file of sparkgrad.nn.saved (architecture, weights, input
transform and loss in one file), beside ``data/pyfunc.json`` (what the pyfunc
returns). Without a signature, one is inferred from the model: input a
float32 tensor of shape [-1, *input_shape], output float32 [-1, outputs].
MLflow enforces it: inputs must be float32 (an array column of a DataFrame
is stacked into one tensor, and flat rows are reshaped to the input shape).

The pyfunc predicts with sparkgrad's C engine: it returns the model's outputs
(``pyfunc_output="probability"``: float32 [n, outputs] as model.predict gives
them: softmax or sigmoid probabilities, a regression's values, or logits), or
what Spark ML's prediction column holds (``pyfunc_output="prediction"``,
float64: a classifier's argmax, a binary classifier's 0/1 at probability 0.5,
a regression's values; [n] for these, [n, outputs] for a multi-output binary
or regression model; a one-column result is the default ``double`` result of
spark_udf). Which of these a model is follows its compiled loss, else its
head (sparkgrad.spark.columns.output_kind, as sparkgrad.spark.Model decides).

Works with MLflow 2.22 and 3.x clients: 3.x names a logged model ``name``,
2.x ``artifact_path``; log_model takes either. This module imports ``mlflow``
(the real package, absolute imports) only when called. What it does not do:
track training (sparkgrad.nn.tracking does) or register models beyond
passing ``registered_model_name`` to MLflow.
"""

from __future__ import annotations

import inspect
import json
import os
from typing import Any

import numpy as np

from sparkgrad.errors import InvalidArgumentError, ModelError

__all__ = ["log_model", "load_model", "save_model", "infer_signature", "get_default_pip_requirements", "FLAVOR_NAME"]

FLAVOR_NAME = "sparkgrad"
"""The flavor's name in ``MLmodel`` (``flavors.sparkgrad``), as ``mlflow.sklearn.FLAVOR_NAME`` is sklearn's."""
MODEL_FILE = "model.sgmodel"
PYFUNC_FILE = "pyfunc.json"
DATA_DIR = "data"
PYFUNC_OUTPUTS = ("probability", "prediction")


def infer_signature(model: Any, pyfunc_output: str = "probability", columns: dict[str, str] | None = None) -> Any:
    """The signature `save_model` gives a model when none is passed: its inputs in, float32 or double out.

    MLflow enforces it: inputs must be float32 (an array column of a DataFrame is stacked into one
    tensor, and flat rows are reshaped to the input shape). MLflow 3's ``spark_udf`` takes its default
    result type from the output: ``array<float>`` or ``double``.

    Args:
        model (sparkgrad.nn.Model): The model.
        pyfunc_output: ``"probability"``: output a float32 tensor ``[-1, outputs]`` (the model's output
            width); ``"prediction"``: one double column for a classifier, a binary classifier or a
            regression of one output, a float64 tensor ``[-1, outputs]`` for a binary or regression
            model of several.
        columns: ``{column: input name}`` (a model of several inputs, or a mapped one): the input is one
            column each, named, of the Input's type: ``string``, ``integer`` (int32), ``long`` (int64),
            ``double`` (one number) or an array of doubles (several; MLflow >= 2.10).

    Returns:
        (mlflow.models.ModelSignature): Input a float32 tensor of shape ``[-1, *input_shape]`` (an int32 or
        int64 tensor for an integer `Input`, a string column named as the Input for a string one, which the
        model's preprocessing layers map), or the columns above; output as above.
    """
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import ColSpec, DataType, Schema, TensorSpec

    from sparkgrad.spark.columns import Task

    if columns:
        inputs = Schema([ColSpec(_column_type(model, name), column) for column, name in columns.items()])
    elif model.inputs[0].dtype == "string":  # a string column, mapped in C by the model's StringLookup or Hashing
        inputs = Schema([ColSpec(DataType.string, model.input_names[0])])
    else:
        dtype = model.inputs[0].dtype
        tensor = np.dtype(dtype) if dtype in ("int32", "int64") else np.dtype(np.float32)
        inputs = Schema([TensorSpec(tensor, (-1, *(int(d) for d in model.input_shape)))])
    width = int(model.output_classes)
    if pyfunc_output != "prediction":
        outputs = Schema([TensorSpec(np.dtype(np.float32), (-1, width))])
    elif width == 1 or _output_kind(model)[0] is Task.CLASSES:
        outputs = Schema([ColSpec(DataType.double)])
    else:
        outputs = Schema([TensorSpec(np.dtype(np.float64), (-1, width))])
    return ModelSignature(inputs=inputs, outputs=outputs)


def _column_type(model: Any, name: str) -> Any:
    """The MLflow type of a column feeding ``model``'s input ``name``."""
    from mlflow.types.schema import DataType

    t = model.inputs[model.input_names.index(name)]
    if t.dtype == "string":
        return DataType.string
    scalar = {"int32": DataType.integer, "int64": DataType.long}.get(t.dtype, DataType.double)
    if int(np.prod(t.shape[1:])) == 1:
        return scalar
    from mlflow.types.schema import Array  # MLflow >= 2.10

    return Array(scalar)


def _output_kind(model: Any) -> tuple[Any, bool]:
    """``(task, probabilities)`` of the model under its compiled loss, else by its head."""
    from sparkgrad.spark import columns as C

    return C.output_kind(model, C.resolve_loss(None, model, "sparkgrad.mlflow"))


def _predictions(out: np.ndarray, kind: tuple[Any, bool]) -> np.ndarray:
    """What ``pyfunc_output="prediction"`` returns for the outputs ``out`` of a model of `_output_kind` ``kind``."""
    from sparkgrad.spark import columns as C

    task, probabilities = kind
    if task is C.Task.CLASSES:
        return np.argmax(out, axis=1).astype(np.float64)
    if task is C.Task.BINARY:
        values = (C.binary_scores(out, probabilities)[0] > 0.5).astype(np.float64)
    else:
        values = out.astype(np.float64)
    return values[:, 0] if values.shape[1] == 1 else values


def get_default_pip_requirements() -> list[str]:
    """The pip requirements written with a model when none are given.

    sparkgrad and NumPy pinned at the versions of this interpreter, e.g.
    ``["sparkgrad==0.1.0", "numpy==2.1.3"]``.
    """
    from sparkgrad._version import __version__

    return [f"sparkgrad=={__version__}", f"numpy=={np.__version__}"]


def _write_environment(path: str, conda_env: Any, pip_requirements: Any, extra_pip_requirements: Any) -> None:
    """requirements.txt, conda.yaml and python_env.yaml as MLflow's own flavors write them."""
    import yaml
    from mlflow.utils import environment as env

    if conda_env is None:
        default = get_default_pip_requirements()
        conda_env, reqs, constraints = env._process_pip_requirements(default, pip_requirements, extra_pip_requirements)
    else:
        conda_env, reqs, constraints = env._process_conda_env(conda_env)
    with open(os.path.join(path, env._CONDA_ENV_FILE_NAME), "w") as f:
        yaml.safe_dump(conda_env, stream=f, default_flow_style=False)
    if constraints:
        with open(os.path.join(path, env._CONSTRAINTS_FILE_NAME), "w") as f:
            f.write("\n".join(constraints) + "\n")
    with open(os.path.join(path, env._REQUIREMENTS_FILE_NAME), "w") as f:
        f.write("\n".join(reqs) + "\n")
    env._PythonEnv.current().to_yaml(os.path.join(path, env._PYTHON_ENV_FILE_NAME))


def _check_model(model: Any, input_mapping: dict[str, str] | None) -> tuple[Any, dict[str, str] | None]:
    """``(sparkgrad.nn model, {column: input name} or None)`` of what save_model and log_model take.

    A `sparkgrad.spark.Model` gives its trained model and the columns its params map to its inputs; a
    model of several inputs without ``input_mapping`` takes columns named as its inputs.
    """
    import sys

    from sparkgrad.nn.model import Model

    stages = sys.modules.get("sparkgrad.spark.model")  # not imported: the model cannot be a Spark ML stage
    if stages is not None and isinstance(model, stages.Model):
        if input_mapping is not None:
            raise InvalidArgumentError(
                "sparkgrad.mlflow: a sparkgrad.spark.Model brings its own column mapping (its inputCols or "
                "input_mapping); do not pass input_mapping too"
            )
        model, input_mapping = model.nn_model, model.column_mapping()
    if not isinstance(model, Model):
        raise InvalidArgumentError(
            f"sparkgrad.mlflow saves sparkgrad.nn models (Sequential, Model) and sparkgrad.spark.Model stages, not "
            f"{type(model).__name__}"
        )
    if len(model.outputs) > 1:
        raise InvalidArgumentError(
            f"sparkgrad.mlflow saves models of one output; this one has outputs {model.output_names}"
        )
    if input_mapping is None:
        return model, ({n: n for n in model.input_names} if len(model.inputs) > 1 else None)
    if not isinstance(input_mapping, dict):
        raise InvalidArgumentError("sparkgrad.mlflow: input_mapping must be a dict {column: input name}")
    bad = {c: n for c, n in input_mapping.items() if n not in model.input_names}
    missing = [n for n in model.input_names if n not in input_mapping.values()]
    if bad or missing:
        raise InvalidArgumentError(
            f"sparkgrad.mlflow: input_mapping {input_mapping} must map columns to the model's inputs "
            f"{model.input_names}"
            + (f"; {bad} are not inputs" if bad else "")
            + (f"; input {missing[0]!r} has no column" if missing else "")
        )
    return model, {str(c): str(n) for c, n in input_mapping.items()}


def save_model(
    model: Any,
    path: str | os.PathLike,
    mlflow_model: Any = None,
    signature: Any = None,
    input_example: Any = None,
    pyfunc_output: str = "probability",
    conda_env: Any = None,
    pip_requirements: Any = None,
    extra_pip_requirements: Any = None,
    metadata: dict | None = None,
    input_mapping: dict[str, str] | None = None,
    **kwargs: Any,
) -> None:
    """Writes ``model`` as an MLflow model directory at ``path``.

    The directory has MLflow's model layout: ``MLmodel`` (flavors ``sparkgrad`` and ``python_function``,
    the signature), the environment files (``requirements.txt``, ``conda.yaml``, ``python_env.yaml``),
    and ``data/model.sgmodel`` (the saved model: architecture, weights, input transform and loss in one
    file, as `sparkgrad.nn.save_model` writes it) beside ``data/pyfunc.json``.

    Args:
        model (sparkgrad.nn.Model | sparkgrad.spark.Model): The model, or a Spark ML Model stage (its
            trained model and its column mapping).
        path: The directory, which must not exist or be empty.
        mlflow_model (mlflow.models.Model | None): The MLmodel to add the flavors to (default a new one).
        signature (mlflow.models.ModelSignature | None): Default `infer_signature` of the model.
        input_example: Saved with the model, as MLflow saves examples.
        pyfunc_output: What the pyfunc's predict returns: ``"probability"`` (float32 ``[n, outputs]`` as
            ``model.predict`` gives them: softmax or sigmoid probabilities, a regression's values, or
            logits) or ``"prediction"`` (float64, what Spark ML's prediction column holds: a
            classifier's argmax, a binary classifier's 0.0/1.0 at probability 0.5, a regression's
            values; ``[n]``, or ``[n, outputs]`` for a binary or regression model of several outputs).
        conda_env: As in MLflow's own flavors.
        pip_requirements: As in MLflow's own flavors (default `get_default_pip_requirements`).
        extra_pip_requirements: As in MLflow's own flavors.
        metadata: Custom metadata written to ``MLmodel``.
        input_mapping: ``{column: input name}``: the DataFrame columns the pyfunc feeds to the model's
            inputs (several columns to one input are concatenated in order). Default: for a model of
            several inputs, columns named as its inputs; a `sparkgrad.spark.Model` brings its own
            (`sparkgrad.spark.Model.column_mapping`).
        **kwargs: Accepted for MLflow's calling convention, unused.

    Raises:
        InvalidArgumentError: ``model`` is not a sparkgrad.nn model or Spark ML Model, or has several
            outputs; an ``input_mapping`` that leaves an input without a column or names no input; an
            unknown ``pyfunc_output``; or ``path`` is a directory that is not empty.
    """
    from mlflow.models import Model
    from mlflow.models.utils import _save_example

    from sparkgrad._version import __version__
    from sparkgrad.nn.saved import save_model as save_sgmodel

    model, columns = _check_model(model, input_mapping)
    if pyfunc_output not in PYFUNC_OUTPUTS:
        raise InvalidArgumentError(f"pyfunc_output must be one of {PYFUNC_OUTPUTS}, not {pyfunc_output!r}")
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path) and os.listdir(path):
        raise InvalidArgumentError(f"{path}: an MLflow model cannot be saved into a directory that is not empty")
    os.makedirs(os.path.join(path, DATA_DIR), exist_ok=True)
    if mlflow_model is None:
        mlflow_model = Model()
    if input_example is not None:
        _save_example(mlflow_model, input_example, path)
    mlflow_model.signature = infer_signature(model, pyfunc_output, columns) if signature is None else signature
    if metadata is not None:
        mlflow_model.metadata = metadata

    data = os.path.join(DATA_DIR, MODEL_FILE)
    save_sgmodel(model, os.path.join(path, data))
    with open(os.path.join(path, DATA_DIR, PYFUNC_FILE), "w") as f:
        json.dump({"output": pyfunc_output, **({"columns": columns} if columns else {})}, f)

    from mlflow.pyfunc import add_to_model

    add_to_model(
        mlflow_model,
        loader_module="sparkgrad.mlflow",
        data=DATA_DIR,
        conda_env="conda.yaml",
        python_env="python_env.yaml",
    )
    mlflow_model.add_flavor(
        FLAVOR_NAME,
        sparkgrad_version=__version__,
        model_file=data,
        input_shape=[int(d) for d in model.input_shape] if len(model.inputs) == 1 else None,
        inputs={t.name: [int(d) for d in t.shape[1:]] for t in model.inputs},
        columns=columns,
        classes=int(model.output_classes),
        pyfunc_output=pyfunc_output,
    )
    mlflow_model.save(os.path.join(path, "MLmodel"))
    _write_environment(path, conda_env, pip_requirements, extra_pip_requirements)


def log_model(
    model: Any,
    artifact_path: str | None = None,
    *,
    name: str | None = None,
    signature: Any = None,
    input_example: Any = None,
    registered_model_name: str | None = None,
    pyfunc_output: str = "probability",
    conda_env: Any = None,
    pip_requirements: Any = None,
    extra_pip_requirements: Any = None,
    metadata: dict | None = None,
    input_mapping: dict[str, str] | None = None,
    **kwargs: Any,
) -> Any:
    """Logs ``model`` to the active MLflow run (one is started if none is), with MLflow 2.22 and 3.x clients.

    ```python
    with mlflow.start_run():
        info = sparkgrad.mlflow.log_model(model, name="model", registered_model_name="mnist-mlp")
    ```

    Args:
        model (sparkgrad.nn.Model | sparkgrad.spark.Model): As for `save_model`.
        artifact_path: The model's name, MLflow 2's spelling; either spelling works with either client.
        name: The model's name, MLflow 3's spelling (default ``"model"``).
        signature (mlflow.models.ModelSignature | None): As for `save_model`.
        input_example: As for `save_model`.
        registered_model_name: Also register the model under this name in the model registry.
        pyfunc_output: As for `save_model`.
        conda_env: As for `save_model`.
        pip_requirements: As for `save_model`.
        extra_pip_requirements: As for `save_model`.
        metadata: As for `save_model`.
        input_mapping: As for `save_model`.
        **kwargs: Passed to ``mlflow.models.Model.log``.

    Returns:
        (mlflow.models.model.ModelInfo): MLflow's record of the logged model; ``info.model_uri`` loads it.

    Raises:
        InvalidArgumentError: ``name`` and ``artifact_path`` are both given and differ, or as for `save_model`.
    """
    import sys

    from mlflow.models import Model

    _check_model(model, input_mapping)
    if name is not None and artifact_path is not None and name != artifact_path:
        raise InvalidArgumentError(f"log_model: name={name!r} and artifact_path={artifact_path!r} differ: pass one")
    label = name or artifact_path or "model"
    where = {"name": label, "artifact_path": None} if "name" in inspect.signature(Model.log).parameters else {}
    return Model.log(
        **(where or {"artifact_path": label}),
        flavor=sys.modules[__name__],
        registered_model_name=registered_model_name,
        model=model,
        signature=signature,
        input_example=input_example,
        pyfunc_output=pyfunc_output,
        conda_env=conda_env,
        pip_requirements=pip_requirements,
        extra_pip_requirements=extra_pip_requirements,
        metadata=metadata,
        input_mapping=input_mapping,
        **kwargs,
    )


def _local_dir(model_uri: str, dst_path: str | None) -> str:
    if os.path.isdir(model_uri):
        return model_uri
    from mlflow.artifacts import download_artifacts

    return download_artifacts(artifact_uri=model_uri, dst_path=dst_path)


def load_model(model_uri: str, dst_path: str | None = None) -> Any:
    """The sparkgrad.nn model logged or saved at ``model_uri``, rebuilt without its code (compiled with its loss).

    Args:
        model_uri: ``runs:/<run id>/model``, ``models:/<name>/<version>``, any artifact URI, or a local
            directory.
        dst_path: Where to download the artifacts (default a temporary directory).

    Returns:
        (sparkgrad.nn.Sequential): The model.

    Raises:
        ModelError: No MLmodel file there, or the model has no ``sparkgrad`` flavor.
    """
    from mlflow.models import Model

    local = _local_dir(str(model_uri), dst_path)
    mlmodel = os.path.join(local, "MLmodel")
    if not os.path.exists(mlmodel):
        raise ModelError(f"{model_uri}: no MLmodel file in {local}: not an MLflow model")
    conf = Model.load(mlmodel).flavors.get(FLAVOR_NAME)
    if conf is None:
        raise ModelError(f"{model_uri}: the model has no {FLAVOR_NAME!r} flavor (saved by another library)")
    from sparkgrad.nn.saved import load_model as load_sgmodel

    return load_sgmodel(os.path.join(local, conf["model_file"]))


class _PyfuncModel:
    """The python_function face: predict(ndarray | pandas DataFrame | dict of arrays) with the C engine."""

    def __init__(self, model: Any, output: str, columns: dict[str, str] | None = None) -> None:
        self.model = model
        self.output = output
        self.columns = columns  # {column: input name}: a DataFrame's columns feed the model's named inputs
        self.kind = _output_kind(model)  # (task, probabilities): what "prediction" makes of the outputs

    def _inputs(self, data: Any) -> Any:
        if self.columns is not None and hasattr(data, "columns") and hasattr(data, "iloc"):
            return self._mapped(data)
        if isinstance(data, dict):
            if self.columns is not None or len(self.model.inputs) > 1:
                return data  # by input name, as model.predict takes them
            if len(data) != 1:
                raise InvalidArgumentError(f"sparkgrad pyfunc: one input tensor, not {len(data)} ({', '.join(data)})")
            data = next(iter(data.values()))
        if hasattr(data, "columns") and hasattr(data, "iloc"):  # a pandas DataFrame (no signature enforced it)
            if self.model.inputs[0].dtype == "string":  # the strings as they are: the model maps them in C
                return data.iloc[:, 0].to_numpy(object)
            if len(data.columns) == 1 and len(data) and not np.isscalar(data.iloc[0, 0]):
                return np.stack([np.asarray(v, np.float32).reshape(-1) for v in data.iloc[:, 0]])
            return data.to_numpy(np.float32)
        return np.asarray(data)

    def _mapped(self, frame: Any) -> dict[str, Any]:
        """A pandas DataFrame's columns as the model's inputs, by ``columns``: strings as they are, ids as
        integers, other numbers and arrays flattened and concatenated per input."""
        missing = [c for c in self.columns if c not in frame.columns]
        if missing:
            raise InvalidArgumentError(
                f"sparkgrad pyfunc: column {missing[0]!r} (of input {self.columns[missing[0]]!r}) is not in the "
                f"DataFrame (its columns: {', '.join(map(repr, frame.columns))})",
                column=missing[0],
            )
        parts: dict[str, list] = {}
        for column, name in self.columns.items():
            series = frame[column]
            nulls = series.isna().to_numpy()
            if nulls.any():
                raise InvalidArgumentError(
                    f"sparkgrad pyfunc: column {column!r} holds {int(nulls.sum())} nulls (the first in row "
                    f"{int(np.argmax(nulls))}); input {name!r} takes none",
                    column=column,
                )
            values = series.to_numpy()
            if values.dtype == object and len(values) and not isinstance(values[0], (str, bytes)):
                values = np.stack([np.asarray(v).reshape(-1) for v in values])  # arrays (or vectors) per row
            parts.setdefault(name, []).append(values.reshape(len(values), -1) if values.dtype != object else values)
        out = {}
        for t in self.model.inputs:
            p = parts[t.name]
            if t.dtype == "string":
                out[t.name] = p[0]
            else:
                out[t.name] = p[0] if len(p) == 1 else np.concatenate([a.astype(np.float32) for a in p], axis=1)
        return out

    def predict(self, model_input: Any, params: dict | None = None) -> np.ndarray:
        from sparkgrad._threads import configure_task_threads

        configure_task_threads()  # in spark_udf's tasks: their share of the executor's cores
        x = self._inputs(model_input)
        out = self.model.predict(x, batch_size=int((params or {}).get("batch_size", 256)))
        if self.output == "prediction":
            return _predictions(out, self.kind)
        return out

    def get_raw_model(self) -> Any:
        return self.model


def _load_pyfunc(path: str) -> _PyfuncModel:
    """mlflow.pyfunc's loader: ``path`` is the model's data directory."""
    from sparkgrad.nn.saved import load_model as load_sgmodel

    with open(os.path.join(path, PYFUNC_FILE)) as f:
        conf = json.load(f)
    model = load_sgmodel(os.path.join(path, MODEL_FILE))
    return _PyfuncModel(model, conf.get("output", "probability"), conf.get("columns"))
