# Databricks notebook source
# MAGIC %md
# MAGIC # 20 · The HorovodRunner tutorial's CNN, on sparkgrad
# MAGIC
# MAGIC The flow of Databricks' HorovodRunner MNIST tutorial: a data function that gives each process its shard,
# MAGIC a model function (the tutorial's Keras CNN: `sparkgrad.nn.models.horovod_cnn`), training on the driver
# MAGIC first, then the same training on `np` processes with the learning rate scaled by `np`, a checkpoint per
# MAGIC epoch written by rank 0, and finally the checkpoint loaded back on the driver and evaluated.
# MAGIC
# MAGIC **What runs the distributed part today.** sparkgrad's allreduce runner (issue 13) has not landed; this
# MAGIC notebook uses a *synchronous* parameter server instead, which does the same arithmetic as Horovod's
# MAGIC averaged allreduce: each step applies the mean of the `np` workers' gradients, with Adadelta at
# MAGIC `learning_rate × np` (Horovod's `DistributedOptimizer` averages, then each process applies the same
# MAGIC update). It costs one extra task slot (the ps) and a round trip through it per step.
# MAGIC
# MAGIC | widget | meaning |
# MAGIC |---|---|
# MAGIC | `data_path` | TFRecords from `10_prep` (`train*.tfrecords`, `test.tfrecords`) |
# MAGIC | `output_path` | gets `checkpoints/epoch-N.sgckpt` |
# MAGIC | `np` | worker processes (HorovodRunner's `np`) |
# MAGIC | `epochs`, `learning_rate` | the tutorial's 3 epochs (distributed) and Adadelta 0.1 |

# COMMAND ----------

dbutils.widgets.text("data_path", "dbfs:/FileStore/sparkgrad/pipeline/records", "TFRecords")
dbutils.widgets.text("output_path", "dbfs:/FileStore/sparkgrad/horovod-cnn", "output folder")
dbutils.widgets.text("np", "2", "processes")
dbutils.widgets.text("epochs", "3", "epochs")
dbutils.widgets.text("learning_rate", "0.1", "learning rate")
data_path = dbutils.widgets.get("data_path").rstrip("/")
output_path = dbutils.widgets.get("output_path").rstrip("/")
np_workers = int(dbutils.widgets.get("np"))
epochs = int(dbutils.widgets.get("epochs"))
learning_rate = float(dbutils.widgets.get("learning_rate"))

# COMMAND ----------

import glob

import numpy as np
from sparkgrad.databricks import fuse_path

NUM_CLASSES = 10
BATCH_SIZE = 128
data = fuse_path(dbutils, data_path)
checkpoints = fuse_path(dbutils, f"{output_path}/checkpoints")


def get_dataset(data_dir, split, rank=0, size=1):
    """This process's shard of a split: images float32[N, 28, 28, 1] in [0, 1], one-hot labels float32[N, 10]."""
    from sparkgrad.data import TFRecordDataset
    from sparkgrad.data.convert import mnist_schema

    files = sorted(glob.glob(f"{data_dir}/{split}*.tfrecords"))
    xs, ys = [], []
    for batch in TFRecordDataset(files, mnist_schema(), 1000):
        xs.append(batch["image_raw"])
        ys.append(batch["label"])
    x, y = np.concatenate(xs)[rank::size], np.concatenate(ys)[rank::size]
    return x.reshape(-1, 28, 28, 1), np.eye(NUM_CLASSES, dtype=np.float32)[y]


def get_model():
    from sparkgrad.nn.models import horovod_cnn

    return horovod_cnn(seed=1)


# COMMAND ----------

# MAGIC %md
# MAGIC ## Train on the driver first

# COMMAND ----------

from sparkgrad.nn import Adadelta

x_train, y_train = get_dataset(data, "train")
model = get_model()
model.compile(optimizer=Adadelta(learning_rate), loss="categorical_crossentropy", metrics=["accuracy"])
model.fit(x_train, y_train, batch_size=BATCH_SIZE, epochs=1, verbose=1)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Distributed: `np` workers, the learning rate scaled by `np`, checkpoints from rank 0

# COMMAND ----------


def train_hvd(args, ctx):
    import os
    import shutil
    import tempfile

    from sparkgrad import TFNode
    from sparkgrad.nn import Adadelta

    model = get_model()
    model.compile(optimizer="adadelta", loss="categorical_crossentropy", metrics=["accuracy"])
    server = TFNode.start_cluster_server(ctx)
    size = args["np"]
    if ctx.job_name == "ps":  # one averaged gradient per worker and step, then Adadelta at lr x np
        optimizer = Adadelta(args["learning_rate"] * size)
        return {"ps": server.serve_parameters(model.num_params, mode="sync", optimizer=optimizer, init=model.params)}
    rank = ctx.task_index
    x, y = get_dataset(args["data"], "train", rank, size)
    local = tempfile.mkdtemp(prefix="sparkgrad-hvd-")
    with TFNode.ps_client(ctx, model.num_params) as ps:
        ps.pull(model.params)
        for epoch in range(args["epochs"]):
            for start in range(0, len(x), BATCH_SIZE):
                loss, accuracy = model.compute_gradients(x[start : start + BATCH_SIZE], y[start : start + BATCH_SIZE])
                step = ps.push_pull(model.grads, model.params)
            ctx.metric("loss", loss, step)
            if rank == 0:  # write locally, then copy the whole file
                name = f"epoch-{epoch + 1}.sgckpt"
                model.save(os.path.join(local, name))
                os.makedirs(args["checkpoints"], exist_ok=True)
                shutil.copyfile(os.path.join(local, name), os.path.join(args["checkpoints"], name))
    shutil.rmtree(local)
    return {"rank": rank, "step": step, "loss": loss, "accuracy": accuracy}


# COMMAND ----------

from sparkgrad import TFCluster

args = {"np": np_workers, "epochs": epochs, "learning_rate": learning_rate, "data": data, "checkpoints": checkpoints}
cluster = TFCluster.run(sc, train_hvd, args, num_executors=np_workers + 1, num_ps=1, reservation_timeout=120)
cluster.shutdown(timeout=6 * 3600)
results = sorted((r for r in cluster.results.values() if "rank" in r), key=lambda r: r["rank"])
print(results)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Load the last checkpoint and evaluate it

# COMMAND ----------

x_test, y_test = get_dataset(data, "test")
trained = get_model()
trained.compile(optimizer="adadelta", loss="categorical_crossentropy", metrics=["accuracy"])
trained.load(f"{checkpoints}/epoch-{epochs}.sgckpt")
test_loss, test_accuracy = trained.evaluate(x_test, y_test, batch_size=1000, verbose=0)
print(f"test loss {test_loss:.4f}, test accuracy {test_accuracy:.4f}")
