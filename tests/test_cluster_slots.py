"""The pre-flight slot check of a Spark Connect session, from what its ``spark.conf`` exposes; no Spark.

ConnectSpark is the real class; the session under it is a stand-in with only
``conf.get`` (what a Connect client's session offers for this), so masters
that no local test server can have (yarn, standalone, a withheld key) are
covered.
"""

from __future__ import annotations

import os

import pytest
from pyspark.errors import PySparkException
from sparkgrad.cluster.spark import ConnectSpark, check_spark, conf_withheld, slots_from_conf
from sparkgrad.errors import ClusterError, InsufficientSlotsError


class ConfOnlySession:
    """What check_spark reads of a Connect session: ``spark.conf.get(key, default)``."""

    def __init__(self, conf: dict[str, str]) -> None:
        self.conf = self
        self._values = conf

    def get(self, key: str, default: str | None = None) -> str | None:
        return self._values.get(key, default)


@pytest.mark.parametrize(
    ("master", "conf", "slots"),
    [
        ("local", {}, 1),
        ("local[3]", {}, 3),
        ("local[4, 2]", {}, 4),
        ("local[4]", {"spark.task.cpus": "2"}, 2),
        ("local-cluster[2,3,1024]", {}, 6),
        ("spark://h:7077", {"spark.executor.instances": "3", "spark.executor.cores": "4", "spark.task.cpus": "2"}, 6),
        ("yarn", {"spark.executor.instances": "3"}, None),
        ("", {}, None),
    ],
)
def test_connect_slot_count_comes_from_the_master_and_executor_conf(master, conf, slots):
    count = slots_from_conf(master, conf.get)
    assert count.slots == slots
    assert master in count.source


def test_local_star_counts_this_machines_cores():
    assert slots_from_conf("local[*]", {}.get).slots == os.cpu_count()


def test_connect_check_refuses_too_few_slots_naming_the_numbers_and_their_source():
    session = ConnectSpark(
        ConfOnlySession({"spark.master": "yarn", "spark.executor.instances": "2", "spark.executor.cores": "2"})
    )
    with pytest.raises(InsufficientSlotsError, match=r"needs 5 task slots .* Spark has 4 \(master yarn, spark.exec"):
        check_spark(session, 4, slots_timeout=30, feed_slots=1)
    check_spark(session, 4, slots_timeout=30)  # exactly enough: no error, and no waiting for executors


def test_connect_check_says_it_cannot_check_when_nothing_tells_the_slots():
    said: list[str] = []
    check_spark(ConnectSpark(ConfOnlySession({"spark.master": "yarn"})), 3, 30, warn=said.append)
    assert len(said) == 1 and "cannot check the task slots before starting 3 barrier tasks" in said[0]


def test_connect_check_refuses_dynamic_allocation():
    conf = {"spark.master": "local[4]", "spark.dynamicAllocation.enabled": "true"}
    with pytest.raises(ClusterError, match="dynamicAllocation.enabled=true"):
        check_spark(ConnectSpark(ConfOnlySession(conf)), 2, 30)


class RaisingSession:
    """A Connect session whose ``conf.get`` fails with ``exc`` for every key."""

    def __init__(self, exc: Exception) -> None:
        self.conf = self
        self._exc = exc

    def get(self, key: str, default: str | None = None) -> str | None:
        raise self._exc


WITHHELD = "[CONFIG_NOT_AVAILABLE] Configuration spark.master is not available. SQLSTATE: 42K0I"
SERVER_GONE = "<_MultiThreadedRendezvous of RPC that terminated with: status = StatusCode.UNAVAILABLE>"


def test_a_withheld_conf_key_reads_as_its_default():
    assert conf_withheld(PySparkException(message=WITHHELD))
    assert ConnectSpark(RaisingSession(PySparkException(message=WITHHELD))).conf("spark.master", "x") == "x"


def test_a_failing_connect_server_is_an_error_naming_the_key_not_an_unset_value():
    assert not conf_withheld(PySparkException(message=SERVER_GONE))
    session = ConnectSpark(RaisingSession(PySparkException(message=SERVER_GONE)))
    with pytest.raises(ClusterError, match=r"reading Spark conf key spark.master from the Spark Connect .*UNAVAIL"):
        session.conf("spark.master", "x")
    with pytest.raises(ClusterError, match="conf key spark.dynamicAllocation.enabled"):
        check_spark(session, 2, 30)  # the pre-flight check stops at its first read
