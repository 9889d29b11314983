# Databricks notebook source
# MAGIC %md
# MAGIC # 10 · Prepare: Fashion-MNIST IDX files to TFRecords
# MAGIC
# MAGIC Pipeline step 1 of 3 (`13_pipeline` runs them in order; Azure ML's `DatabricksStep` passes the same
# MAGIC widget arguments). Reads the four IDX files from `input_data`, writes `train-*.tfrecords` and
# MAGIC `test.tfrecords` to `output_data`, and returns a JSON summary with `dbutils.notebook.exit`.
# MAGIC
# MAGIC | widget | meaning |
# MAGIC |---|---|
# MAGIC | `input_data` | folder of `train-images-idx3-ubyte.gz`, `train-labels-idx1-ubyte.gz`, `t10k-...` |
# MAGIC | `output_data` | folder for the TFRecords (replaced) |
# MAGIC | `max_rows` | keep the first N training and test examples; `0` keeps all |
# MAGIC | `shards` | number of training files |

# COMMAND ----------

dbutils.widgets.text("input_data", "dbfs:/FileStore/fashion-mnist", "IDX files (input)")
dbutils.widgets.text("output_data", "dbfs:/FileStore/sparkgrad/pipeline/records", "TFRecords (output)")
dbutils.widgets.text("max_rows", "0", "examples per split (0: all)")
dbutils.widgets.text("shards", "4", "training files")

input_data = dbutils.widgets.get("input_data")
output_data = dbutils.widgets.get("output_data")
max_rows = int(dbutils.widgets.get("max_rows")) or None
shards = int(dbutils.widgets.get("shards"))

# COMMAND ----------

# Copy the inputs to local disk, convert there, then copy the whole files to output_data:
# /dbfs is a FUSE view, where many small writes are slow or fail.
import json
import os
import tempfile

from sparkgrad.data.convert import convert_mnist
from sparkgrad.databricks import require_input

require_input(
    dbutils,
    input_data,
    "an upload of Fashion-MNIST's four IDX .gz files (locally: --param "
    "input_data=file:/usr/share/datasets/fashion-mnist, from Debian's dataset-fashion-mnist)",
)
local = tempfile.mkdtemp(prefix="sparkgrad-prep-")
dbutils.fs.cp(input_data, f"file:{local}/idx", recurse=True)
written = []
for split, prefix, n in (("train", "train", shards), ("test", "t10k", 1)):
    written += convert_mnist(
        f"{local}/idx/{prefix}-images-idx3-ubyte.gz",
        f"{local}/idx/{prefix}-labels-idx1-ubyte.gz",
        f"{local}/records",
        shards=n,
        name=split,
        limit=max_rows,
    )
print(f"converted {len(written)} files")

# COMMAND ----------

dbutils.fs.rm(output_data, recurse=True)
dbutils.fs.cp(f"file:{local}/records", output_data, recurse=True)
from sparkgrad.data import tfrecord_iterator


def count(split):
    return sum(1 for p in written if os.path.basename(p).startswith(split) for _ in tfrecord_iterator(p))


summary = {
    "output_data": output_data,
    "files": sorted(f.name for f in dbutils.fs.ls(output_data)),
    "train_rows": count("train"),
    "test_rows": count("test"),
}
print(summary)

# COMMAND ----------

dbutils.notebook.exit(json.dumps(summary, sort_keys=True))
