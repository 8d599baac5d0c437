"""A local single-node Apache Kafka broker in KRaft mode, and the one pin of its version.

The broker is a JVM process (Java 17 or newer) started from the ``kafka_2.13`` jars that Maven
resolves from Maven Central or, without Maven, from the official Apache release tarball (checked
against its SHA-512). Its jars, configuration, data, logs and pid file live under
``services_dir(settings) / "kafka"``; ``leap.services.stack`` decides whether it runs at all.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tarfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leap.core.settings import LOCAL_KAFKA_CONTROLLER_PORT, LOCAL_KAFKA_PORT, Settings
from leap.services.processes import (
    HOST,
    ServiceError,
    Step,
    log_tail,
    owned_pid,
    pid_alive,
    refuse_taken_ports,
    services_dir,
    spawn,
    stop_owned,
    write_private,
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

_TARBALL_MIRRORS = (
    "https://downloads.apache.org/kafka",
    "https://archive.apache.org/dist/kafka",
)

# librdkafka reports every refused connection while a broker starts; those are expected while
# waiting, and the real failure is reported by our own timeout message instead.
_QUIET_LOG = logging.getLogger(f"{__name__}.librdkafka")
_QUIET_LOG.addHandler(logging.NullHandler())
_QUIET_LOG.propagate = False


@dataclass(frozen=True)
class KafkaNode:
    """Where one local broker listens and keeps its configuration, data, logs and pid file.

    The default is the broker of ``leap services up``. Another (the fault tests restart a
    private broker, never the shared one) takes free ports and its own folder; the jars are
    always the ones cached under the settings' home.
    """

    port: int = LOCAL_KAFKA_PORT
    controller_port: int = LOCAL_KAFKA_CONTROLLER_PORT
    home: Path | None = None  # None: kafka_home(settings)
    node_id: int = 1
    #: (node id, controller port) of every controller of a multi-node cluster (a static quorum);
    #: empty: this node is the single voter of its own quorum.
    voters: tuple[tuple[int, int], ...] = ()
    heap: str | None = None  # JVM heap options; None: KAFKA_HEAP_OPTS, else DEFAULT_KAFKA_HEAP
    #: server.properties entries that replace the generated ones of the same key (a secured
    #: listener, leap.services.secure); secrets among them, so kept out of repr.
    overrides: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    #: ``--add-scram`` credentials of the storage format (passed in an argument file, not argv)
    scram: tuple[str, ...] = field(default=(), repr=False)

    @property
    def replicas(self) -> int:
        """Replicas of internal topics: every node of the cluster."""
        return max(1, len(self.voters))

    def dir(self, settings: Settings) -> Path:
        return self.home if self.home is not None else kafka_home(settings)

    def root(self, settings: Settings) -> Path:
        """What identifies the broker's process as ours (see ``leap.services.processes.owned_pid``)."""
        return self.home if self.home is not None else services_dir(settings)


#: The broker ``leap services up`` runs.
LOCAL_NODE = KafkaNode()


def kafka_home(settings: Settings) -> Path:
    """Folder of the local broker's files: jars, configuration, data, logs and pid file."""
    return services_dir(settings) / "kafka"


def _pidfile(settings: Settings, node: KafkaNode = LOCAL_NODE) -> Path:
    return node.dir(settings) / "kafka.pid"


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


def kafka_version(settings: Settings) -> str:
    """The broker's release version as far as we know it."""
    # The Kafka protocol does not carry the broker's release version (ApiVersions only lists API
    # ranges), so only a broker we started or pinned ourselves has a known version.
    if not settings.kafka_from_env:
        return KAFKA_VERSION
    from leap.services.kafka_version import local_broker_version

    return local_broker_version(settings.kafka_bootstrap) or "unknown"


def wait_for_kafka(settings: Settings, timeout: float, pid: int | None, kafka_dir: Path | None) -> None:
    """Wait until the Kafka cluster answers a metadata request.

    Raises ``ServiceError`` if process ``pid`` (the local broker, if any) exits first or nothing
    answers within ``timeout`` seconds; the message carries the logs' tails of ``kafka_dir``.
    """
    deadline = time.monotonic() + timeout
    reason = "no answer"
    while time.monotonic() < deadline:
        if pid is not None and not pid_alive(pid):
            raise ServiceError(f"the Kafka broker exited during start-up.\n{_kafka_log_tail(kafka_dir)}")
        reason = kafka_probe(settings, timeout=min(5.0, max(0.5, deadline - time.monotonic()))) or ""
        if not reason:
            return
        time.sleep(0.5)
    raise ServiceError(
        f"Kafka at {settings.kafka_bootstrap} did not answer within {timeout:.0f} s ({reason})."
        + (f"\n{_kafka_log_tail(kafka_dir)}" if kafka_dir else "")
    )


def _kafka_log_tail(kafka_dir: Path | None) -> str:
    return log_tail(kafka_dir, ("kafka.out", "server.log"))


# --------------------------------------------------------------------------------------------
# the broker's jars and configuration
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
<!-- Generated by leap.services.stack: only used to resolve the broker's jars. -->
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
    cmd = ["mvn", "-q", "-B", "-Dstyle.color=never", "-f", str(kafka_dir / "pom.xml"),
           "dependency:copy-dependencies", f"-DoutputDirectory={staging}", "-DincludeScope=runtime"]
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


def _server_properties(kafka_dir: Path, node: KafkaNode = LOCAL_NODE) -> str:
    listeners = f"PLAINTEXT://{HOST}:{node.port},CONTROLLER://{HOST}:{node.controller_port}"
    if node.voters:
        quorum = "controller.quorum.voters=" + ",".join(f"{i}@{HOST}:{port}" for i, port in node.voters)
    else:
        quorum = f"controller.quorum.bootstrap.servers={HOST}:{node.controller_port}"
    # a write is acknowledged once all but one replica have it (one of one on a single node)
    replicas, min_isr = node.replicas, max(1, node.replicas - 1)
    props = f"""# Generated by leap.services.stack on every start; edits are overwritten.
process.roles=broker,controller
node.id={node.node_id}
{quorum}
listeners={listeners}
advertised.listeners={listeners}
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={kafka_dir / "data"}
num.partitions=1
# internal topics on every node; one node: a single replica
offsets.topic.replication.factor={replicas}
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={min_isr}
share.coordinator.state.topic.replication.factor={replicas}
share.coordinator.state.topic.min.isr={min_isr}
default.replication.factor={replicas}
min.insync.replicas={min_isr}
# topics are created explicitly (leap topics create); a typo must not create a topic
auto.create.topics.enable=false
# no one else will join: do not hold the first rebalance of a group for 3 s
group.initial.rebalance.delay.ms=0
# a dead worker's partitions move on within seconds (LEAP_KAFKA_SESSION_TIMEOUT below the broker
# default minimum of 6 s), and a dead worker's open transaction, which holds read_committed readers
# of the partitions it wrote, is aborted within a second of its timeout (the default checks every 10 s)
group.min.session.timeout.ms=1000
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
# two cores shared with the tests and workers
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.retention.hours=168
"""
    replaced = {key for key, _ in node.overrides}
    kept = [line for line in props.splitlines() if line.split("=", 1)[0] not in replaced]
    return "\n".join([*kept, *(f"{key}={value}" for key, value in node.overrides)]) + "\n"


def _log4j2_properties() -> str:
    return """# Generated by leap.services.stack: the broker logs to a rolling file, not to the terminal.
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


def new_cluster_id() -> str:
    """A Kafka cluster id: URL-safe base64 of 16 random bytes, without padding.

    Like Kafka's ``Uuid.randomUuid()`` it never starts with ``-``: one id in 64 would, and an
    argument parser reads such an id as an option (``--cluster-id: expected one argument``).
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


# --------------------------------------------------------------------------------------------
# start and stop
# --------------------------------------------------------------------------------------------


def local_kafka_pid(settings: Settings, node: KafkaNode = LOCAL_NODE) -> int | None:
    """The pid of the broker ``start_local_kafka`` started, if it still runs."""
    return owned_pid(_pidfile(settings, node), node.root(settings))


def start_local_kafka(settings: Settings, step: Step, node: KafkaNode = LOCAL_NODE,
                      cluster_id: str | None = None) -> tuple[str, int | None]:
    """Start the JVM broker of ``node`` unless ours already runs. Returns (action, pid).

    ``cluster_id`` formats a new node of a multi-node cluster (every node the same id).
    """
    kafka_dir = node.dir(settings)
    pidfile = _pidfile(settings, node)
    pid = local_kafka_pid(settings, node)
    if pid is not None:
        return "running", pid
    refuse_taken_ports((node.port, node.controller_port), pidfile, "set LEAP_KAFKA_BOOTSTRAP to use that cluster")
    java = _java()
    kafka_dir.mkdir(parents=True, exist_ok=True)
    kafka_home(settings).mkdir(parents=True, exist_ok=True)
    libs = _ensure_kafka_jars(kafka_home(settings), step)
    config = kafka_dir / "config"
    logs = kafka_dir / "logs"
    data = kafka_dir / "data"
    for folder in (config, logs, data):
        folder.mkdir(parents=True, exist_ok=True)
    # private: a secured node's holds the broker's SCRAM password
    write_private(config / "server.properties", _server_properties(kafka_dir, node))
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
        _format_storage(jvm, config / "server.properties", cluster_id, node.scram)
    step(f"starting Kafka {KAFKA_VERSION} (KRaft) on {HOST}:{node.port}")
    heap = (node.heap or os.environ.get("KAFKA_HEAP_OPTS", DEFAULT_KAFKA_HEAP)).split()
    gc = ["-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExplicitGCInvokesConcurrent"]
    cmd = [jvm[0], *heap, *gc, *jvm[1:], "kafka.Kafka", str(config / "server.properties")]
    pid = spawn(cmd, cwd=kafka_dir, out=logs / "kafka.out")
    pidfile.write_text(f"{pid}\n")
    return "started", pid


def _format_storage(jvm: list[str], server_properties: Path, cluster_id: str | None = None,
                    scram: tuple[str, ...] = ()) -> None:
    """Format a new broker's KRaft storage (its ``log.dirs``): a fresh cluster id of its own, or a
    node of the multi-node cluster ``cluster_id``; ``scram`` credentials are created with it."""
    # --standalone makes a single node the only voter of a dynamic quorum (KIP-853), which is
    # what controller.quorum.bootstrap.servers in _server_properties expects; the nodes of a
    # cluster name their static quorum (controller.quorum.voters) instead.
    if cluster_id is None:
        quorum = ["--standalone", f"--cluster-id={new_cluster_id()}"]
    else:
        quorum = [f"--cluster-id={cluster_id}"]
    # SCRAM passwords go in an argument file only we can read, never on a command line (ps shows those)
    argfile = server_properties.with_name("format.args")
    argfile.unlink(missing_ok=True)
    if scram:
        with open(os.open(argfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
            fh.write("".join(f"--add-scram\n{cred}\n" for cred in scram))
        quorum.append(f"@{argfile}")
    try:
        fmt = subprocess.run([*jvm, "kafka.tools.StorageTool", "format", *quorum, "-c", str(server_properties)],
                             capture_output=True, text=True, timeout=180, check=False)
    finally:
        argfile.unlink(missing_ok=True)
    if fmt.returncode != 0:
        raise ServiceError(f"formatting the Kafka storage failed:\n{(fmt.stdout + fmt.stderr)[-3000:]}")


def stop_local_kafka(settings: Settings, node: KafkaNode = LOCAL_NODE) -> str:
    """Stop the broker ``start_local_kafka`` started: ``stopped``, ``killed`` or ``not running``."""
    return stop_owned(_pidfile(settings, node), node.root(settings))
