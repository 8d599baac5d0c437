"""A secured local stack beside the shared plain one: ``leap services up --secure``.

Kafka
    A private single-node KRaft broker whose only client listener is ``SASL_SSL`` with
    ``SCRAM-SHA-512``. Its SCRAM users are created when the storage is formatted
    (``--add-scram``); its controller listener is TLS with client certificates, so only a holder of
    a certificate of the stack's CA (the broker itself) reaches the controller. Its authorizer lets
    the client user do only what :data:`KAFKA_ACLS` grants.
Redis
    A private ``redis-server`` that speaks TLS only (``port 0``), with the ``default`` user off and
    one ACL user that may run the store's commands (:data:`REDIS_ACL_COMMANDS`) on the deployment's
    keys only.

Both use certificates of a throwaway CA that ``openssl`` generates into the stack's folder (mode
0700), and passwords generated on every start; the configuration holds the Redis password only as
its SHA-256. The folder's ``secure.env`` carries the ``LEAP_*`` variables that point a worker or a
client at the stack (``set -a; . secure.env``); nothing prints a secret.
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path

from leap.core.settings import LOCAL_SECURE_KAFKA_PORTS, LOCAL_SECURE_REDIS_PORT, Settings
from leap.services.kafka import (
    KAFKA_START_TIMEOUT,
    KafkaNode,
    local_kafka_pid,
    start_local_kafka,
    stop_local_kafka,
    wait_for_kafka,
)
from leap.services.kafka_cluster import CLUSTER_HEAP
from leap.services.processes import (
    HOST,
    ServiceError,
    Step,
    owned_pid,
    refuse_taken_ports,
    services_dir,
    stop_owned,
    write_private,
)
from leap.services.redis_server import REDIS_START_TIMEOUT, spawn_redis, wait_for_redis

SCRAM_MECHANISM = "SCRAM-SHA-512"
#: The client user of both services; the broker authenticates to itself as another.
USER = "leap"
BROKER_USER = "broker"
CERT_DAYS = 30

#: What the client user may do on the broker, whose authorizer refuses everything else: LEAP's
#: topics (``leap.*``) and consumer groups (``leap-*``), by prefix; nothing on the cluster itself.
#: (resource type, name prefix, operations)
KAFKA_ACLS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("TOPIC", "leap.", ("DESCRIBE", "READ", "WRITE", "CREATE")),
    ("GROUP", "leap-", ("DESCRIBE", "READ")),
    # the predictors' transactions (predictor/transactions.py: transactional ids leap-predictor-...)
    ("TRANSACTIONAL_ID", "leap-", ("DESCRIBE", "WRITE")),
)

#: Commands the store's ACL user may run. Its clients send EVALSHA (every update, by SHA), SCRIPT
#: LOAD (after a NOSCRIPT reply), HGETALL and HMGET (batched reads), UNLINK and SCAN (clearing a
#: replay's scratch prefix), PING (health checks) and INFO (the version ``leap services status``
#: shows). Lua scripts run with their caller's rights, so what features/lua/*.lua call is listed
#: too: HGET, HSET, HINCRBY, SADD, SISMEMBER, EXPIRE.
REDIS_ACL_COMMANDS = (
    "evalsha", "script|load", "hgetall", "hmget", "unlink", "scan", "ping", "info",
    "hget", "hset", "hincrby", "sadd", "sismember", "expire",
)


@dataclass(frozen=True)
class Certificates:
    """PEM files of the stack's throwaway CA and of the one server certificate both services use."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def cert(self) -> Path:
        return self.folder / "server.crt"

    @property
    def key(self) -> Path:
        return self.folder / "server.key"

    @property
    def keystore(self) -> Path:
        """Key and certificate in one PEM file: Kafka's ``ssl.keystore.type=PEM``."""
        return self.folder / "server.pem"


def make_certificates(folder: Path, days: int = CERT_DAYS) -> Certificates:
    """A new CA and a server certificate for ``127.0.0.1`` and ``localhost`` signed by it.

    The server certificate also serves as the broker's client certificate on its controller
    listener (extended key usage ``serverAuth, clientAuth``). Keys are P-256 (fast to make) in
    PKCS#8, which Kafka's PEM keystore requires; the CA's key is deleted once it has signed.
    """
    certs = Certificates(folder)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca_key, csr, ext = folder / "ca.key", folder / "server.csr", folder / "server.ext"
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                   "extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *key, "-keyout", str(ca_key), "-out", str(certs.ca), "-days", str(days),
             "-subj", "/CN=LEAP local test CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _openssl("req", "-new", *key, "-keyout", str(certs.key), "-out", str(csr), "-subj", "/CN=localhost")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(certs.ca), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(certs.cert), "-days", str(days), "-extfile", str(ext))
    write_private(certs.keystore, certs.key.read_text() + certs.cert.read_text())  # it holds the key
    for temporary in (ca_key, csr, ext, folder / "ca.srl"):
        temporary.unlink(missing_ok=True)
    return certs


def _openssl(*args: str) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise ServiceError("openssl is not installed (Debian: apt-get install -y openssl); the secured stack "
                           "generates its test certificates with it")
    # umask 077: the keys it writes are the owner's alone from the start, whatever the caller's umask
    run = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, check=False, umask=0o077)
    if run.returncode != 0:
        raise ServiceError(f"openssl {args[0]} failed:\n{run.stderr[-2000:]}")


@dataclass(frozen=True)
class SecureStack:
    """Where the secured stack runs and the passwords of this start (kept out of ``repr``)."""

    folder: Path
    kafka_port: int = LOCAL_SECURE_KAFKA_PORTS[0]
    controller_port: int = LOCAL_SECURE_KAFKA_PORTS[1]
    redis_port: int = LOCAL_SECURE_REDIS_PORT
    key_prefix: str = "leap"
    kafka_password: str = field(default="", repr=False)
    broker_password: str = field(default="", repr=False)
    redis_password: str = field(default="", repr=False)

    @property
    def certs(self) -> Certificates:
        return Certificates(self.folder / "tls")

    @property
    def env_file(self) -> Path:
        return self.folder / "secure.env"

    @property
    def node(self) -> KafkaNode:
        """The broker: the plain single node's configuration with a SASL_SSL listener in place of
        PLAINTEXT and an mTLS controller listener (:func:`kafka_overrides`)."""
        return KafkaNode(port=self.kafka_port, controller_port=self.controller_port, home=self.folder / "kafka",
                         heap=CLUSTER_HEAP, overrides=kafka_overrides(self), scram=(
                             f"{SCRAM_MECHANISM}=[name={USER},password={self.kafka_password}]",
                             f"{SCRAM_MECHANISM}=[name={BROKER_USER},password={self.broker_password}]"))

    def settings(self, base: Settings) -> Settings:
        """``base`` pointed at this stack, through the same fields the ``LEAP_*`` variables set."""
        security = {
            "security.protocol": "SASL_SSL", "sasl.mechanism": SCRAM_MECHANISM, "sasl.username": USER,
            "sasl.password": self.kafka_password, "ssl.ca.location": str(self.certs.ca),
        }
        return replace(
            base, kafka_bootstrap=f"{HOST}:{self.kafka_port}", kafka_from_env=True, kafka_brokers=1,
            topic_replication=-1,  # one broker
            redis_url=f"rediss://{USER}:{self.redis_password}@{HOST}:{self.redis_port}/0", redis_from_env=True,
            redis_cluster=False, redis_ca_file=self.certs.ca, kafka_security=security, key_prefix=self.key_prefix,
        )


def kafka_overrides(stack: SecureStack) -> tuple[tuple[str, str], ...]:
    """server.properties entries of the secured broker (replacing the plain node's listeners)."""
    listeners = f"SASL_SSL://{HOST}:{stack.kafka_port},CONTROLLER://{HOST}:{stack.controller_port}"
    jaas = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{BROKER_USER}" password="{stack.broker_password}";')
    return (
        ("listeners", listeners),
        ("advertised.listeners", listeners),
        ("inter.broker.listener.name", "SASL_SSL"),
        ("listener.security.protocol.map", "CONTROLLER:SSL,SASL_SSL:SASL_SSL"),
        ("sasl.enabled.mechanisms", SCRAM_MECHANISM),
        ("sasl.mechanism.inter.broker.protocol", SCRAM_MECHANISM),
        (f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config", jaas),
        ("ssl.keystore.type", "PEM"),
        ("ssl.keystore.location", str(stack.certs.keystore)),
        ("ssl.truststore.type", "PEM"),
        ("ssl.truststore.location", str(stack.certs.ca)),
        # the controller answers only a client certificate of this CA: the broker's own
        ("listener.name.controller.ssl.client.auth", "required"),
        # an authenticated client may do only what KAFKA_ACLS grants it; the broker (its SCRAM user
        # between brokers, its certificate's name on the controller listener) may do everything
        ("authorizer.class.name", "org.apache.kafka.metadata.authorizer.StandardAuthorizer"),
        ("super.users", f"User:{BROKER_USER};User:CN=localhost"),
    )


def redis_conf(stack: SecureStack) -> str:
    """The secured redis-server's configuration: TLS only, ``default`` off, one ACL user."""
    certs, folder = stack.certs, stack.folder / "redis"
    digest = hashlib.sha256(stack.redis_password.encode()).hexdigest()
    commands = " ".join(f"+{c}" for c in REDIS_ACL_COMMANDS)
    return f"""# Generated by leap.services.secure on every start; edits are overwritten.
bind {HOST}
port 0
tls-port {stack.redis_port}
tls-cert-file {certs.cert}
tls-key-file {certs.key}
tls-ca-cert-file {certs.ca}
# clients prove who they are with an ACL password, not a certificate
tls-auth-clients no
protected-mode yes
daemonize no
dir {folder / "data"}
logfile {folder / "logs" / "redis.log"}
appendonly yes
appendfsync everysec
# no connection may act as the default user; leap holds the store's commands on its own keys
user default reset
user {USER} reset on #{digest} ~{stack.key_prefix}:* {commands}
"""


def secure_home(settings: Settings) -> Path:
    """The folder of ``leap services up --secure``."""
    return services_dir(settings) / "secure"


def new_stack(folder: Path, *, key_prefix: str = "leap", ports: tuple[int, int, int] | None = None) -> SecureStack:
    """A stack description with fresh passwords (on the fixed local ports unless ``ports`` says otherwise)."""
    kafka, controller, redis_port = ports or (*LOCAL_SECURE_KAFKA_PORTS, LOCAL_SECURE_REDIS_PORT)
    return SecureStack(folder, kafka, controller, redis_port, key_prefix, kafka_password=secrets.token_hex(24),
                       broker_password=secrets.token_hex(24), redis_password=secrets.token_hex(24))


def secure_pids(base: Settings, folder: Path) -> tuple[int | None, int | None]:
    """(broker, redis-server) pids of the secured stack in ``folder`` that still run."""
    return (local_kafka_pid(base, KafkaNode(home=folder / "kafka")),
            owned_pid(folder / "redis" / "redis.pid", folder))


def start_secure_stack(base: Settings, stack: SecureStack, step: Step | None = None) -> Settings:
    """Start the secured broker and redis-server of ``stack`` from scratch and wait until both
    answer through TLS and their users; returns the settings that reach them.

    The folder is emptied first: every start has new certificates, passwords and data.

    Raises
    ------
    ServiceError
        If a part of it still runs, a port is taken, or a service does not come up.
    """
    say: Step = step or (lambda _msg: None)
    if any(pid is not None for pid in secure_pids(base, stack.folder)):
        raise ServiceError(f"the secured stack in {stack.folder} runs already; stop it first")
    ports = (stack.kafka_port, stack.controller_port, stack.redis_port)
    refuse_taken_ports(ports, stack.folder / "kafka" / "kafka.pid", "choose other ports")
    shutil.rmtree(stack.folder, ignore_errors=True)
    stack.folder.mkdir(parents=True, mode=0o700)
    say("generating test certificates")
    make_certificates(stack.certs.folder)
    settings = stack.settings(base)
    _, kafka_pid = start_local_kafka(base, say, stack.node)
    redis_pid = _start_redis(stack, say)
    say("waiting for the secured Redis")
    wait_for_redis(settings, REDIS_START_TIMEOUT, redis_pid, stack.folder / "redis")
    say("waiting for the secured Kafka")
    wait_for_kafka(settings, KAFKA_START_TIMEOUT, kafka_pid, stack.node.home)
    grant_kafka_acls(stack, settings)
    write_env_file(stack, settings)
    return settings


def grant_kafka_acls(stack: SecureStack, settings: Settings, timeout: float = 30.0) -> None:
    """Create :data:`KAFKA_ACLS` for the client user, as the broker's own (super) user."""
    from confluent_kafka.admin import AclBinding, AdminClient

    admin_security = {**settings.kafka_security, "sasl.username": BROKER_USER, "sasl.password": stack.broker_password}
    # log_level 4: no notice that the short-lived client drops its queue on exit
    admin = AdminClient({**settings.confluent_config(), **admin_security, "log_level": 4})
    bindings = [AclBinding(kind, prefix, "PREFIXED", f"User:{USER}", "*", operation, "ALLOW")
                for kind, prefix, operations in KAFKA_ACLS for operation in operations]
    for future in admin.create_acls(bindings, request_timeout=timeout).values():
        future.result(timeout)


def _start_redis(stack: SecureStack, say: Step) -> int:
    folder = stack.folder / "redis"
    say(f"starting redis-server with TLS on {HOST}:{stack.redis_port}")
    folder.mkdir(parents=True, exist_ok=True)
    return spawn_redis(folder, redis_conf(stack), folder / "redis.pid")


def write_env_file(stack: SecureStack, settings: Settings) -> None:
    """``secure.env``: the ``LEAP_*`` variables of ``settings`` that differ from the plain stack's,
    readable by the owner only (it holds the passwords)."""
    names = ("LEAP_KAFKA_BOOTSTRAP", "LEAP_REDIS_URL", "LEAP_REDIS_CA_FILE", "LEAP_KAFKA_SECURITY_PROTOCOL",
             "LEAP_KAFKA_SASL_MECHANISM", "LEAP_KAFKA_SASL_USERNAME", "LEAP_KAFKA_SASL_PASSWORD",
             "LEAP_KAFKA_SSL_CAFILE")
    env = settings.to_env()
    write_private(stack.env_file, "# LEAP_* settings of the secured local stack (leap services up --secure)\n"
                  + "".join(f"{name}={env[name]}\n" for name in names))


def stop_secure_stack(base: Settings, folder: Path) -> str:
    """Stop the secured stack in ``folder``: ``stopped`` if any part ran, else ``not running``."""
    states = [stop_local_kafka(base, KafkaNode(home=folder / "kafka")),
              stop_owned(folder / "redis" / "redis.pid", folder)]
    return "stopped" if any(s in ("stopped", "killed") for s in states) else "not running"
