"""A synthetic table written by Spark, and its model, for test_spark_ml_tables.py and its local[2] job.

Columns: ``id`` long; ``city`` string (five known cities and one out of the vocabulary); ``shop``
long (an id for an Embedding); ``visits`` int; ``spend`` double; ``hist`` a Spark ML vector of 3;
``label`` double, 1.0 when ``score > 0`` with score = 2 [city in oslo, lima, köln] + 1.5 [shop % 3 == 0]
+ spend + hist[0] - 1.2 (a null spend counts as 0). With ``nulls``, about 4% of the cities and 4% of
the spends are null.
"""

from __future__ import annotations

from typing import Any

from sparkgrad.nn import CategoryEncoding, Concatenate, Dense, Embedding, Flatten, Input, Model, StringLookup

CITIES = ["paris", "rome", "oslo", "lima", "quito"]  # "köln" in the data is out of the vocabulary
SHOPS = 12
COLUMNS = ["city", "shop", "visits", "spend", "hist"]


def write_table(spark: Any, path: str, rows: int, seed: int, nulls: bool) -> Any:
    """Writes the table as Parquet with Spark (3 files) and returns ``spark.read.parquet(path)``."""
    from pyspark.ml.functions import array_to_vector

    cities = ", ".join(f"'{c}'" for c in CITIES + ["köln"])
    df = spark.range(rows, numPartitions=3).selectExpr(
        "id",
        f"element_at(array({cities}), CAST(floor(rand({seed}) * 6) AS INT) + 1) AS city",
        f"CAST(floor(rand({seed + 1}) * {SHOPS}) AS BIGINT) AS shop",
        f"CAST(floor(rand({seed + 2}) * 10) AS INT) AS visits",
        f"randn({seed + 3}) AS spend",
        f"array(randn({seed + 4}), randn({seed + 5}), randn({seed + 6})) AS hist",
        f"rand({seed + 7}) < 0.04 AS null_city",
        f"rand({seed + 8}) < 0.04 AS null_spend",
    )
    null_city, null_spend = ("null_city", "null_spend") if nulls else ("false", "false")
    score = (
        "2.0 * CAST(city IN ('oslo', 'lima', 'köln') AS DOUBLE) + 1.5 * CAST(shop % 3 = 0 AS DOUBLE)"
        f" + IF({null_spend}, 0.0, spend) + hist[0] - 1.2"
    )
    df = df.selectExpr(
        "id",
        f"IF({null_city}, NULL, city) AS city",
        "shop",
        "visits",
        f"IF({null_spend}, NULL, spend) AS spend",
        "hist",
        f"CAST({score} > 0 AS DOUBLE) AS label",
    )
    df.withColumn("hist", array_to_vector("hist")).write.parquet(path)
    return spark.read.parquet(path)


def model(seed: int = 0) -> Model:
    city = Input(shape=(1,), dtype="string", name="city")
    shop = Input(shape=(1,), dtype="int64", name="shop")
    visits = Input(shape=(1,), name="visits")
    spend = Input(shape=(1,), name="spend")
    hist = Input(shape=(3,), name="hist")
    lookup = StringLookup(vocabulary=CITIES)  # one OOV bucket (index 0), then the five cities
    city_1h = CategoryEncoding(num_tokens=lookup.vocabulary_size(), output_mode="one_hot")(lookup(city))
    shop_vec = Flatten()(Embedding(SHOPS, 4)(shop))
    h = Dense(16, activation="relu")(Concatenate()([city_1h, shop_vec, visits, spend, hist]))
    m = Model([city, shop, visits, spend, hist], Dense(1, activation="sigmoid")(h), seed=seed)
    m.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return m
