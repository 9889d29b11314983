# Databricks notebook source
# MAGIC %md
# MAGIC # 20 · The HorovodRunner tutorial's CNN, on sparkgrad
# MAGIC
# MAGIC The flow of Databricks' HorovodRunner MNIST tutorial: a data function that gives each process its shard,
# MAGIC a model function (the tutorial's Keras CNN: `sparkgrad.nn.models.horovod_cnn`), training on the driver
# MAGIC first, then the same training on `np` processes with `sparkgrad.HorovodRunner` and `sparkgrad.hvd` (the
# MAGIC Horovod idioms unchanged: `hvd.init()`, shard by `hvd.rank()` / `hvd.size()`, learning rate × `hvd.size()`,
# MAGIC `hvd.DistributedOptimizer`, `BroadcastGlobalVariablesCallback(0)`, the best checkpoint kept by rank 0
# MAGIC only), and finally the checkpoint rank 0 returned, loaded on the driver and evaluated.
# MAGIC
# MAGIC | widget | meaning |
# MAGIC |---|---|
# MAGIC | `data_path` | TFRecords from `10_prep` (`train*.tfrecords`, `test.tfrecords`) |
# MAGIC | `output_path` | gets `checkpoints/best.sgck` (rank 0's best epoch by `val_loss`) |
# MAGIC | `np` | processes (HorovodRunner's `np`: > 0 a barrier stage of Spark tasks, < 0 on the driver) |
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
from sparkgrad.databricks import fuse_path, require_input

NUM_CLASSES = 10
BATCH_SIZE = 128
require_input(dbutils, data_path, "notebooks/10_prep (its output_data) or `sparkgrad convert mnist`")
data = fuse_path(dbutils, data_path)
checkpoints = fuse_path(dbutils, f"{output_path}/checkpoints")


def get_dataset(data_dir, split, rank=0, size=1):
    """This process's shard of a split: images uint8[N, 784] as stored, one-hot labels float32[N, 10]."""
    from sparkgrad.data import FixedLenFeature, RawBytesFeature, TFRecordDataset

    schema = {"image_raw": RawBytesFeature([784], "uint8"), "label": FixedLenFeature([], "int64")}
    files = sorted(glob.glob(f"{data_dir}/{split}*.tfrecords"))
    xs, ys = [], []
    for batch in TFRecordDataset(files, schema, 1000):
        xs.append(batch["image_raw"])
        ys.append(batch["label"])
    x, y = np.concatenate(xs)[rank::size], np.concatenate(ys)[rank::size]
    return x, np.eye(NUM_CLASSES, dtype=np.float32)[y]


def get_model(seed=1):
    from sparkgrad.nn.models import horovod_cnn

    model = horovod_cnn(seed=seed)
    model.set_input_transform(scale=1 / 255)  # the uint8 pixels are scaled in C as each batch is gathered
    return model


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
# MAGIC ## Distributed: `np` processes, the learning rate scaled by `hvd.size()`, the best checkpoint from rank 0

# COMMAND ----------


def train_hvd(learning_rate=0.1, data_dir=data, epochs=epochs):
    import os
    import tempfile

    import sparkgrad.hvd as hvd
    from sparkgrad.nn import Adadelta

    hvd.init()
    x, y = get_dataset(data_dir, "train", hvd.rank(), hvd.size())
    x_test, y_test = get_dataset(data_dir, "test")
    model = get_model(seed=1 + hvd.rank())  # rank 0's weights go to every rank at the start
    optimizer = hvd.DistributedOptimizer(Adadelta(learning_rate * hvd.size()))
    model.compile(optimizer=optimizer, loss="categorical_crossentropy", metrics=["accuracy"])
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
    local = tempfile.mkdtemp(prefix="sparkgrad-hvd-")
    checkpointing = {}
    if hvd.rank() == 0:  # only rank 0 keeps checkpoints, on its local disk
        checkpointing = dict(checkpoint_dir=local, save_best_only=True, monitor="val_loss")
    model.fit(
        x,
        y,
        batch_size=BATCH_SIZE,
        epochs=epochs,
        callbacks=callbacks,
        validation_data=(x_test, y_test),
        verbose=2 if hvd.rank() == 0 else 0,
        **checkpointing,
    )
    workers = hvd.allgather_object({"rank": hvd.rank(), "step": model.step})
    if hvd.rank() != 0:
        return None
    with open(os.path.join(local, "best.sgck"), "rb") as f:
        return {"checkpoint": f.read(), "workers": workers}


# COMMAND ----------

import os
import shutil
import tempfile

import sparkgrad

out = sparkgrad.HorovodRunner(np=np_workers).run(train_hvd, learning_rate=learning_rate, data_dir=data, epochs=epochs)
results = out["workers"]
print(results)
local_copy = os.path.join(tempfile.mkdtemp(), "best.sgck")  # write locally, then copy the whole file
with open(local_copy, "wb") as f:
    f.write(out["checkpoint"])
os.makedirs(checkpoints, exist_ok=True)
shutil.copyfile(local_copy, f"{checkpoints}/best.sgck")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Load the best checkpoint into a fresh model and evaluate it

# COMMAND ----------

x_test, y_test = get_dataset(data, "test")
trained = get_model()
trained.compile(optimizer="adadelta", loss="categorical_crossentropy", metrics=["accuracy"])
trained.load(f"{checkpoints}/best.sgck")
test_loss, test_accuracy = trained.evaluate(x_test, y_test, batch_size=1000, verbose=0)
print(f"test loss {test_loss:.4f}, test accuracy {test_accuracy:.4f}")
