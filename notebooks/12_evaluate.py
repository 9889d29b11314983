# Databricks notebook source
# MAGIC %md
# MAGIC # 12 · Evaluate
# MAGIC
# MAGIC Pipeline step 3 of 3: loads the model that `11_train` wrote to its `output_data`, evaluates it on the
# MAGIC test TFRecords, and writes `evaluation.json` (loss, accuracy, accuracy per class, confusion matrix)
# MAGIC to `output_data`.
# MAGIC
# MAGIC | widget | meaning |
# MAGIC |---|---|
# MAGIC | `input_data` | `11_train`'s `output_data` (its `model/` folder is read) |
# MAGIC | `test_data` | `10_prep`'s `output_data` (its `test*.tfrecords` are read) |
# MAGIC | `output_data` | gets `evaluation.json` |

# COMMAND ----------

dbutils.widgets.text("input_data", "dbfs:/FileStore/sparkgrad/pipeline/model", "model (input)")
dbutils.widgets.text("test_data", "dbfs:/FileStore/sparkgrad/pipeline/records", "TFRecords (input)")
dbutils.widgets.text("output_data", "dbfs:/FileStore/sparkgrad/pipeline/evaluation", "evaluation (output)")
input_data = dbutils.widgets.get("input_data").rstrip("/")
test_data = dbutils.widgets.get("test_data").rstrip("/")
output_data = dbutils.widgets.get("output_data").rstrip("/")

# COMMAND ----------

import json
import os
import tempfile

import numpy as np
from sparkgrad.databricks import require_input
from sparkgrad.examples import mnist_dist

require_input(dbutils, f"{input_data}/model", "notebooks/11_train (its output_data)")
require_input(dbutils, test_data, "notebooks/10_prep (its output_data)")
local = tempfile.mkdtemp(prefix="sparkgrad-evaluate-")
dbutils.fs.cp(f"{input_data}/model", f"file:{local}/model", recurse=True)
dbutils.fs.cp(test_data, f"file:{local}/data", recurse=True)

model = mnist_dist.build_model()
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.load(f"{local}/model/{mnist_dist.CHECKPOINT}")
with np.load(f"{local}/model/pixel_stats.npz") as stats:
    mean, std = stats["mean"], stats["std"]
x, y = mnist_dist.load_test_set(f"{local}/data")
x = (x - mean) / std

# COMMAND ----------

loss, accuracy = model.evaluate(x, y, batch_size=1000, verbose=0)
predicted = model.predict(x, batch_size=1000).argmax(axis=1)
confusion = np.zeros((10, 10), np.int64)
np.add.at(confusion, (y, predicted), 1)
evaluation = {
    "model": f"{input_data}/model/{mnist_dist.CHECKPOINT}",
    "rows": int(len(y)),
    "test_loss": float(loss),
    "test_accuracy": float(accuracy),
    "class_accuracy": (confusion.diagonal() / np.maximum(confusion.sum(axis=1), 1)).round(4).tolist(),
    "confusion": confusion.tolist(),
}
print(f"test accuracy {accuracy:.4f} on {len(y)} examples")

# COMMAND ----------

os.makedirs(f"{local}/out")
with open(f"{local}/out/evaluation.json", "w") as f:
    json.dump(evaluation, f, indent=1, sort_keys=True)
dbutils.fs.cp(f"file:{local}/out/evaluation.json", f"{output_data}/evaluation.json")
summary = {k: evaluation[k] for k in ("model", "rows", "test_loss", "test_accuracy")}
dbutils.notebook.exit(json.dumps({"output_data": output_data, **summary}, sort_keys=True))
