"""The release of a Kafka broker that runs on this machine, read from the jars it runs.

The Kafka protocol does not carry a broker's release version (ApiVersions lists API ranges only):
``leap services status`` knows it for a broker it started from ``LEAP_HOME``, and, through this
module, for one named by ``LEAP_KAFKA_BOOTSTRAP`` that runs here from a classpath of Kafka jars
(the secured stack of ``leap services up --secure``, a test's private broker).
"""

from __future__ import annotations

from pathlib import Path

from leap.services.processes import HOST, listening_pid


def local_broker_version(bootstrap: str) -> str | None:
    """The release of a broker of ``bootstrap`` that runs on this machine from a classpath of Kafka
    jars (the secured stack's, a private test broker's): read from its ``kafka-clients-X.jar``.
    None for a remote broker, or one this user cannot see (Linux's /proc only)."""
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        if host not in (HOST, "localhost") or not port.isdigit():
            continue
        pid = listening_pid(int(port))
        cmdline = Path(f"/proc/{pid}/cmdline") if pid is not None else None
        if cmdline is None:
            continue
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        for i, arg in enumerate(args[:-1]):
            if arg == b"-cp":
                for jar in Path(args[i + 1].decode().removesuffix("*")).glob("kafka-clients-*.jar"):
                    return jar.name.removeprefix("kafka-clients-").removesuffix(".jar")
    return None
