"""One frozen settings object, read once from the environment.

Every process (workers, CLI, tests) builds its connections from :class:`Settings`, so a
deployment changes one set of variables and nothing else. Secrets are kept out of ``repr``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

_N = TypeVar("_N", int, float)

#: Ports of the project's own local services. They are not the well-known 9092/6379 so that
#: ``leap services up`` never collides with a broker or server the user already runs.
LOCAL_KAFKA_PORT = 19092
LOCAL_KAFKA_CONTROLLER_PORT = 19093
LOCAL_REDIS_PORT = 16379
#: (broker, controller) ports of each node of the local three-broker cluster
#: (``leap services up --kafka-brokers 3``): apart from the single broker's, so both can run.
LOCAL_KAFKA_CLUSTER_PORTS = ((19192, 19193), (19194, 19195), (19196, 19197))
#: Ports of the local Redis Cluster's three masters (``leap services up --redis-cluster``).
LOCAL_REDIS_CLUSTER_PORTS = (17001, 17002, 17003)
#: (broker, controller) ports of the secured local broker and the TLS port of the secured local
#: redis-server (``leap services up --secure``): apart from the plain ones, so both can run.
LOCAL_SECURE_KAFKA_PORTS = (19292, 19293)
LOCAL_SECURE_REDIS_PORT = 16380

#: Seconds without a heartbeat after which the broker gives a worker's partitions to another: the
#: session timeout is how long rankings stop after a predictor dies, so it is short (the failover
#: figures are in docs/faults.md, "Figures"). Workers raise it to the broker's
#: ``group.min.session.timeout.ms`` (:func:`streams.topics.session_timeout`; Kafka's default is 6 s,
#: the brokers of ``leap services up`` allow 1 s); ``LEAP_KAFKA_SESSION_TIMEOUT`` changes it.
DEFAULT_KAFKA_SESSION_TIMEOUT = 2.0

#: Partitions of each event stream when ``LEAP_TOPIC_PARTITIONS`` is unset: a role's workers share
#: a topic by partitions, so this is how many workers can be added without repartitioning.
DEFAULT_TOPIC_PARTITIONS = 12

#: Archiver flush limits when ``LEAP_ARCHIVE_FLUSH_EVENTS`` / ``LEAP_ARCHIVE_FLUSH_SECONDS`` are unset.
DEFAULT_ARCHIVE_FLUSH_EVENTS = 10_000
DEFAULT_ARCHIVE_FLUSH_SECONDS = 300.0

#: Longest a predictor's transaction stays open while submissions keep arriving, seconds, when
#: ``LEAP_TRANSACTION_INTERVAL`` is unset (it commits at once when nothing more has arrived): a
#: commit per batch costs a round trip, so at high rates one transaction carries several batches
#: (docs/benchmarks.md, "Exactly-once rankings").
DEFAULT_TRANSACTION_INTERVAL = 0.05

#: How often a running predictor looks for changed price and operator hardware files, seconds, when
#: ``LEAP_CATALOGUE_RELOAD_INTERVAL`` is unset: a look costs two file stats between batches.
DEFAULT_CATALOGUE_RELOAD_INTERVAL = 30.0


#: Kafka client security settings and the variables that carry them.
KAFKA_SECURITY_VARS: tuple[tuple[str, str], ...] = (
    ("LEAP_KAFKA_SECURITY_PROTOCOL", "security.protocol"),
    ("LEAP_KAFKA_SASL_MECHANISM", "sasl.mechanism"),
    ("LEAP_KAFKA_SASL_USERNAME", "sasl.username"),
    ("LEAP_KAFKA_SASL_PASSWORD", "sasl.password"),
    ("LEAP_KAFKA_SSL_CAFILE", "ssl.ca.location"),
)


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Settings:
    """Connection and runtime settings.

    Parameters
    ----------
    kafka_bootstrap
        ``host:port[,host:port]`` of the Kafka cluster.
    redis_url
        ``redis://`` or ``rediss://`` URL of the online store.
    redis_ca_file
        CA certificates (PEM) that a ``rediss://`` server's certificate must chain to
        (``LEAP_REDIS_CA_FILE``); None: the system's trust store. See :meth:`redis_options`.
    home
        Folder for local service data, logs, the model registry and reports (git-ignored).
    key_prefix
        Prefix of every Redis key this deployment writes.
    kafka_security
        Extra librdkafka-style client settings (``security.protocol``, ``sasl.*``, ``ssl.*``),
        passed through to every Kafka client. Values are never logged.
    kafka_from_env, redis_from_env
        The broker / Redis was named by the environment: ``leap services up`` starts nothing for it.
    kafka_brokers
        Brokers of the local Kafka that ``leap services up`` runs (``LEAP_KAFKA_BROKERS``, 1 or 3);
        with 3 and no ``LEAP_KAFKA_BOOTSTRAP`` the bootstrap is the local cluster's three nodes and
        new topics get three replicas.
    topic_partitions
        Partitions of each event stream that ``leap topics create`` makes (``LEAP_TOPIC_PARTITIONS``);
        existing topics are left alone.
    topic_replication
        Replication factor of new topics (``LEAP_TOPIC_REPLICATION``; -1: the broker's default).
    topic_min_insync
        ``min.insync.replicas`` of new topics: replicas that must have a write before ``acks=all``
        succeeds; 0 leaves the broker's default. Derived: ``topic_replication - 1`` from 3 replicas.
    redis_cluster
        ``redis_url`` names a node of a Redis Cluster (``LEAP_REDIS_CLUSTER=1``); without
        ``LEAP_REDIS_URL`` it is the local cluster's first node.
    prices_file
        Optional CSV of hourly prices overriding the catalogue's list prices (``LEAP_PRICES_FILE``).
    hardware_file
        Optional TOML of the fleet's own parts and aliases added to the catalogue
        (``LEAP_HARDWARE_FILE``, :mod:`leap.core.operator_hardware`).
    archive_dir
        History archive folder (``LEAP_ARCHIVE_DIR``); None means ``home / "archive"``, see
        :attr:`archive_root`. Kept unresolved so that a copy with another ``home`` follows it.
    kafka_session_timeout
        Consumer group session timeout of the workers, seconds (``LEAP_KAFKA_SESSION_TIMEOUT``):
        how long a dead worker's partitions wait before another worker takes them (never less
        than the broker allows: :func:`streams.topics.session_timeout`).
    archive_flush_events, archive_flush_seconds
        The archiver writes a topic's buffer when it holds this many events or is this old
        (``LEAP_ARCHIVE_FLUSH_EVENTS``, ``LEAP_ARCHIVE_FLUSH_SECONDS``).
    exactly_once
        Predictors rank in Kafka transactions (``LEAP_EXACTLY_ONCE``, default 1): a ``read_committed``
        reader sees each submission ranked once, even after a crash. 0: at least once (a crash
        re-ranks what followed the last commit).
    transaction_interval
        Longest a predictor's transaction stays open while submissions keep arriving, seconds
        (``LEAP_TRANSACTION_INTERVAL``); 0: one transaction per batch.
    catalogue_reload_interval
        How often a running predictor re-reads ``prices_file`` and ``hardware_file`` when they
        changed, seconds (``LEAP_CATALOGUE_RELOAD_INTERVAL``, > 0).
    worker_id
        This worker's identity (``LEAP_WORKER_ID``): its transactional id, which its replacement
        must share to abort what it left open. Unset: this host's lowest free slot
        (:func:`predictor.transactions.worker_identity`).
    """

    kafka_bootstrap: str = f"127.0.0.1:{LOCAL_KAFKA_PORT}"
    redis_url: str = f"redis://127.0.0.1:{LOCAL_REDIS_PORT}/0"
    redis_ca_file: Path | None = None
    home: Path = field(default_factory=lambda: _repo_root() / ".leap")
    key_prefix: str = "leap"
    kafka_security: dict[str, str] = field(default_factory=dict, repr=False)
    kafka_from_env: bool = False
    redis_from_env: bool = False
    redis_cluster: bool = False
    kafka_brokers: int = 1
    topic_partitions: int = DEFAULT_TOPIC_PARTITIONS
    topic_replication: int = -1
    prices_file: Path | None = None
    hardware_file: Path | None = None
    archive_dir: Path | None = None
    archive_flush_events: int = DEFAULT_ARCHIVE_FLUSH_EVENTS
    archive_flush_seconds: float = DEFAULT_ARCHIVE_FLUSH_SECONDS
    kafka_session_timeout: float = DEFAULT_KAFKA_SESSION_TIMEOUT
    exactly_once: bool = True
    transaction_interval: float = DEFAULT_TRANSACTION_INTERVAL
    catalogue_reload_interval: float = DEFAULT_CATALOGUE_RELOAD_INTERVAL
    worker_id: str | None = None

    def __post_init__(self) -> None:
        if not self.transaction_interval >= 0:
            raise ValueError(f"LEAP_TRANSACTION_INTERVAL={self.transaction_interval!r} must be >= 0 (seconds)")
        if not self.catalogue_reload_interval > 0:
            raise ValueError(
                f"LEAP_CATALOGUE_RELOAD_INTERVAL={self.catalogue_reload_interval!r} must be > 0 (seconds)")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        """Build settings from ``LEAP_*`` environment variables."""
        env = dict(os.environ if env is None else env)
        security = {key: env[var] for var, key in KAFKA_SECURITY_VARS if env.get(var)}
        defaults = cls()
        cluster = _flag(env, "LEAP_REDIS_CLUSTER")
        brokers, default_bootstrap = _local_kafka(env, defaults)
        default_redis = f"redis://127.0.0.1:{LOCAL_REDIS_CLUSTER_PORTS[0]}/0" if cluster else defaults.redis_url
        return cls(
            kafka_bootstrap=env.get("LEAP_KAFKA_BOOTSTRAP") or default_bootstrap,
            kafka_brokers=brokers,
            redis_url=env.get("LEAP_REDIS_URL") or default_redis,
            redis_ca_file=Path(env["LEAP_REDIS_CA_FILE"]) if env.get("LEAP_REDIS_CA_FILE") else None,
            redis_cluster=cluster,
            topic_partitions=_number(env, "LEAP_TOPIC_PARTITIONS", int, defaults.topic_partitions),
            topic_replication=_number(env, "LEAP_TOPIC_REPLICATION", int, brokers if brokers > 1 else -1),
            home=Path(env["LEAP_HOME"]) if env.get("LEAP_HOME") else defaults.home,
            key_prefix=env.get("LEAP_KEY_PREFIX") or defaults.key_prefix,
            kafka_security=security,
            kafka_from_env=bool(env.get("LEAP_KAFKA_BOOTSTRAP")),
            redis_from_env=bool(env.get("LEAP_REDIS_URL")),
            prices_file=Path(env["LEAP_PRICES_FILE"]) if env.get("LEAP_PRICES_FILE") else None,
            hardware_file=Path(env["LEAP_HARDWARE_FILE"]) if env.get("LEAP_HARDWARE_FILE") else None,
            archive_dir=Path(env["LEAP_ARCHIVE_DIR"]) if env.get("LEAP_ARCHIVE_DIR") else None,
            archive_flush_events=_number(env, "LEAP_ARCHIVE_FLUSH_EVENTS", int, defaults.archive_flush_events),
            archive_flush_seconds=_number(env, "LEAP_ARCHIVE_FLUSH_SECONDS", float, defaults.archive_flush_seconds),
            kafka_session_timeout=_number(env, "LEAP_KAFKA_SESSION_TIMEOUT", float, defaults.kafka_session_timeout),
            exactly_once=_flag(env, "LEAP_EXACTLY_ONCE", default=True),
            transaction_interval=_number(env, "LEAP_TRANSACTION_INTERVAL", float, defaults.transaction_interval),
            catalogue_reload_interval=_number(env, "LEAP_CATALOGUE_RELOAD_INTERVAL", float,
                                              defaults.catalogue_reload_interval),
            worker_id=env.get("LEAP_WORKER_ID") or None,
        )

    def to_env(self) -> dict[str, str]:
        """The ``LEAP_*`` variables from which :meth:`from_env` rebuilds these settings (for child
        processes; secrets included, so never log the result)."""
        env = {
            "LEAP_KAFKA_BOOTSTRAP": self.kafka_bootstrap, "LEAP_REDIS_URL": self.redis_url,
            "LEAP_HOME": str(self.home), "LEAP_KEY_PREFIX": self.key_prefix,
            "LEAP_ARCHIVE_FLUSH_EVENTS": str(self.archive_flush_events),
            "LEAP_ARCHIVE_FLUSH_SECONDS": repr(self.archive_flush_seconds),
            "LEAP_KAFKA_SESSION_TIMEOUT": repr(self.kafka_session_timeout),
        }
        if self.redis_cluster:
            env["LEAP_REDIS_CLUSTER"] = "1"
        if not self.exactly_once:
            env["LEAP_EXACTLY_ONCE"] = "0"
        if self.transaction_interval != DEFAULT_TRANSACTION_INTERVAL:
            env["LEAP_TRANSACTION_INTERVAL"] = repr(self.transaction_interval)
        if self.catalogue_reload_interval != DEFAULT_CATALOGUE_RELOAD_INTERVAL:
            env["LEAP_CATALOGUE_RELOAD_INTERVAL"] = repr(self.catalogue_reload_interval)
        if self.worker_id is not None:
            env["LEAP_WORKER_ID"] = self.worker_id
        if self.kafka_brokers != 1:
            env["LEAP_KAFKA_BROKERS"] = str(self.kafka_brokers)
        if self.topic_partitions != DEFAULT_TOPIC_PARTITIONS:
            env["LEAP_TOPIC_PARTITIONS"] = str(self.topic_partitions)
        if self.topic_replication != -1:
            env["LEAP_TOPIC_REPLICATION"] = str(self.topic_replication)
        env.update({var: self.kafka_security[key] for var, key in KAFKA_SECURITY_VARS if key in self.kafka_security})
        if self.redis_ca_file is not None:
            env["LEAP_REDIS_CA_FILE"] = str(self.redis_ca_file)
        if self.prices_file is not None:
            env["LEAP_PRICES_FILE"] = str(self.prices_file)
        if self.hardware_file is not None:
            env["LEAP_HARDWARE_FILE"] = str(self.hardware_file)
        if self.archive_dir is not None:
            env["LEAP_ARCHIVE_DIR"] = str(self.archive_dir)
        return env

    def __repr__(self) -> str:
        # the dataclass's own repr, but the Redis URL's password redacted (kafka_security is left out)
        shown = (f"{f.name}={redact(self.redis_url) if f.name == 'redis_url' else getattr(self, f.name)!r}"
                 for f in fields(self) if f.repr)
        return f"Settings({', '.join(shown)})"

    @property
    def topic_min_insync(self) -> int:
        return self.topic_replication - 1 if self.topic_replication >= 3 else 0

    @property
    def registry_dir(self) -> Path:
        return self.home / "registry"

    @property
    def compiled_dir(self) -> Path:
        """Where served models' trees are compiled to (:mod:`predictor.compiled`), shared by a host's workers."""
        return self.home / "compiled"

    @property
    def row_cache_dir(self) -> Path:
        """Where the nightly trainer keeps its rows' checkpoint (:mod:`leap.training.row_cache`)."""
        return self.home / "row-cache"

    @property
    def archive_root(self) -> Path:
        """The history archive folder: ``archive_dir`` if set, else ``home / "archive"``."""
        return self.archive_dir if self.archive_dir is not None else self.home / "archive"

    def redis_options(self) -> dict[str, Any]:
        """Keyword arguments of redis-py's ``from_url`` beyond the URL: the CA file of a ``rediss://``
        server (a plain ``redis://`` connection takes no TLS arguments)."""
        if self.redis_ca_file is None or not self.redis_url.startswith("rediss://"):
            return {}
        return {"ssl_ca_certs": str(self.redis_ca_file)}

    def confluent_config(self, **extra: Any) -> dict[str, Any]:
        """librdkafka configuration for confluent-kafka clients."""
        conf: dict[str, Any] = {"bootstrap.servers": self.kafka_bootstrap}
        conf.update(self.kafka_security)
        conf.update(extra)
        return conf


def _local_kafka(env: dict[str, str], defaults: Settings) -> tuple[int, str]:
    """``LEAP_KAFKA_BROKERS`` and the bootstrap of that many local brokers."""
    brokers = _number(env, "LEAP_KAFKA_BROKERS", int, defaults.kafka_brokers)
    cluster = len(LOCAL_KAFKA_CLUSTER_PORTS)
    if brokers not in (1, cluster):
        raise ValueError(f"LEAP_KAFKA_BROKERS={brokers} is not supported: use 1 or {cluster}")
    if brokers == 1:
        return brokers, defaults.kafka_bootstrap
    return brokers, ",".join(f"127.0.0.1:{port}" for port, _ in LOCAL_KAFKA_CLUSTER_PORTS)


def _flag(env: dict[str, str], var: str, default: bool = False) -> bool:
    """A yes/no variable (1/true/yes or 0/false/no; unset: ``default``); anything else names the variable."""
    raw = env.get(var, "").strip().lower()
    if raw == "":
        return default
    if raw in ("0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise ValueError(f"{var}={env[var]!r} is not a yes/no value (use 1 or 0)")


def _number(env: dict[str, str], var: str, kind: type[_N], default: _N) -> _N:
    """A numeric variable, or ``default`` when unset or empty; a bad value names the variable."""
    raw = env.get(var)
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{var}={raw!r} is not a valid {kind.__name__}") from None


def redact(url: str) -> str:
    """A URL with any password replaced, for logs and status output."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else f"{scheme}://{user}@{host}"
