"""The fleet's own catalogue file (LEAP_HARDWARE_FILE): parts, aliases, errors, reloads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from leap.core.hardware import Catalogue
from predictor.ranking import SPECS_ONLY, specs_only_reasons

PART = """
[[hardware]]
name = "H20"
vendor = "nvidia"
architecture = "hopper"
peak_tflops = 148
memory_gb = 96
memory_bw_gbps = 4000
interconnect_gbps = 900
frameworks = ["pytorch", "jax"]
price_per_hour = 3.10
"""
ALIAS = """
[[alias]]
hardware = "H100-SXM"
names = ["NVIDIA H100 80GB HBM3"]
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_part_and_an_alias_join_the_catalogue(tmp_path: Path) -> None:
    cat = Catalogue.load(hardware=write(tmp_path / "fleet.toml", PART + ALIAS))
    h20 = cat.resolve("NVIDIA H20")
    assert h20 is not None and h20.name == "H20" and h20.price_per_hour == 3.10
    assert h20.price_source == "operator file fleet.toml" and h20.node_size == 8
    assert cat.canonical("NVIDIA H100 80GB HBM3") == "H100-SXM"
    assert len(cat) == len(Catalogue.load()) + 1


@pytest.mark.parametrize(("text", "message"), [
    (PART.replace("peak_tflops = 148", "peak_tflops = -1"), r"fleet.toml:6: \[\[hardware\]\] #1 field 'peak_tflops'"),
    (PART.replace("memory_gb = 96", "memory_gb = \"96\""), r"fleet.toml:7: .* field 'memory_gb': must be a positive"),
    (PART.replace("price_per_hour = 3.10", "price_per_hr = 3.10"), r"fleet.toml:11: .* field 'price_per_hr': unknown"),
    (PART.replace('vendor = "nvidia"\n', ""), r"fleet.toml:2: .* field 'vendor': missing"),
    (PART.replace('frameworks = ["pytorch", "jax"]', "frameworks = []"), r"fleet.toml:10: .* field 'frameworks'"),
    (PART + PART, r"'H20' is already a part"),
    (PART.replace('name = "H20"', 'name = "H100"'), r"'H100' is already a part"),
    (ALIAS.replace("H100-SXM", "H999"), r"fleet.toml:4: \[\[alias\]\] field 'hardware': 'H999' is no part"),
    (ALIAS.replace("NVIDIA H100 80GB HBM3", "A100"), r"fleet.toml:4: \[\[alias\]\] field 'names': 'A100' already"),
    ("[[hardware]\nname = 1", r"not valid TOML: .*line 1"),
    ("[parts]\nx = 1", r"unknown table 'parts'"),
])
def test_errors_name_the_line_and_the_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Catalogue.load(hardware=write(tmp_path / "fleet.toml", text))


def test_a_running_catalogue_rereads_the_file_and_keeps_the_old_one_when_it_is_bad(tmp_path: Path) -> None:
    path = write(tmp_path / "fleet.toml", ALIAS)
    prices = write(tmp_path / "prices.csv", "hardware,price_per_hour,source\nH100-SXM,9.0,deal\n")
    cat = Catalogue.load(hardware=path, prices=prices)
    assert cat.resolve("H20") is None  # remembered as unknown ...
    write(path, ALIAS + PART)
    os.utime(path, (1e9, 2e9))
    assert cat.reload_prices_if_changed()
    h20 = cat.resolve("H20")  # ... and known after the reload
    assert h20 is not None and h20.price_per_hour == 3.10
    assert cat.price("NVIDIA H100 80GB HBM3") == 9.0  # the price file still applies
    write(path, PART.replace("memory_gb = 96", "memory_gb = 0"))
    os.utime(path, (1e9, 3e9))
    with pytest.raises(ValueError, match="memory_gb"):
        cat.reload_prices_if_changed()
    assert cat.resolve("H20") is not None and cat.price("H100-SXM") == 9.0  # unchanged
    with pytest.raises(ValueError, match="memory_gb"):  # tried again until fixed, never half-applied
        cat.reload_prices_if_changed()
    assert cat.canonical("NVIDIA H100 80GB HBM3") == "H100-SXM"


def test_a_part_the_model_never_saw_says_it_was_ranked_from_specs(tmp_path: Path) -> None:
    cat = Catalogue.load(hardware=write(tmp_path / "fleet.toml", PART))
    names = ["H100-SXM", "NVIDIA H20", "made-up"]
    reasons = specs_only_reasons(names, [None, None, None], frozenset({"H100-SXM"}), cat)
    assert reasons == [None, SPECS_ONLY, None]  # an unknown name is the ranking's unknown_hardware
    assert specs_only_reasons(names, [None] * 3, None, cat) == [None] * 3  # baselines: no such claim
