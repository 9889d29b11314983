"""A synthetic table written by Spark, and its model, for test_spark_ml_tables.py and its local[2] job.

Columns: ``id`` long; ``city`` string (five known cities and one out of the vocabulary); ``shop``
long (an id for an Embedding); ``visits`` int; ``spend`` double; ``hist`` a Spark ML vector of 3;
``label`` double, 1.0 when ``score > 0`` with score = 2 [city in oslo, lima, köln] + 1.5 [shop % 3 == 0]
+ spend + hist[0] - 1.2 (a null spend counts as 0). With ``nulls``, about 4% of the cities and 4% of
the spends are null. With ``wide``, two more feature columns the label does not depend on: ``pair``
array<float> of 2 (visits, shop) and ``raw`` binary of 2 bytes (shop, visits), for ``model(wide=True)``.
"""

from __future__ import annotations

from typing import Any

from sparkgrad.errors import InvalidArgumentError, SchemaError
from sparkgrad.nn import CategoryEncoding, Concatenate, Dense, Embedding, Flatten, Input, Model, StringLookup

CITIES = ["paris", "rome", "oslo", "lima", "quito"]  # "köln" in the data is out of the vocabulary
SHOPS = 12
COLUMNS = ["city", "shop", "visits", "spend", "hist"]
WIDE_COLUMNS = [*COLUMNS, "pair", "raw"]

# Bad input to an Estimator of model() on inputCols=COLUMNS, fitting the table with nulls, on classic Spark
# (test_spark_ml_tables.py) and over Spark Connect (test_spark_ml_tables_connect.py): name -> (the DataFrame
# from the table, Estimator params, the error, its message). SQL strings only, so that one DataFrame call
# builds the same plan on either kind of session.
BAD_INPUTS = {
    "missing_column": (
        lambda df: df.drop("visits"),
        {},
        InvalidArgumentError,
        r"^feature column 'visits' is not in the DataFrame \(its columns: 'id', 'city', 'shop', 'spend', 'hist', "
        r"'label'\)$",
    ),
    "unsupported_type": (
        lambda df: df.selectExpr("id", "city", "shop", "map('n', visits) AS visits", "spend", "hist", "label"),
        {},
        InvalidArgumentError,
        r"^feature column 'visits' has type map<string,int>: features must be Spark ML vectors, arrays of numbers, "
        r"binary values",
    ),
    "null_under_error": (
        lambda df: df,
        {},
        SchemaError,
        r"^file '[^']+\.parquet', row group \d+, row \d+: column '(city|spend)' is null \(its null policy is "
        r"'error'; 'fill' or 'skip' it\)$",
    ),
}


def write_table(spark: Any, path: str, rows: int, seed: int, nulls: bool, wide: bool = False) -> Any:
    """Writes the table as Parquet with Spark (3 files) and returns ``spark.read.parquet(path)``."""
    from sparkgrad.spark.model import sql_functions

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
    if wide:
        df = df.selectExpr(
            "*",
            "array(CAST(visits AS FLOAT), CAST(shop AS FLOAT)) AS pair",
            "unhex(lpad(hex(shop * 256 + visits), 4, '0')) AS raw",
        )
    array_to_vector = sql_functions(df)[1]  # classic Spark's or Spark Connect's, by the DataFrame's kind
    df.withColumn("hist", array_to_vector("hist")).write.parquet(path)
    return spark.read.parquet(path)


def model(seed: int = 0, wide: bool = False) -> Model:
    city = Input(shape=(1,), dtype="string", name="city")
    shop = Input(shape=(1,), dtype="int64", name="shop")
    visits = Input(shape=(1,), name="visits")
    spend = Input(shape=(1,), name="spend")
    hist = Input(shape=(3,), name="hist")
    lookup = StringLookup(vocabulary=CITIES)  # one OOV bucket (index 0), then the five cities
    city_1h = CategoryEncoding(num_tokens=lookup.vocabulary_size(), output_mode="one_hot")(lookup(city))
    shop_vec = Flatten()(Embedding(SHOPS, 4)(shop))
    inputs, parts = [city, shop, visits, spend, hist], [city_1h, shop_vec, visits, spend, hist]
    if wide:
        pair, raw = Input(shape=(2,), name="pair"), Input(shape=(2,), name="raw")
        inputs, parts = [*inputs, pair, raw], [*parts, pair, raw]
    h = Dense(16, activation="relu")(Concatenate()(parts))
    m = Model(inputs, Dense(1, activation="sigmoid")(h), seed=seed)
    m.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return m
