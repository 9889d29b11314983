# Databricks notebook source
# MAGIC %md
# MAGIC # 11 · Train
# MAGIC
# MAGIC Pipeline step 2 of 3: trains on the TFRecords in `input_data` (`10_prep`'s `output_data`) and writes the
# MAGIC model to `output_data`. The training itself is `02_scheduled_training_job`, run as a child notebook with
# MAGIC the pipeline's widget names mapped to the job's, so the job and the pipeline share one code path.
# MAGIC
# MAGIC | widget | meaning |
# MAGIC |---|---|
# MAGIC | `input_data` | folder of `train*.tfrecords` and `test*.tfrecords` |
# MAGIC | `output_data` | gets `model/` (checkpoint and pixel statistics), `checkpoints/`, `metrics.json` |
# MAGIC | `epochs`, `learning_rate`, `num_executors`, `num_ps`, `mode` | as in `02_scheduled_training_job` |
# MAGIC | `timeout_seconds` | bound on the training run |

# COMMAND ----------

dbutils.widgets.text("input_data", "dbfs:/FileStore/sparkgrad/pipeline/records", "TFRecords (input)")
dbutils.widgets.text("output_data", "dbfs:/FileStore/sparkgrad/pipeline/model", "model (output)")
dbutils.widgets.text("epochs", "2", "epochs")
dbutils.widgets.text("learning_rate", "0.07", "learning rate")
dbutils.widgets.text("num_executors", "3", "nodes")
dbutils.widgets.text("num_ps", "1", "parameter servers")
dbutils.widgets.dropdown("mode", "tensorflow", ["tensorflow", "spark"], "input mode")
dbutils.widgets.text("timeout_seconds", "3600", "timeout (s)")

# COMMAND ----------

import json

arguments = {
    "data_path": dbutils.widgets.get("input_data"),
    "output_path": dbutils.widgets.get("output_data"),
    **{k: dbutils.widgets.get(k) for k in ("epochs", "learning_rate", "num_executors", "num_ps", "mode")},
}
summary = json.loads(
    dbutils.notebook.run("./02_scheduled_training_job", int(dbutils.widgets.get("timeout_seconds")), arguments)
)
summary["output_data"] = summary["output_path"]
print(summary)

# COMMAND ----------

dbutils.notebook.exit(json.dumps(summary, sort_keys=True))
