# Databricks notebook source
# MAGIC %md
# MAGIC # 02 · Scheduled training job
# MAGIC
# MAGIC Distributed Fashion-MNIST training (the TensorFlowOnSpark walkthrough's MLP, parameter servers) as a
# MAGIC Databricks job task: every setting is a widget, so a job's `base_parameters` (or `run-now`'s
# MAGIC `notebook_params`) set them, as strings. Data is read from `data_path` (TFRecords, as `10_prep` or
# MAGIC `sparkgrad convert mnist` write them) and copied to local disk; the model, its checkpoint and the
# MAGIC metrics are written locally and then copied to `output_path` (`/dbfs` is a FUSE view: whole-file copies
# MAGIC work well there, many small writes do not). A re-run with the same `output_path` resumes from its
# MAGIC checkpoint. The run's result (`dbutils.notebook.exit`) is a JSON summary, with the settings it ran with
# MAGIC (learning rate, cluster shape, input mode). With MLflow (always there on Databricks) the run is also
# MAGIC logged to this notebook's experiment, and the summary names it (`mlflow_run_id`).
# MAGIC
# MAGIC Needs a cluster in Dedicated (single user) access mode with a task slot per node (plus one in `spark` mode).
# MAGIC
# MAGIC | widget | default | meaning |
# MAGIC |---|---|---|
# MAGIC | `data_path` | `dbfs:/FileStore/sparkgrad/pipeline/records` | `train*`, `test*.tfrecords` (`10_prep`) |
# MAGIC | `output_path` | `dbfs:/FileStore/sparkgrad/jobs/fashion-mnist` | `model/`, `checkpoints/`, `metrics.json` |
# MAGIC | `epochs` | `2` | passes over the training set |
# MAGIC | `learning_rate` | `0.07` | SGD step on the parameter servers |
# MAGIC | `num_executors` | `3` | nodes: parameter servers + workers |
# MAGIC | `num_ps` | `1` | parameter servers |
# MAGIC | `mode` | `tensorflow` | `tensorflow`: workers read the files; `spark`: Spark feeds them a DataFrame |

# COMMAND ----------

dbutils.widgets.text("data_path", "dbfs:/FileStore/sparkgrad/pipeline/records", "TFRecords")
dbutils.widgets.text("output_path", "dbfs:/FileStore/sparkgrad/jobs/fashion-mnist", "output folder")
dbutils.widgets.text("epochs", "2", "epochs")
dbutils.widgets.text("learning_rate", "0.07", "learning rate")
dbutils.widgets.text("num_executors", "3", "nodes")
dbutils.widgets.text("num_ps", "1", "parameter servers")
dbutils.widgets.dropdown("mode", "tensorflow", ["tensorflow", "spark"], "input mode")

# Widgets are strings: convert once, here.
data_path = dbutils.widgets.get("data_path").rstrip("/")
output_path = dbutils.widgets.get("output_path").rstrip("/")
epochs = int(dbutils.widgets.get("epochs"))
learning_rate = float(dbutils.widgets.get("learning_rate"))
num_executors = int(dbutils.widgets.get("num_executors"))
num_ps = int(dbutils.widgets.get("num_ps"))
mode = dbutils.widgets.get("mode")

# COMMAND ----------

import dataclasses
import json
import os
import shutil
import tempfile
import time

from sparkgrad import TFCluster
from sparkgrad.databricks import fuse_path, require_input
from sparkgrad.examples import mnist_dist

# The driver's copy of the data, on local disk: for the per-pixel statistics the workers standardise with.
scratch = "/local_disk0/tmp" if os.path.isdir("/local_disk0/tmp") else None
require_input(dbutils, data_path, "notebooks/10_prep (its output_data) or `sparkgrad convert mnist`")
local = tempfile.mkdtemp(prefix="sparkgrad-job-", dir=scratch)
dbutils.fs.cp(data_path, f"file:{local}/data", recurse=True)
copied = sorted(os.listdir(f"{local}/data"))
copied_bytes = sum(os.path.getsize(f"{local}/data/{name}") for name in copied)
print(f"copied {data_path} to {local}/data: {len(copied)} files, {copied_bytes} bytes")
pixel_mean, pixel_std = mnist_dist.pixel_stats(f"{local}/data")  # also writes data/pixel_stats.npz

# COMMAND ----------


@dataclasses.dataclass(frozen=True, eq=False)
class Job:
    args: mnist_dist.Args  # data_dir and model_dir are set on each node
    data: str  # data_path as every node sees it
    checkpoints: str  # output_path/checkpoints as every node sees it


def copy_files(src, dst):
    """Copies the files of src to dst whole, each under a temporary name and then renamed."""
    os.makedirs(dst, exist_ok=True)
    for name in sorted(os.listdir(src)):
        tmp = os.path.join(dst, f".{name}.tmp")
        shutil.copyfile(os.path.join(src, name), tmp)
        os.replace(tmp, os.path.join(dst, name))


def node_main(job, ctx):
    """One node: a ps serves; a worker trains from a local copy of the data, in a local model folder."""
    if ctx.job_name == "ps":
        return mnist_dist.map_fun(job.args, ctx)
    work = tempfile.mkdtemp(prefix="sparkgrad-node-")
    data, model = os.path.join(work, "data"), os.path.join(work, "model")
    shutil.copytree(job.data, data)
    if os.path.isdir(job.checkpoints):  # the chief resumes from the last run's checkpoint
        shutil.copytree(job.checkpoints, model)
    result = mnist_dist.map_fun(dataclasses.replace(job.args, data_dir=data, model_dir=model), ctx)
    if "step" in result:  # the chief: its final checkpoint back to output_path
        copy_files(model, job.checkpoints)
    shutil.rmtree(work)
    return result


# COMMAND ----------

args = mnist_dist.Args(
    mode=mode,
    data_dir="",
    model_dir="",
    epochs=epochs,
    batch_size=100,
    learning_rate=learning_rate,
    sync=False,
    checkpoint_every=500,
    shard_data=False,
    pixel_mean=pixel_mean,
    pixel_std=pixel_std,
)
job = Job(args, fuse_path(dbutils, data_path), fuse_path(dbutils, f"{output_path}/checkpoints"))
input_mode = TFCluster.InputMode.SPARK if mode == "spark" else TFCluster.InputMode.TENSORFLOW
started = time.monotonic()
cluster = TFCluster.run(
    sc, node_main, job, num_executors=num_executors, num_ps=num_ps, input_mode=input_mode, reservation_timeout=120
)
if mode == "spark":
    from sparkgrad.data import FixedLenFeature, load_tfrecords

    schema = {"image_raw": FixedLenFeature([], "bytes"), "label": FixedLenFeature([], "int64")}
    cluster.train(load_tfrecords(spark, os.path.join(job.data, "train*.tfrecords"), schema), num_epochs=epochs)
cluster.shutdown(timeout=6 * 3600)
seconds = time.monotonic() - started
chief = next(r for r in cluster.results.values() if isinstance(r, dict) and r.get("rank") == 0)
print(f"global step {chief['step']}, test accuracy {chief['test_accuracy']:.4f}, {seconds:.1f} s")

# COMMAND ----------

# Model and metrics: written on local disk, then copied to output_path.
out = f"{local}/out"
os.makedirs(f"{out}/model")
shutil.copyfile(f"{local}/data/pixel_stats.npz", f"{out}/model/pixel_stats.npz")
metrics = {
    "global_step": chief["step"],
    "test_accuracy": chief["test_accuracy"],
    "test_loss": chief["test_loss"],
    "samples": sum(r.get("samples", 0) for r in cluster.results.values() if isinstance(r, dict)),
    "seconds": seconds,
    "history": [dataclasses.asdict(m) for m in cluster.metrics],
}
with open(f"{out}/metrics.json", "w") as f:
    json.dump(metrics, f, indent=1, sort_keys=True)
dbutils.fs.cp(f"file:{out}", output_path, recurse=True)
dbutils.fs.cp(f"{output_path}/checkpoints/{mnist_dist.CHECKPOINT}", f"{output_path}/model/{mnist_dist.CHECKPOINT}")

# COMMAND ----------

# MLflow (always on Databricks: the job run's notebook experiment; elsewhere when MLFLOW_TRACKING_URI is set):
# the widgets, every node's metric curves, the test metrics, metrics.json and the model folder.
from sparkgrad.nn import tracking

mlflow_run_id = None
if tracking.mlflow_configured():
    import mlflow

    shutil.copyfile(os.path.join(job.checkpoints, mnist_dist.CHECKPOINT), f"{out}/model/{mnist_dist.CHECKPOINT}")
    with mlflow.start_run(run_name="02_scheduled_training_job") as mlflow_run:
        widgets = {"data_path": data_path, "output_path": output_path, "epochs": epochs, "mode": mode}
        widgets.update({"learning_rate": learning_rate, "num_executors": num_executors, "num_ps": num_ps})
        mlflow.log_params({**widgets, "batch_size": args.batch_size, "checkpoint_every": args.checkpoint_every})
        tracking.log_cluster_metrics(cluster.metrics)
        final = {k: metrics[k] for k in ("test_accuracy", "test_loss", "samples", "seconds")}
        mlflow.log_metrics(final, step=metrics["global_step"])
        mlflow.log_artifacts(out)
    mlflow_run_id = mlflow_run.info.run_id
shutil.rmtree(local)

# COMMAND ----------

summary = {
    "output_path": output_path,
    "model": f"{output_path}/model/{mnist_dist.CHECKPOINT}",
    "checkpoints": f"{output_path}/checkpoints",
    "metrics": f"{output_path}/metrics.json",
    # the settings used: the learning rate the nodes were given, the cluster that formed and its input mode
    "learning_rate": args.learning_rate,
    "num_executors": sum(len(nodes) for nodes in cluster.cluster_spec.values()),
    "num_ps": len(cluster.cluster_spec.get("ps", ())),
    "mode": cluster.input_mode.name.lower(),
    "epochs": epochs,
    "global_step": metrics["global_step"],
    "test_accuracy": metrics["test_accuracy"],
    "seconds": round(seconds, 1),
    "mlflow_run_id": mlflow_run_id,
}
dbutils.notebook.exit(json.dumps(summary, sort_keys=True))
