"""Exactly-once output (:mod:`predictor.transactions`) on the real broker: an aborted transaction
hands its batches back to the loop, in the order they were consumed, and keeps nothing of them.

The whole loop under faults (fenced producers, killed brokers) is tested in test_predictor_loop.py,
test_faults.py and test_scale.py; here one output is driven batch by batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from leap.core.settings import Settings
from predictor.commits import ConsumedMessage
from predictor.transactions import ExactlyOnce

pytestmark = pytest.mark.integration


@pytest.fixture
def consumed(settings: Settings, topics: dict[str, str]) -> Iterator[tuple[str, list[ConsumedMessage]]]:
    """A topic of its own with two partitions, three messages in each, read back in the order a
    consumer takes them (deleted after)."""
    topic = f"leap.test-transactions-{uuid.uuid4().hex[:10]}"
    admin = AdminClient(settings.confluent_config())
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    try:
        producer = Producer(settings.confluent_config())
        for i in range(6):
            producer.produce(topic, str(i).encode(), partition=i % 2)
        assert producer.flush(30) == 0
        reader = Consumer(settings.confluent_config(**{"group.id": f"{topic}-reader", "enable.auto.commit": False}))
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in (0, 1)])
        msgs: list[ConsumedMessage] = []
        for _ in range(100):
            msgs += [ConsumedMessage(m) for m in reader.consume(10, timeout=0.2) if m.error() is None]
            if len(msgs) == 6:
                break
        reader.close()
        assert len(msgs) == 6
        yield topic, msgs
    finally:
        admin.delete_topics([topic])[topic].result(30)


def test_an_aborted_transaction_hands_back_its_batches_in_order_and_drops_the_one_in_flight(
        settings: Settings, consumed: tuple[str, list[ConsumedMessage]], tmp_path: Path) -> None:
    topic, msgs = consumed
    consumer = Consumer(settings.confluent_config(**{"group.id": f"{topic}-group"}))
    assigned = {(topic, 0), (topic, 1)}
    output = ExactlyOnce(replace(settings, home=tmp_path), consumer, assigned, f"test-{uuid.uuid4().hex[:10]}")
    try:
        for batch in (msgs[0:2], msgs[2:4]):  # two batches in one open transaction
            output.begin_batch(batch)
            output.send(topic, b"ranking", b"of " + (batch[0].value or b""))
            assert output.end_batch(True) == []
        assert output.open
        output.begin_batch(msgs[4:6])  # a third being ranked when the transaction is aborted
        assigned.discard((topic, 1))  # and a rebalance took partition 1 meanwhile: its new owner's now
        again = output.abort()
        assert [(m.partition, m.offset) for m in again] == [(m.partition, m.offset) for m in msgs if m.partition == 0]
        assert output.end_batch(True) == []  # the batch in flight came back with the rest: not produced
        assert output.aborted == 1 and not output.open
        assert output.abort() == []  # nothing is kept of a transaction once handed back
    finally:
        output.close()
        consumer.close()
