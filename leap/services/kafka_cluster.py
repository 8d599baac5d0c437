"""A local three-broker Kafka cluster in KRaft mode: ``leap services up --kafka-brokers 3``.

Three JVMs from the same jars as the single broker, each a broker and a controller of one static
quorum, on the ports of :data:`leap.core.settings.LOCAL_KAFKA_CLUSTER_PORTS` (apart from the single
broker's, so both can run). Internal topics have three replicas and ``min.insync.replicas`` 2;
LEAP's topics get the same from ``LEAP_TOPIC_REPLICATION`` (3 when ``LEAP_KAFKA_BROKERS=3``).
Heaps are small: on a shared two-core machine the three nodes serve a test, not a fleet.
Each node's files live under ``services_dir(settings) / "kafka-cluster" / "node-<id>"``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from leap.core.settings import LOCAL_KAFKA_CLUSTER_PORTS, Settings
from leap.services.kafka import KafkaNode, local_kafka_pid, new_cluster_id, start_local_kafka, stop_local_kafka
from leap.services.processes import ServiceError, Step, services_dir

#: Per-node JVM heap of the cluster (the single broker's default is larger).
CLUSTER_HEAP = "-Xms128m -Xmx384m"


def cluster_home(settings: Settings) -> Path:
    return services_dir(settings) / "kafka-cluster"


def cluster_nodes(settings: Settings) -> list[KafkaNode]:
    """The three nodes, each knowing the whole quorum."""
    voters = tuple((i, controller) for i, (_, controller) in enumerate(LOCAL_KAFKA_CLUSTER_PORTS, start=1))
    return [KafkaNode(port=port, controller_port=controller, home=cluster_home(settings) / f"node-{i}",
                      node_id=i, voters=voters, heap=CLUSTER_HEAP)
            for i, (port, controller) in enumerate(LOCAL_KAFKA_CLUSTER_PORTS, start=1)]


def _cluster_id(settings: Settings) -> str:
    """The cluster's id, made once and kept: a node formatted later must join the same cluster."""
    path = cluster_home(settings) / "cluster.id"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(new_cluster_id() + "\n")
    return path.read_text().strip()


def start_node(settings: Settings, node: KafkaNode, step: Step) -> tuple[str, int | None]:
    """Start one node unless it runs (also how a test brings back a killed node)."""
    return start_local_kafka(settings, step, node, cluster_id=_cluster_id(settings))


def start_local_kafka_cluster(settings: Settings, step: Step) -> tuple[str, list[int | None]]:
    """Start every node that does not run. Returns (``started`` or ``running``, pids)."""
    results = [start_node(settings, node, step) for node in cluster_nodes(settings)]
    action = "started" if any(a == "started" for a, _ in results) else "running"
    return action, [pid for _, pid in results]


def local_cluster_pids(settings: Settings) -> list[int | None]:
    return [local_kafka_pid(settings, node) for node in cluster_nodes(settings)]


def wait_for_brokers(settings: Settings, timeout: float) -> None:
    """Until every node is a registered broker: a node answers before the others have joined, and
    a topic with three replicas cannot be created on fewer."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.confluent_config())
    deadline = time.monotonic() + timeout
    brokers: dict[int, Any] = {}
    while time.monotonic() < deadline:
        brokers = admin.list_topics(timeout=5).brokers
        if len(brokers) >= len(LOCAL_KAFKA_CLUSTER_PORTS):
            return
        time.sleep(0.3)
    raise ServiceError(f"only brokers {sorted(brokers)} of the local cluster registered within {timeout:.0f} s")


def stop_local_kafka_cluster(settings: Settings) -> str:
    """Stop every node: ``stopped`` if any ran, else ``not running``."""
    states = [stop_local_kafka(settings, node) for node in cluster_nodes(settings)]
    return "stopped" if any(s in ("stopped", "killed") for s in states) else "not running"
