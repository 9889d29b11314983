# Databricks notebook source
# MAGIC %md
# MAGIC # 03 · A wide-and-deep click model from a table
# MAGIC
# MAGIC A click-through model trained from a Spark DataFrame of string, integer and numeric columns: the
# MAGIC columns go to the model's named inputs as they are (no VectorAssembler, no StringIndexer), the string
# MAGIC columns are looked up or hashed inside the model, and `sparkgrad.spark.Estimator` trains it on 2 workers
# MAGIC under allreduce. The fitted stage scores the held-out rows in Spark's tasks, Spark ML's
# MAGIC `BinaryClassificationEvaluator` computes the AUC, and the run (settings, AUC, the fitted stage as an
# MAGIC MLflow model) goes to this notebook's experiment.
# MAGIC
# MAGIC With `data_path` empty the notebook first writes a synthetic click log to `work_dir` as Parquet, drawn
# MAGIC from a known logistic model, so the best AUC any model can reach (the *oracle* AUC, from the true click
# MAGIC probabilities) is known and printed beside the model's. A table of your own needs the columns below
# MAGIC (`p_click` is optional: without it there is no oracle AUC).
# MAGIC
# MAGIC | column | type | in the model |
# MAGIC |---|---|---|
# MAGIC | `device` | string, a handful of values | `StringLookup` (vocabulary of the training rows), embedded, one-hot |
# MAGIC | `category` | string, tens of values | `StringLookup`, embedded; crossed with `device` |
# MAGIC | `site` | string, tens of thousands of values | `Hashing` into 4096 buckets, embedded |
# MAGIC | `user` | long id in [0, `users`) | `Embedding` |
# MAGIC | `price`, `position`, `hour` | double | `Normalization` (statistics of the training rows); `price` as its log |
# MAGIC | `clicked` | double, 0 or 1 | the label |
# MAGIC | `p_click` | double | the true click probability (synthetic data only) |
# MAGIC
# MAGIC Cluster: Dedicated (single user) access mode with 2 free task slots (one per worker).
# MAGIC
# MAGIC | widget | default | meaning |
# MAGIC |---|---|---|
# MAGIC | `data_path` | empty | a Parquet table with the columns above; empty: write the synthetic one |
# MAGIC | `work_dir` | `dbfs:/FileStore/sparkgrad/clicks` | where the synthetic table is written |
# MAGIC | `rows` | `200000` | rows of the synthetic table |
# MAGIC | `users` | `2000` | distinct user ids (the size of the user table) |
# MAGIC | `epochs`, `learning_rate`, `batch_size`, `num_workers` | `3`, `0.003`, `256`, `2` | training |

# COMMAND ----------

dbutils.widgets.text("data_path", "", "Parquet table (empty: synthetic)")
dbutils.widgets.text("work_dir", "dbfs:/FileStore/sparkgrad/clicks", "working folder")
dbutils.widgets.text("rows", "200000", "synthetic rows")
dbutils.widgets.text("users", "2000", "user ids")
dbutils.widgets.text("epochs", "3", "epochs")
dbutils.widgets.text("learning_rate", "0.003", "learning rate")
dbutils.widgets.text("batch_size", "256", "rows per step and worker")
dbutils.widgets.text("num_workers", "2", "workers")

# Widgets are strings: convert once, here.
data_path = dbutils.widgets.get("data_path").rstrip("/")
work_dir = dbutils.widgets.get("work_dir").rstrip("/")
rows = int(dbutils.widgets.get("rows"))
users = int(dbutils.widgets.get("users"))
epochs = int(dbutils.widgets.get("epochs"))
learning_rate = float(dbutils.widgets.get("learning_rate"))
batch_size = int(dbutils.widgets.get("batch_size"))
num_workers = int(dbutils.widgets.get("num_workers"))

# COMMAND ----------

# MAGIC %md
# MAGIC ## A synthetic click log
# MAGIC Each row is an ad shown to a user. The log-odds of a click add a per-user effect, device and category
# MAGIC effects, a device-by-category interaction (which a model sees only through the crossed column), an
# MAGIC effect for each site (a Zipf-distributed column, so few sites have many rows), a price slope, a
# MAGIC position penalty and a daily cycle in `hour`. Written with pyarrow on the driver's disk, then copied
# MAGIC whole to `work_dir`.

# COMMAND ----------

import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DEVICES = ["android", "ios", "web", "tv"]
CATEGORIES = [f"cat{k:02d}" for k in range(24)]


def synthetic_clicks(n, n_users, seed):
    """A pyarrow Table of ``n`` impressions drawn from a fixed logistic model (effects from ``seed``)."""
    rng = np.random.default_rng(seed)
    user_effect = rng.normal(0.0, 0.8, n_users)
    device_effect = np.array([0.0, 0.4, -0.3, -0.8])
    category_effect = rng.normal(0.0, 0.5, len(CATEGORIES))
    cross_effect = rng.normal(0.0, 0.7, (len(DEVICES), len(CATEGORIES)))
    site_effect = rng.normal(0.0, 0.6, 50_000)

    user = rng.integers(0, n_users, n)
    device = rng.choice(len(DEVICES), n, p=[0.45, 0.3, 0.2, 0.05])
    category = rng.integers(0, len(CATEGORIES), n)
    site = np.minimum(rng.zipf(1.3, n), 50_000) - 1
    price = rng.lognormal(3.0, 0.8, n)
    position = rng.integers(1, 9, n).astype(np.float64)
    hour = rng.integers(0, 24, n).astype(np.float64)
    logit = (
        -1.3
        + user_effect[user]
        + device_effect[device]
        + category_effect[category]
        + cross_effect[device, category]
        + site_effect[site]
        - 0.5 * (np.log(price) - 3.0) / 0.8
        - 0.2 * (position - 1.0)
        + 0.6 * np.sin(2 * np.pi * hour / 24)
    )
    p_click = 1.0 / (1.0 + np.exp(-logit))
    return pa.table(
        {
            "user": pa.array(user.astype(np.int64)),
            "device": pa.array(np.array(DEVICES)[device]),
            "category": pa.array(np.array(CATEGORIES)[category]),
            "site": pa.array(np.char.add("site-", site.astype(str))),
            "price": pa.array(np.round(price, 2)),
            "position": pa.array(position),
            "hour": pa.array(hour),
            "clicked": pa.array((rng.random(n) < p_click).astype(np.float64)),
            "p_click": pa.array(p_click),
        }
    )


if not data_path:
    data_path = f"{work_dir}/data"
    local = tempfile.mkdtemp(prefix="sparkgrad-clicks-")
    table = synthetic_clicks(rows, users, seed=3)
    parts = 4
    for i in range(parts):  # a few files, as a table written by Spark would be
        start, stop = i * rows // parts, (i + 1) * rows // parts
        pq.write_table(table.slice(start, stop - start), f"{local}/part-{i:05d}.parquet")
    dbutils.fs.rm(data_path, recurse=True)
    dbutils.fs.cp(f"file:{local}", data_path, recurse=True)
    shutil.rmtree(local)
    print(f"wrote {rows} synthetic rows to {data_path}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Read the table and derive two columns
# MAGIC Spark reads the Parquet files through the path every node sees (`fuse_path`: `/dbfs/...` on Databricks).
# MAGIC Two feature columns are made in Spark, for training and scoring alike: `log_price`, and `device_category`,
# MAGIC the crossed column the wide part learns the interaction from.

# COMMAND ----------

from pyspark.sql import functions as F
from sparkgrad.databricks import fuse_path, require_input

require_input(dbutils, data_path, "this notebook with data_path empty (the synthetic table), or your own table")
clicks = spark.read.parquet("file:" + fuse_path(dbutils, data_path))


def with_features(df):
    return df.withColumn("log_price", F.log1p("price")).withColumn(
        "device_category", F.concat_ws("|", "device", "category")
    )


train, test = (with_features(d) for d in clicks.randomSplit([0.8, 0.2], seed=11))
train, test = train.cache(), test.cache()
display(train.limit(5))
print(
    f"{train.count()} training rows, {test.count()} test rows, click rate {train.agg(F.mean('clicked')).first()[0]:.3f}"
)

# COMMAND ----------

# MAGIC %md
# MAGIC ## The model
# MAGIC Vocabularies and statistics come from the training rows, computed by Spark (one aggregation each), and
# MAGIC are part of the model: they are saved with it and applied in C as batches are gathered. The deep part
# MAGIC embeds every categorical column and adds the scaled numbers, through a 64-32 MLP; the wide part is a
# MAGIC linear model over the device, the hashed site (one weight each: embeddings of width 1) and the one-hot
# MAGIC hashed device-by-category cross. One sigmoid unit reads both. (A preprocessing layer is the only reader
# MAGIC of its `Input`; the ids it gives may feed several layers, as the site's and the device's do.)

# COMMAND ----------

from sparkgrad.nn import (
    Adam,
    Concatenate,
    Dense,
    Embedding,
    Flatten,
    Hashing,
    Input,
    Model,
    Normalization,
    StringLookup,
)
from sparkgrad.nn.metrics import AUC

SITE_BINS, CROSS_BINS = 4096, 512
NUMERIC = ["log_price", "position", "hour"]


def vocabulary(df, column, min_count=5):
    """The column's values seen at least ``min_count`` times, most frequent first (Keras adapt's order)."""
    counts = df.groupBy(column).count().filter(F.col("count") >= min_count)
    return [r[column] for r in counts.orderBy(F.desc("count"), column).collect()]


vocabularies = {c: vocabulary(train, c) for c in ("device", "category")}
stats = train.agg(*[F.mean(c).alias(f"{c}_mean") for c in NUMERIC], *[F.var_pop(c).alias(f"{c}_var") for c in NUMERIC])
stats = stats.first().asDict()


def wide_and_deep(seed=0):
    device = Input(shape=(1,), dtype="string", name="device")
    category = Input(shape=(1,), dtype="string", name="category")
    site = Input(shape=(1,), dtype="string", name="site")
    cross = Input(shape=(1,), dtype="string", name="device_category")
    user = Input(shape=(1,), dtype="int64", name="user")
    numbers = {c: Input(shape=(1,), name=c) for c in NUMERIC}

    device_lookup = StringLookup(vocabulary=vocabularies["device"])  # id 0: the OOV bucket, then the vocabulary
    category_lookup = StringLookup(vocabulary=vocabularies["category"])
    device_ids, category_ids = device_lookup(device), category_lookup(category)
    site_ids = Hashing(num_bins=SITE_BINS)(site)
    cross_1h = Hashing(num_bins=CROSS_BINS, output_mode="one_hot")(cross)
    scaled = [Normalization(mean=[stats[f"{c}_mean"]], variance=[stats[f"{c}_var"]])(x) for c, x in numbers.items()]

    # deep: an embedding of each categorical column and the scaled numbers, through an MLP
    tables = [
        (device_ids, device_lookup.vocabulary_size(), 4),
        (category_ids, category_lookup.vocabulary_size(), 8),
        (site_ids, SITE_BINS, 8),
        (user, users, 8),
    ]
    deep = Concatenate()([Flatten()(Embedding(size, width)(ids)) for ids, size, width in tables] + scaled)
    deep = Dense(32, activation="relu")(Dense(64, activation="relu")(deep))
    # wide: one weight per device, per site bucket (embeddings of width 1) and per cross bucket (one-hot)
    wide = [Flatten()(Embedding(device_lookup.vocabulary_size(), 1)(device_ids))]
    wide += [Flatten()(Embedding(SITE_BINS, 1)(site_ids)), cross_1h]
    out = Dense(1, activation="sigmoid")(Concatenate()([deep, *wide]))
    model = Model([device, category, site, cross, user, *numbers.values()], out, seed=seed)
    model.compile(optimizer=Adam(learning_rate), loss="binary_crossentropy", metrics=["accuracy", AUC()])
    return model


model = wide_and_deep()
INPUTS = model.input_names
print(f"inputs {INPUTS}; {model.num_params} parameters")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Train on the cluster, score the held-out rows
# MAGIC `inputCols` names the DataFrame columns, each feeding the `Input` of its name. Each worker reads its own
# MAGIC shard of the table's Parquet files every epoch (the training split is written once as Parquet first); under
# MAGIC allreduce the workers average their gradients every step. `transform` scores in Spark's tasks and adds
# MAGIC `probability`, `rawPrediction` and `prediction`.

# COMMAND ----------

import time

from pyspark.ml.evaluation import BinaryClassificationEvaluator
from sparkgrad.spark import Estimator

estimator = Estimator(
    model=model,
    optimizer=Adam(learning_rate),
    inputCols=INPUTS,
    labelCol="clicked",
    batch_size=batch_size,
    epochs=epochs,
    num_workers=num_workers,
    mode="allreduce",
)
started = time.perf_counter()
fitted = estimator.fit(train)
train_seconds = time.perf_counter() - started

scored = fitted.transform(test)
auc = BinaryClassificationEvaluator(labelCol="clicked", rawPredictionCol="rawPrediction").evaluate(scored)
oracle_auc = None
if "p_click" in test.columns:  # the true probabilities rank the rows as well as anything can
    oracle_auc = BinaryClassificationEvaluator(labelCol="clicked", rawPredictionCol="p_click").evaluate(test)
evaluation = fitted.evaluate(test)  # loss, accuracy and the thresholded AUC the model was compiled with
display(scored.select("user", "device", "site", "clicked", "probability", "prediction").limit(5))
oracle = f"{oracle_auc:.4f}" if oracle_auc is not None else "unknown"
print(f"trained in {train_seconds:.1f} s: test AUC {auc:.4f} (oracle {oracle}), log loss {evaluation['loss']:.4f}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## MLflow
# MAGIC On Databricks the run appears in this notebook's experiment: the settings, the test metrics and the
# MAGIC fitted stage as an MLflow model (its columns, vocabularies and statistics included), which
# MAGIC `mlflow.pyfunc.spark_udf` can score a table with. Elsewhere it is logged when `MLFLOW_TRACKING_URI` is set.

# COMMAND ----------

import json

from sparkgrad.nn import tracking

mlflow_run_id = None
if tracking.mlflow_configured():
    import mlflow
    import sparkgrad.mlflow

    with mlflow.start_run(run_name="03_tabular_click_model") as mlflow_run:
        mlflow.log_params({"data_path": data_path, "rows": rows, "users": users, "epochs": epochs})
        mlflow.log_params({"learning_rate": learning_rate, "batch_size": batch_size, "num_workers": num_workers})
        mlflow.log_params({"mode": "allreduce", "site_bins": SITE_BINS, "cross_bins": CROSS_BINS})
        metrics = {"test_auc": auc, "test_loss": evaluation["loss"], "test_accuracy": evaluation["accuracy"]}
        metrics["train_seconds"] = train_seconds
        if oracle_auc is not None:
            metrics["oracle_auc"] = oracle_auc
        mlflow.log_metrics(metrics)
        sparkgrad.mlflow.log_model(fitted, name="model")
    mlflow_run_id = mlflow_run.info.run_id
    print(f"MLflow run {mlflow_run_id}")

# COMMAND ----------

summary = {
    "data_path": data_path,
    "train_rows": train.count(),
    "test_rows": evaluation["rows"],
    "test_auc": auc,
    "oracle_auc": oracle_auc,
    "test_loss": evaluation["loss"],
    "seconds": round(train_seconds, 1),
    "mlflow_run_id": mlflow_run_id,
}
dbutils.notebook.exit(json.dumps(summary, sort_keys=True))
