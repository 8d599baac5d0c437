"""librdkafka's log and errors through Python logging, without a line per failed reconnect.

By default librdkafka writes to stderr, and during a broker outage it writes a connect failure
per attempt and per client (1,274 lines in 31 s in a predictor's log). Clients made with
:func:`client_logging` instead:

- log through the ``leap.librdkafka`` logger (levels mapped by confluent-kafka), except its
  ``FAIL`` / ``ERROR`` lines, which repeat what the error callback is told, and a line it repeats
  within :data:`REPEAT_S` (a transactional producer retrying ``Not coordinator`` while a fresh
  broker loads its transaction log wrote the same line dozens of times a second);
- report an unreachable broker (``_TRANSPORT``, ``_ALL_BROKERS_DOWN``, a failed name lookup) as
  :data:`streams.resilience.KAFKA` being down: one ``kafka is unavailable`` line, and one
  ``kafka is back after N s`` once the client's owner sees it work again
  (:meth:`streams.resilience.Dependency.mark_up`); any other error is logged as a warning.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError

from streams.resilience import KAFKA

LIBRDKAFKA = logging.getLogger("leap.librdkafka")
log = logging.getLogger("leap.kafka")

#: librdkafka log facilities whose lines the error callback also gets (the flood of an outage).
REPEATED_BY_ERROR_CB = frozenset({"FAIL", "ERROR"})
#: Error codes that say the broker cannot be reached, not that a request is wrong.
UNREACHABLE = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE,
                         KafkaError._TIMED_OUT, KafkaError.NETWORK_EXCEPTION})


#: A librdkafka line seen again within this many seconds is dropped.
REPEAT_S = 60.0


class _NotRepeated(logging.Filter):
    """Drops librdkafka lines of :data:`REPEATED_BY_ERROR_CB` facilities, and repeats (:data:`REPEAT_S`)."""

    def __init__(self) -> None:
        super().__init__()
        self.last_seen: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if args and str(args[0]) in REPEATED_BY_ERROR_CB:
            return False
        text = record.getMessage()
        seen = self.last_seen.get(text)
        if seen is not None and record.created - seen < REPEAT_S:
            return False
        if len(self.last_seen) > 1000:  # many distinct lines: forget them rather than grow
            self.last_seen.clear()
        self.last_seen[text] = record.created
        return True


LIBRDKAFKA.addFilter(_NotRepeated())


class KafkaUnreachable(Exception):
    """What :data:`streams.resilience.KAFKA` reports as the reason of an outage."""


def on_client_error(err: KafkaError) -> None:
    """librdkafka's ``error_cb``: an unreachable broker marks Kafka down (said once), the rest is logged."""
    if err.code() in UNREACHABLE:
        KAFKA.mark_down(KafkaUnreachable(err.str()))
    else:
        log.warning("kafka client error: %s", err.str())


def client_logging() -> dict[str, Any]:
    """Configuration entries that route a confluent-kafka client's log and errors as above."""
    return {"logger": LIBRDKAFKA, "error_cb": on_client_error}
