# Databricks notebook source
# MAGIC %md
# MAGIC # 13 · Pipeline: prepare, train, evaluate
# MAGIC
# MAGIC Runs `10_prep`, `11_train` and `12_evaluate` with `dbutils.notebook.run`, each step's `output_data` the
# MAGIC next one's `input_data` (what an Azure ML pipeline of `DatabricksStep`s passes as widget arguments), and
# MAGIC checks every hand-off: the files a step announces exist, and the evaluation step measures the accuracy the
# MAGIC training step reported for the model it wrote.
# MAGIC
# MAGIC | widget | meaning |
# MAGIC |---|---|
# MAGIC | `input_data` | folder of the Fashion-MNIST IDX files |
# MAGIC | `output_data` | the pipeline's folder: `records/`, `model/`, `evaluation/` |
# MAGIC | `max_rows`, `epochs`, `mode` | passed to the steps |

# COMMAND ----------

dbutils.widgets.text("input_data", "dbfs:/FileStore/fashion-mnist", "IDX files (input)")
dbutils.widgets.text("output_data", "dbfs:/FileStore/sparkgrad/pipeline", "pipeline folder (output)")
dbutils.widgets.text("max_rows", "0", "examples per split (0: all)")
dbutils.widgets.text("epochs", "2", "epochs")
dbutils.widgets.dropdown("mode", "tensorflow", ["tensorflow", "spark"], "input mode")
root = dbutils.widgets.get("output_data").rstrip("/")

# COMMAND ----------

import json


def step(notebook, timeout_seconds, **arguments):
    """Runs one step; its dbutils.notebook.exit value is a JSON summary."""
    summary = json.loads(dbutils.notebook.run(notebook, timeout_seconds, arguments))
    print(f"{notebook}: {summary}")
    return summary


def names(path):
    return {f.name for f in dbutils.fs.ls(path)}


prep = step(
    "./10_prep",
    1800,
    input_data=dbutils.widgets.get("input_data"),
    output_data=f"{root}/records",
    max_rows=dbutils.widgets.get("max_rows"),
)
assert prep["output_data"] == f"{root}/records" and names(prep["output_data"]) == set(prep["files"])
assert "test.tfrecords" in prep["files"] and prep["train_rows"] > 0

# COMMAND ----------

train = step(
    "./11_train",
    3600,
    input_data=prep["output_data"],
    output_data=f"{root}/model",
    epochs=dbutils.widgets.get("epochs"),
    mode=dbutils.widgets.get("mode"),
)
assert train["output_data"] == f"{root}/model"
assert {"model.sgckpt", "pixel_stats.npz"} <= names(f"{train['output_data']}/model")

# COMMAND ----------

evaluation = step(
    "./12_evaluate",
    1800,
    input_data=train["output_data"],
    test_data=prep["output_data"],
    output_data=f"{root}/evaluation",
)
assert evaluation["rows"] == prep["test_rows"] and "evaluation.json" in names(evaluation["output_data"])
# The model 12 read is the one 11 trained: the same test accuracy as the chief measured.
assert abs(evaluation["test_accuracy"] - train["test_accuracy"]) < 1e-3, (evaluation, train)

# COMMAND ----------

dbutils.notebook.exit(json.dumps({"prep": prep, "train": train, "evaluate": evaluation}, sort_keys=True))
