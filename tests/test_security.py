"""Security in CI: a real worker and the scheduler client on Kafka with a SASL_SSL (SCRAM-SHA-512)
listener and a TLS-only redis-server with ACL users, both started by :mod:`leap.services.secure` with
generated certificates and passwords, and connected only through the ``LEAP_*`` settings.

The stack is PRIVATE (its own folder and free ports), never the shared broker or redis-server.
Refusals are checked by their reason (an authentication or TLS failure), not only by a timeout.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import ssl
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from features.store import _lua as store_lua
from features.store import open_store, redis_client
from leap.core.settings import Settings
from leap.services.kafka import KAFKA_VERSION
from leap.services.processes import ROOT
from leap.services.secure import (
    KAFKA_ACLS,
    REDIS_ACL_COMMANDS,
    SecureStack,
    new_stack,
    secure_pids,
    start_secure_stack,
    stop_secure_stack,
)
from leap.services.workers import WorkerProcess, worker_env
from streams.client import SchedulerClient
from streams.topics import create_topics
from tests.conftest import wait_until_ranking
from tests.factories import T0, finish, free_port, submission

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Secured:
    stack: SecureStack
    settings: Settings
    start_s: float

    @property
    def secrets(self) -> tuple[str, ...]:
        return self.stack.kafka_password, self.stack.broker_password, self.stack.redis_password


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = Settings.from_env()  # the shared home: the broker's jars are cached there
    folder = tmp_path_factory.mktemp("secure") / "stack"
    stack = new_stack(folder, ports=(free_port(), free_port(), free_port()))
    t0 = time.monotonic()
    try:
        settings = start_secure_stack(base, stack)
        start_s = time.monotonic() - t0
        create_topics(settings)
        home = folder.parent / "home"  # the worker's own registry and Faust folder
        yield Secured(stack, replace(settings, home=home), start_s)
    finally:
        stop_secure_stack(base, folder)
    assert secure_pids(base, folder) == (None, None)


# ---------------------------------------------------------------- refusals


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _kafka_errors(settings: Settings, **security: str) -> str:
    """What librdkafka logs while a metadata request with ``security`` changed fails ('' if it
    is answered): the reason of a refusal, where the exception only says "transport failure"."""
    collect = _Collect()
    logger = logging.getLogger(f"tests.security.rdkafka.{uuid.uuid4().hex}")
    logger.addHandler(collect)
    logger.propagate = False
    conf: dict[str, Any] = settings.confluent_config(**security)
    conf["logger"] = logger
    admin = AdminClient(conf)
    deadline, failure = time.monotonic() + 6, ""
    while time.monotonic() < deadline and not collect.lines:
        try:
            admin.list_topics(timeout=1)
            return ""
        except KafkaException as exc:
            failure = str(exc)
        admin.poll(0.2)  # the log lines wait in the client's queue until it is served
    return " | ".join([*collect.lines, failure])


def test_kafka_refuses_a_wrong_password_plaintext_and_an_unknown_ca(secured: Secured) -> None:
    settings = secured.settings
    assert _kafka_errors(settings) == ""
    wrong = _kafka_errors(settings, **{"sasl.password": "not-the-password"})
    assert "Authentication failed" in wrong and "SCRAM-SHA-512" in wrong, wrong
    unknown_user = _kafka_errors(settings, **{"sasl.username": "mallory"})
    assert "Authentication failed" in unknown_user, unknown_user
    # no TLS: the listener only speaks TLS, so no request is ever answered...
    plain = _kafka_errors(settings, **{"security.protocol": "SASL_PLAINTEXT"})
    assert "Failed to get metadata" in plain, plain
    # ...not even ApiVersions, which the same bytes in TLS get an answer to (before any SASL)
    request = _api_versions_request()
    with socket.create_connection(("127.0.0.1", secured.stack.kafka_port), timeout=10) as raw:
        raw.sendall(request)
        reply = _read_all(raw)
    # nothing, or one TLS alert record (content type 21) before the broker closes: never a Kafka reply
    assert reply == b"" or (reply[:2] == b"\x15\x03" and len(reply) == 7), reply
    context = ssl.create_default_context(cafile=str(secured.stack.certs.ca))
    with socket.create_connection(("127.0.0.1", secured.stack.kafka_port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall(request)
        size, correlation = struct.unpack(">ii", tls.recv(8))
        assert size > 4 and correlation == 7
    # the broker's certificate is trusted only through the stack's CA, not the system's store
    other_ca = _kafka_errors(settings, **{"ssl.ca.location": "/etc/ssl/certs/ca-certificates.crt"})
    assert "certificate verify failed" in other_ca, other_ca


def test_the_kafka_user_may_use_leaps_topics_and_groups_only(secured: Secured) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AclBinding, NewTopic

    admin = AdminClient(secured.settings.confluent_config())
    # LEAP's topics were created by the user itself (create_topics in the fixture); others are not its own
    assert {"leap.submissions", "leap.rankings"} <= set(admin.list_topics(timeout=10).topics)
    future = admin.create_topics([NewTopic(f"other.{uuid.uuid4().hex[:6]}", 1, 1)])
    with pytest.raises(KafkaException) as refused:
        next(iter(future.values())).result(30)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # nor may it grant itself more
    more = AclBinding("TOPIC", "*", "LITERAL", "User:leap", "*", "ALL", "ALLOW")
    with pytest.raises(KafkaException) as refused:
        next(iter(admin.create_acls([more], request_timeout=30).values())).result(30)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def _api_versions_request() -> bytes:
    """A Kafka ApiVersions v0 request (key 18), correlation id 7."""
    client = b"leap-test"
    body = struct.pack(">hhih", 18, 0, 7, len(client)) + client
    return struct.pack(">i", len(body)) + body


def _read_all(sock: socket.socket) -> bytes:
    """What the peer sends until it closes (a reset counts as closing)."""
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def test_the_controller_listener_wants_a_client_certificate(secured: Secured) -> None:
    context = ssl.create_default_context(cafile=str(secured.stack.certs.ca))
    with socket.create_connection(("127.0.0.1", secured.stack.controller_port), timeout=10) as raw, \
            pytest.raises(ssl.SSLError, match=r"(?i)certificate"), \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall(b"\x00\x00\x00\x00")
        tls.recv(10)  # TLS 1.3: the server's refusal of no certificate arrives here


def test_redis_refuses_a_wrong_password_no_tls_and_the_default_user(secured: Secured) -> None:
    stack, settings = secured.stack, secured.settings
    client = redis_client(settings)
    assert client.ping()
    tls = settings.redis_options()
    wrong = redis.Redis.from_url(settings.redis_url.replace(stack.redis_password, "not-the-password"), **tls)
    with pytest.raises(redis.AuthenticationError):
        wrong.ping()
    anonymous = redis.Redis.from_url(f"rediss://127.0.0.1:{stack.redis_port}/0", **tls)  # the default user
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    plain = redis.Redis.from_url(f"redis://leap:{stack.redis_password}@127.0.0.1:{stack.redis_port}/0",
                                 socket_timeout=5, socket_connect_timeout=5)
    with pytest.raises(redis.ConnectionError):
        plain.ping()
    untrusted = redis.Redis.from_url(settings.redis_url, socket_timeout=5)  # the system's CAs only
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        untrusted.ping()


def test_the_acl_user_has_the_stores_commands_on_its_keys_only(secured: Secured) -> None:
    client = redis_client(secured.settings)
    for command in (("FLUSHALL",), ("CONFIG", "GET", "dir"), ("KEYS", "*"), ("SET", "leap:x", "1"),
                    ("HSET", "other:x", "f", "1"), ("EVAL", "return 1", "0")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command(*command)


def test_the_acl_user_may_run_every_command_the_store_sends_and_the_docs_list_them() -> None:
    sent = set(re.findall(r'_Command\(\("(\w+)"', (ROOT / "features" / "redis_batch.py").read_text()))
    scripts = [p.stem for p in (ROOT / "features" / "lua").glob("*.lua") if p.stem != "window"]
    called = {c for name in scripts for c in re.findall(r"redis\.p?call\('(\w+)'", store_lua(name))}
    allowed = {c.split("|")[0].upper() for c in REDIS_ACL_COMMANDS}
    assert {"EVALSHA", "HGETALL"} <= sent and {"HSET", "SADD"} <= called
    assert sent | called | {"SCRIPT"} <= allowed, (sent | called) - allowed
    docs = (ROOT / "docs" / "security.md").read_text()
    missing = [c for c in REDIS_ACL_COMMANDS if f"`{c.replace('|', ' ').upper()}`" not in docs]
    assert not missing and " ".join(f"+{c}" for c in REDIS_ACL_COMMANDS) in docs, missing
    for kind, prefix, operations in KAFKA_ACLS:
        row = f"| `{kind}` | `{prefix}*` (prefixed) | {', '.join(f'`{op}`' for op in operations)} |"
        assert row in docs, row


# ---------------------------------------------------------------- a worker and the scheduler client


def test_worker_and_scheduler_client_through_the_secured_stack(secured: Secured) -> None:
    settings, run = secured.settings, uuid.uuid4().hex[:8]
    print(f"secured stack started in {secured.start_s:.1f} s")
    log_path = settings.home / "worker.log"
    worker = WorkerProcess(settings, "all", log_path)
    try:
        wait_until_ranking(settings, worker, timeout=150)
        job = f"sec-{run}"
        done = finish(job, f"fin-{run}", T0 + 10, "H100-SXM", 1200.0)
        store = open_store(settings)
        sub = submission(job, 1, event_time=T0 + 20)
        with SchedulerClient(settings) as client:
            client.publish_finish(done)
            client.flush()
            deadline = time.monotonic() + 60
            while "H100-SXM" not in store.read([sub])[0].prior and time.monotonic() < deadline:
                time.sleep(0.2)
            assert "H100-SXM" in store.read([sub])[0].prior, worker.log_tail()
            client.publish(sub)
            client.flush()
            got = client.wait_for([sub.attempt_id], timeout=60)
        assert sub.attempt_id in got, worker.log_tail()
        ranking, _ = got[sub.attempt_id]
        assert ranking.features_used == store.read([sub])[0].to_json()
        assert {c["hardware"] for c in ranking.candidates} == set(sub.candidates)
        assert worker.alive(), worker.log_tail()
    finally:
        worker.stop()
    _assert_no_secret(secured, log_path.read_text(errors="replace"), "the worker's log")
    status = subprocess.run([sys.executable, "-m", "leap.cli", "services", "status", "--json"], cwd=ROOT,
                            env=worker_env(settings), capture_output=True, text=True, timeout=120, check=False)
    assert status.returncode == 0, status.stdout + status.stderr
    assert json.loads(status.stdout)["redis"]["url"].startswith("rediss://leap:***@")
    assert json.loads(status.stdout)["kafka"]["version"] == KAFKA_VERSION  # the secured broker's, not "unknown"
    _assert_no_secret(secured, status.stdout + status.stderr, "leap services status")
    for log in sorted(secured.stack.folder.glob("*/logs/*")):
        _assert_no_secret(secured, log.read_text(errors="replace"), str(log))


def _assert_no_secret(secured: Secured, text: str, where: str) -> None:
    leaked = [i for i, secret in enumerate(secured.secrets) if secret in text]
    assert not leaked, f"{where} holds secret(s) {leaked}"


def test_the_secrets_live_only_in_files_of_the_owner(secured: Secured) -> None:
    folder = secured.stack.folder
    assert folder.stat().st_mode & 0o077 == 0
    assert secured.stack.env_file.stat().st_mode & 0o077 == 0
    # (Kafka's preallocated offset indexes hold offsets only, and 10 MB of zeros each: skipped)
    holders = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                     if p.is_file() and p.suffix not in (".index", ".timeindex")
                     and any(s.encode() in p.read_bytes() for s in secured.secrets))
    # the broker's own SCRAM password in its configuration, the clients' in the env file; Redis keeps
    # a SHA-256 of its password, and the storage format's argument file is gone
    assert holders == ["kafka/config/server.properties", "secure.env"], holders
    private = [*holders, "redis/redis.conf", "tls/server.key", "tls/server.pem"]
    assert {name: (folder / name).stat().st_mode & 0o077 for name in private} == dict.fromkeys(private, 0)
    assert not Path(folder / "kafka" / "config" / "format.args").exists()
