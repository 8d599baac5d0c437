"""The hardware catalogue: coverage, name resolution, sources and price overrides."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from leap.core.hardware import SPEC_FEATURES, Catalogue, HardwareType, load_catalogue, normalise
from leap.core.settings import Settings

REQUIRED = (
    "K80", "P100", "V100-32GB", "T4", "A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100-SXM",
    "H200", "B200", "MI250X", "MI300X", "MI325X", "TPU-v4", "TPU-v5e", "TPU-v5p", "TPU-v6e",
    "Gaudi2", "Gaudi3", "Trainium1", "Trainium2",
)


@pytest.fixture()
def cat() -> Catalogue:
    return Catalogue.load()  # list prices: the environment is read only by Settings


def test_at_least_22_types_including_the_required_ones(cat: Catalogue) -> None:
    assert len(cat.names()) >= 22
    assert set(REQUIRED) <= set(cat.names())
    assert {hw.vendor for hw in cat} == {"nvidia", "amd", "google", "intel", "aws"}


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("H100", "H100-SXM"),
        ("h100 sxm", "H100-SXM"),
        ("NVIDIA H100-SXM5-80GB", "H100-SXM"),
        ("V100", "V100-16GB"),
        ("Tesla V100", "V100-16GB"),
        ("V100 32GB", "V100-32GB"),
        ("v5p", "TPU-v5p"),
        ("TPU_V5E", "TPU-v5e"),
        ("Trillium", "TPU-v6e"),
        ("AMD Instinct MI300X", "MI300X"),
        ("nvidia a100-sxm4-80gb", "A100-80GB"),
        ("Intel Gaudi 2", "Gaudi2"),
        ("trn1", "Trainium1"),
        ("NVIDIA L40S", "L40S"),
        ("Google TPU v4", "TPU-v4"),
    ],
)
def test_aliases_resolve(cat: Catalogue, spelling: str, expected: str) -> None:
    hw = cat.resolve(spelling)
    assert hw is not None and hw.name == expected


def test_unknown_names_do_not_resolve(cat: Catalogue) -> None:
    assert cat.resolve("H900") is None
    assert cat.resolve("") is None
    assert cat.price("nope") is None


def test_every_type_has_sources_positive_specs_and_frameworks(cat: Catalogue) -> None:
    for hw in cat:
        assert isinstance(hw, HardwareType)
        assert hw.spec_source.strip() and hw.price_source.strip(), hw.name
        for key in (*SPEC_FEATURES, "price_per_hour", "peak_fp32_tflops", "scale_out_gbps", "node_size"):
            assert getattr(hw, key) > 0, (hw.name, key)
        # one scale-out link per accelerator never outruns its scale-up fabric (one direction)
        assert hw.scale_out_gbps <= hw.interconnect_gbps / 2, hw.name
        assert hw.max_accelerators is None or hw.max_accelerators >= hw.node_size or hw.vendor != "google"
        assert hw.frameworks, hw.name
        assert hw.peak_fp32_tflops <= hw.peak_tflops, hw.name
        assert set(hw.specs()) == set(SPEC_FEATURES)
        # every alias is unique across the catalogue (the loader raises otherwise) and resolves back
        for alias in hw.aliases:
            assert cat.resolve(alias) is hw


def test_network_and_fp8_facts_come_from_the_catalogue(cat: Catalogue) -> None:
    h100, tpu, trn = cat.resolve("H100-SXM"), cat.resolve("TPU-v5p"), cat.resolve("Trainium2")
    assert h100 is not None and tpu is not None and trn is not None
    assert (h100.node_size, h100.scale_out_gbps, h100.fp8) == (8, 50.0, True)  # p5: 3,200 Gb/s per 8
    assert tpu.node_size == tpu.max_accelerators == 8960 and not tpu.fp8  # one ICI domain
    assert trn.node_size == 16


def test_price_override_and_reload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prices = tmp_path / "prices.csv"
    prices.write_text("hardware,price_per_hour,source\nH100,2.5,negotiated 2026\nv5p,3.0,\n")
    cat = Catalogue.load(prices=prices)
    assert cat.price("H100-SXM") == 2.5
    assert cat.types["H100-SXM"].price_source == "negotiated 2026"
    assert cat.price("TPU-v5p") == 3.0
    base = Catalogue.load(prices=None)
    assert cat.price("T4") == base.price("T4")
    assert not cat.reload_prices_if_changed()

    prices.write_text("hardware,price_per_hour,source\nH100-SXM,2.0,renegotiated\n")
    later = time.time() + 5  # mtime resolution on some filesystems is coarse
    os.utime(prices, (later, later))
    assert cat.reload_prices_if_changed()
    assert cat.price("H100") == 2.0
    assert cat.price("TPU-v5p") == base.price("TPU-v5p")  # dropped override reverts to the list price
    assert not cat.reload_prices_if_changed()

    settings = Settings.from_env({"LEAP_PRICES_FILE": str(prices)})
    assert Catalogue.load(prices=settings.prices_file).price("H100") == 2.0
    assert load_catalogue(settings).price("H100") == 2.0
    monkeypatch.setenv("LEAP_PRICES_FILE", str(prices))
    assert load_catalogue().price("H100") == 2.0  # no settings: Settings.from_env()
    assert load_catalogue() is load_catalogue(settings)  # cached per price file


def test_a_pickled_catalogue_keeps_its_prices_and_reloads_with_a_lock_of_its_own(tmp_path: Path) -> None:
    """Worker processes (``leap backtest --jobs``) receive the catalogue pickled."""
    import pickle

    prices = tmp_path / "prices.csv"
    prices.write_text("hardware,price_per_hour,source\nH100,2.5,negotiated 2026\n")
    cat = Catalogue.load(prices=prices)
    copy = pickle.loads(pickle.dumps(cat))
    assert copy.price("H100") == 2.5 and copy.names() == cat.names()
    assert copy.resolve("nvidia h100 sxm") == cat.resolve("nvidia h100 sxm")
    assert copy._lock is not cat._lock
    prices.write_text("hardware,price_per_hour,source\nH100,2.0,renegotiated\n")
    later = time.time() + 5
    os.utime(prices, (later, later))
    assert copy.reload_prices_if_changed() and copy.price("H100") == 2.0


def test_bad_override_is_rejected(tmp_path: Path) -> None:
    prices = tmp_path / "prices.csv"
    prices.write_text("hardware,price_per_hour,source\nH900,2.5,\n")
    with pytest.raises(ValueError, match="unknown hardware"):
        Catalogue.load(prices=prices)
    prices.write_text("hardware,price_per_hour,source\nH100,-1,\n")
    with pytest.raises(ValueError, match="positive"):
        Catalogue.load(prices=prices)


def test_normalise_and_default_instance() -> None:
    assert normalise("NVIDIA H100-SXM5 80GB") == "nvidiah100sxm580gb"
    assert load_catalogue() is load_catalogue()
