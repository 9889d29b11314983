# Databricks notebook source
# MAGIC %md
# MAGIC # 01 · Quickstart: distributed Fashion-MNIST with sparkgrad
# MAGIC
# MAGIC Install sparkgrad, convert Fashion-MNIST to TFRecords, train the TensorFlowOnSpark walkthrough's MLP on
# MAGIC 1 parameter server and 2 workers from this notebook (every node's log lines appear below the cell as they
# MAGIC happen, under a progress bar), then plot the loss and accuracy and print the test metrics.
# MAGIC
# MAGIC Cluster: Dedicated (single user) access mode, 3 task slots for the nodes (`spark.task.cpus` = cores per
# MAGIC worker, autoscaling off). Upload the four IDX files (`train-images-idx3-ubyte.gz`, ...) to the folder of
# MAGIC the `source` widget first.

# COMMAND ----------

# MAGIC %pip install /Volumes/main/default/libs/sparkgrad-0.1.0-cp312-cp312-manylinux_2_34_x86_64.whl

# COMMAND ----------

dbutils.widgets.text("source", "/Volumes/main/default/data/fashion-mnist", "IDX files")
dbutils.widgets.text("work_dir", "dbfs:/FileStore/sparkgrad/quickstart", "working folder")
dbutils.widgets.text("max_rows", "0", "examples per split (0: all)")
dbutils.widgets.text("epochs", "2", "epochs")
source = dbutils.widgets.get("source")
work_dir = dbutils.widgets.get("work_dir").rstrip("/")
max_rows = int(dbutils.widgets.get("max_rows")) or None
epochs = int(dbutils.widgets.get("epochs"))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Convert Fashion-MNIST to TFRecords
# MAGIC Converted on the driver's local disk, then copied whole to `work_dir`, where every node reads them.

# COMMAND ----------

import tempfile

from sparkgrad.data.convert import convert_mnist
from sparkgrad.databricks import fuse_path, require_input

require_input(dbutils, source, "an upload of Fashion-MNIST's four IDX .gz files (a Unity Catalog Volume or DBFS)")
local = tempfile.mkdtemp(prefix="sparkgrad-quickstart-")
dbutils.fs.cp(source, f"file:{local}/idx", recurse=True)
for split, prefix, shards in (("train", "train", 4), ("test", "t10k", 1)):
    convert_mnist(
        f"{local}/idx/{prefix}-images-idx3-ubyte.gz",
        f"{local}/idx/{prefix}-labels-idx1-ubyte.gz",
        f"{local}/records",
        shards=shards,
        name=split,
        limit=max_rows,
    )
dbutils.fs.cp(f"file:{local}/records", f"{work_dir}/data", recurse=True)
display(spark.createDataFrame([(f.name, f.size) for f in dbutils.fs.ls(f"{work_dir}/data")], "file string, bytes long"))
train_rows = max_rows or 60_000

# COMMAND ----------

# MAGIC %md
# MAGIC ## The code every node runs
# MAGIC As in TensorFlowOnSpark: `map_fun(args, ctx)` runs once per node; `ctx.job_name` says its role. The
# MAGIC parameter server holds the weights; the two workers (worker 0 is the chief) pull them, compute
# MAGIC gradients in sparkgrad's C core and push them back. `ctx.metric` streams a value to this notebook.

# COMMAND ----------


def map_fun(args, ctx):
    import glob

    from sparkgrad import TFNode
    from sparkgrad.data import TFRecordDataset
    from sparkgrad.data.convert import mnist_schema
    from sparkgrad.nn.models import walkthrough_mlp

    model = walkthrough_mlp(seed=42)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    server = TFNode.start_cluster_server(ctx)
    if ctx.job_name == "ps":
        return {"ps": server.serve_parameters(model.num_params, mode="async", lr=args["lr"], init=model.params)}
    files = sorted(glob.glob(f"{args['data']}/train*.tfrecords"))
    batches = TFRecordDataset(
        files, mnist_schema(), 100, shuffle_buffer=10_000, seed=ctx.task_index, epochs=args["epochs"]
    )
    with TFNode.ps_client(ctx, model.num_params) as ps:
        step = ps.pull(model.params)
        for i, batch in enumerate(batches):
            loss, accuracy = model.compute_gradients(batch["image_raw"], batch["label"])
            step = ps.push_pull(model.grads, model.params)
            if i % 10 == 0:  # every 10th batch of this worker's own (the global step interleaves across workers)
                ctx.metric("loss", loss, step)
                ctx.metric("accuracy", accuracy, step)
        ctx.metric("loss", loss, step)  # and its last one
        ctx.metric("accuracy", accuracy, step)
        if ctx.task_index != 0:
            return {"step": step}
        step = ps.wait_for_workers(model.params)  # worker 0, the chief, evaluates the final weights
    print(f"training done at global step {step}; evaluating")
    test = next(iter(TFRecordDataset([f"{args['data']}/test.tfrecords"], mnist_schema(), 10_000)))
    loss, accuracy = model.evaluate(test["image_raw"], test["label"], batch_size=1000, verbose=0)
    return {"step": step, "test_loss": loss, "test_accuracy": accuracy}


# COMMAND ----------

# MAGIC %md
# MAGIC ## Train
# MAGIC `output=` receives every line the nodes print and every metric; here each line is printed above a
# MAGIC progress bar that follows the global step.

# COMMAND ----------

import re

from sparkgrad import TFCluster
from tqdm.auto import tqdm


class LiveOutput:
    """Prints each node's lines above a progress bar of the global step (from the metric lines)."""

    def __init__(self, total_steps):
        self.bar = tqdm(total=total_steps, unit="step", desc="training")

    def __call__(self, line):
        self.bar.write(line)
        metric = re.search(r" metric \w+=\S+ step=(\d+)$", line)
        if metric:
            self.bar.update(max(0, int(metric.group(1)) - self.bar.n))


num_executors, num_ps = 3, 1
args = {"data": fuse_path(dbutils, f"{work_dir}/data"), "epochs": epochs, "lr": 0.07}
output = LiveOutput((num_executors - num_ps) * epochs * train_rows // 100)  # each worker reads every row
cluster = TFCluster.run(sc, map_fun, args, num_executors, num_ps, reservation_timeout=120, output=output)
cluster.shutdown(timeout=3600)
output.bar.close()

# COMMAND ----------

import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
for ax, name in zip(axes, ("loss", "accuracy"), strict=True):
    points = sorted((m.step, m.value) for m in cluster.metrics if m.name == name)
    ax.plot([s for s, _ in points], [v for _, v in points], marker=".")
    ax.set(title=f"training {name} (per batch)", xlabel="global step")
display(fig)

# COMMAND ----------

chief = next(r for r in cluster.results.values() if isinstance(r, dict) and "test_accuracy" in r)
print(f"global step {chief['step']}: test loss {chief['test_loss']:.4f}, test accuracy {chief['test_accuracy']:.4f}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## MLflow
# MAGIC On Databricks the run appears in this notebook's experiment: the settings, every node's metric curves
# MAGIC (`worker0/loss`, ...), the test metrics and the plot. Elsewhere it is logged when `MLFLOW_TRACKING_URI` is set.

# COMMAND ----------

from sparkgrad.nn import tracking

if tracking.mlflow_configured():
    import mlflow

    settings = {"num_executors": num_executors, "num_ps": num_ps, "epochs": epochs, "train_rows": train_rows}
    test_metrics = {"test_loss": chief["test_loss"], "test_accuracy": chief["test_accuracy"]}
    with mlflow.start_run(run_name="01_quickstart") as mlflow_run:
        mlflow.log_params({**settings, "learning_rate": args["lr"], "batch_size": 100, "optimizer": "sgd"})
        tracking.log_cluster_metrics(cluster.metrics)  # worker0/loss, worker1/accuracy, ... at the global step
        mlflow.log_metrics(test_metrics, step=chief["step"])
        mlflow.log_figure(fig, "training_curves.png")
    print(f"MLflow run {mlflow_run.info.run_id}")
