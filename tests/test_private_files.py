"""Files that hold keys or passwords are the owner's alone from the start, whatever the umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from leap.services.processes import write_private
from leap.services.secure import make_certificates


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask: a file left to it would be world-readable (and writable)."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_private_file_is_created_0600_and_an_existing_one_made_so(tmp_path: Path, open_umask: None) -> None:
    fresh, existing = tmp_path / "fresh.properties", tmp_path / "existing.properties"
    existing.write_text("old")
    existing.chmod(0o644)
    write_private(fresh, "password=s3cret\n")
    write_private(existing, "password=s3cret\n")
    assert (_mode(fresh), _mode(existing)) == (0o600, 0o600)
    assert existing.read_text() == "password=s3cret\n"  # replaced, not appended


def test_the_secured_stacks_keys_are_0600(tmp_path: Path, open_umask: None) -> None:
    certs = make_certificates(tmp_path / "certs")
    assert _mode(certs.folder) == 0o700
    assert (_mode(certs.key), _mode(certs.keystore)) == (0o600, 0o600)  # the key, and the key with its certificate
    assert sorted(p.name for p in certs.folder.iterdir()) == ["ca.crt", "server.crt", "server.key", "server.pem"]
