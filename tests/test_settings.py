"""Settings: every ``LEAP_*`` variable is read by ``Settings.from_env`` and nowhere else."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from leap.core.settings import DEFAULT_ARCHIVE_FLUSH_EVENTS, DEFAULT_ARCHIVE_FLUSH_SECONDS, Settings

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION = ("streams", "features", "predictor", "leap")


@pytest.mark.parametrize(
    ("var", "value", "attribute", "expected"),
    [
        ("LEAP_KAFKA_BOOTSTRAP", "k1:9092,k2:9092", "kafka_bootstrap", "k1:9092,k2:9092"),
        ("LEAP_KAFKA_BOOTSTRAP", "k1:9092", "kafka_from_env", True),
        ("LEAP_REDIS_URL", "redis://r:6380/2", "redis_url", "redis://r:6380/2"),
        ("LEAP_REDIS_URL", "redis://r:6380/2", "redis_from_env", True),
        ("LEAP_HOME", "/srv/leap", "home", Path("/srv/leap")),
        ("LEAP_KEY_PREFIX", "blue", "key_prefix", "blue"),
        ("LEAP_KAFKA_SECURITY_PROTOCOL", "SASL_SSL", "kafka_security", {"security.protocol": "SASL_SSL"}),
        ("LEAP_KAFKA_SASL_MECHANISM", "PLAIN", "kafka_security", {"sasl.mechanism": "PLAIN"}),
        ("LEAP_KAFKA_SASL_USERNAME", "svc", "kafka_security", {"sasl.username": "svc"}),
        ("LEAP_KAFKA_SASL_PASSWORD", "s3cret", "kafka_security", {"sasl.password": "s3cret"}),
        ("LEAP_KAFKA_SSL_CAFILE", "/etc/ca.pem", "kafka_security", {"ssl.ca.location": "/etc/ca.pem"}),
        ("LEAP_PRICES_FILE", "/etc/leap/prices.csv", "prices_file", Path("/etc/leap/prices.csv")),
        ("LEAP_ARCHIVE_DIR", "/data/archive", "archive_dir", Path("/data/archive")),
        ("LEAP_ARCHIVE_FLUSH_EVENTS", "250", "archive_flush_events", 250),
        ("LEAP_ARCHIVE_FLUSH_SECONDS", "2.5", "archive_flush_seconds", 2.5),
        ("LEAP_CATALOGUE_RELOAD_INTERVAL", "2.5", "catalogue_reload_interval", 2.5),
    ],
)
def test_from_env_reads_each_variable(var: str, value: str, attribute: str, expected: Any) -> None:
    default = getattr(Settings.from_env({}), attribute)
    assert default != expected
    assert getattr(Settings.from_env({var: value}), attribute) == expected
    assert getattr(Settings.from_env({var: ""}), attribute) == default  # empty means unset


def test_defaults_without_environment() -> None:
    s = Settings.from_env({})
    assert s == Settings()
    assert (s.prices_file, s.archive_dir) == (None, None)
    assert (s.archive_flush_events, s.archive_flush_seconds) == (DEFAULT_ARCHIVE_FLUSH_EVENTS,
                                                                  DEFAULT_ARCHIVE_FLUSH_SECONDS)
    assert not s.kafka_from_env and not s.redis_from_env


def test_archive_root_follows_home_unless_set() -> None:
    s = Settings.from_env({"LEAP_HOME": "/srv/leap"})
    assert s.archive_root == Path("/srv/leap/archive")
    assert replace(s, home=Path("/tmp/other")).archive_root == Path("/tmp/other/archive")
    pinned = Settings.from_env({"LEAP_HOME": "/srv/leap", "LEAP_ARCHIVE_DIR": "/data/archive"})
    assert replace(pinned, home=Path("/tmp/other")).archive_root == Path("/data/archive")


@pytest.mark.parametrize(("var", "value"), [("LEAP_ARCHIVE_FLUSH_EVENTS", "many"),
                                            ("LEAP_ARCHIVE_FLUSH_EVENTS", "2.5"),
                                            ("LEAP_ARCHIVE_FLUSH_SECONDS", "soon"),
                                            ("LEAP_CATALOGUE_RELOAD_INTERVAL", "often"),
                                            ("LEAP_CATALOGUE_RELOAD_INTERVAL", "0")])
def test_a_bad_number_names_its_variable(var: str, value: str) -> None:
    with pytest.raises(ValueError, match=var):
        Settings.from_env({var: value})


def test_secrets_stay_out_of_repr() -> None:
    assert "s3cret" not in repr(Settings.from_env({"LEAP_KAFKA_SASL_PASSWORD": "s3cret"}))
    shown = repr(Settings.from_env({"LEAP_REDIS_URL": "rediss://leap:s3cret@r:6380/0"}))
    assert "s3cret" not in shown and "redis_url='rediss://leap:***@r:6380/0'" in shown


def test_no_leap_variable_is_read_outside_settings() -> None:
    # A read elsewhere would be a second place to configure the same deployment.
    read = re.compile(r"""(environ\.get\(|environ\[|getenv\()\s*["']LEAP_""")
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for package in PRODUCTION
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "leap" / "core" / "settings.py"
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if read.search(line)
    ]
    assert not offenders, offenders


def test_to_env_round_trips_through_from_env(tmp_path: Path) -> None:
    env = {
        "LEAP_KAFKA_BOOTSTRAP": "k1:9092,k2:9092", "LEAP_REDIS_URL": "rediss://u:p@r:6380/1",
        "LEAP_HOME": str(tmp_path), "LEAP_KEY_PREFIX": "blue", "LEAP_PRICES_FILE": str(tmp_path / "p.csv"),
        "LEAP_ARCHIVE_DIR": str(tmp_path / "a"), "LEAP_ARCHIVE_FLUSH_EVENTS": "7",
        "LEAP_ARCHIVE_FLUSH_SECONDS": "1.5", "LEAP_KAFKA_SESSION_TIMEOUT": "7.5",
        "LEAP_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "LEAP_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "LEAP_KAFKA_SASL_USERNAME": "leap",
        "LEAP_KAFKA_SASL_PASSWORD": "secret", "LEAP_KAFKA_SSL_CAFILE": "/ca.pem",
        "LEAP_REDIS_CA_FILE": "/redis-ca.pem", "LEAP_CATALOGUE_RELOAD_INTERVAL": "5.0",
    }
    settings = Settings.from_env(env)
    assert settings.to_env() == env
    assert Settings.from_env(settings.to_env()) == settings


def test_the_redis_ca_file_goes_to_tls_connections_only() -> None:
    tls = Settings.from_env({"LEAP_REDIS_URL": "rediss://u:p@r:6380/0", "LEAP_REDIS_CA_FILE": "/ca.pem"})
    assert tls.redis_options() == {"ssl_ca_certs": "/ca.pem"}
    # redis-py's plain connection takes no ssl_* argument: a CA file must not break a redis:// URL
    plain = Settings.from_env({"LEAP_REDIS_URL": "redis://r:6380/0", "LEAP_REDIS_CA_FILE": "/ca.pem"})
    assert plain.redis_options() == {}


def test_redis_cluster_flag_defaults_to_the_local_cluster_and_round_trips() -> None:
    from leap.core.settings import LOCAL_REDIS_CLUSTER_PORTS

    settings = Settings.from_env({"LEAP_REDIS_CLUSTER": "1"})
    assert settings.redis_cluster
    assert settings.redis_url == f"redis://127.0.0.1:{LOCAL_REDIS_CLUSTER_PORTS[0]}/0"
    again = Settings.from_env(settings.to_env())
    assert (again.redis_cluster, again.redis_url) == (True, settings.redis_url)
    assert not Settings.from_env({"LEAP_REDIS_CLUSTER": "0"}).redis_cluster
    with pytest.raises(ValueError, match="LEAP_REDIS_CLUSTER"):
        Settings.from_env({"LEAP_REDIS_CLUSTER": "maybe"})


def test_event_streams_take_the_deployments_partition_count_and_replication() -> None:
    from streams.topics import DEAD_LETTER, SUBMISSIONS

    settings = Settings.from_env({"LEAP_TOPIC_PARTITIONS": "24", "LEAP_TOPIC_REPLICATION": "3"})
    assert (SUBMISSIONS.partitions_in(settings), DEAD_LETTER.partitions_in(settings)) == (24, 3)
    assert settings.topic_min_insync == 2
    assert Settings.from_env(settings.to_env()).topic_partitions == 24
    assert Settings().topic_min_insync == 0  # one broker: the broker's own default


def test_three_local_brokers_set_the_bootstrap_and_three_replicas() -> None:
    settings = Settings.from_env({"LEAP_KAFKA_BROKERS": "3"})
    assert settings.kafka_bootstrap == "127.0.0.1:19192,127.0.0.1:19194,127.0.0.1:19196"
    assert (settings.topic_replication, settings.topic_min_insync) == (3, 2)
    assert Settings.from_env(settings.to_env()).kafka_brokers == 3
    with pytest.raises(ValueError, match="LEAP_KAFKA_BROKERS=2"):
        Settings.from_env({"LEAP_KAFKA_BROKERS": "2"})
