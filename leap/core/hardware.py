"""The hardware catalogue: accelerator specs and hourly prices, from one data file.

The row builder reads the specs (:data:`SPEC_FEATURES`), the ranking reads the prices and the
simulator reads both, so all of them see the same numbers. Specs live in
``leap/core/data/hardware.toml``; prices there are list prices and can be overridden by a CSV
(``hardware,price_per_hour,source``) passed to :meth:`Catalogue.load`, or named by
``Settings.prices_file`` (``LEAP_PRICES_FILE``) for :func:`load_catalogue`. A fleet adds its own
parts and aliases with an operator file (``LEAP_HARDWARE_FILE``, :mod:`leap.core.operator_hardware`).
Workers call :meth:`Catalogue.reload_prices_if_changed` now and then so that a new price or
operator file takes effect without a restart.
"""

from __future__ import annotations

import csv
import re
import threading
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from leap.core.operator_hardware import read_operator_file
from leap.core.settings import Settings

#: Numeric specs used as model features, in a fixed order.
SPEC_FEATURES: tuple[str, ...] = ("peak_tflops", "memory_gb", "memory_bw_gbps", "interconnect_gbps")

DEFAULT_PATH = Path(__file__).resolve().parent / "data" / "hardware.toml"

# Words that users put in front of a name ("NVIDIA H100", "AMD Instinct MI300X", "Google TPU v5p")
# and that never distinguish two types; dropped when an exact alias match fails.
_VENDOR_WORDS = ("nvidia", "tesla", "amd", "instinct", "google", "cloud", "intel", "habana", "aws")


def normalise(name: str) -> str:
    """Lower-case a hardware name and drop everything but letters and digits.

    Parameters
    ----------
    name
        Any spelling, e.g. ``"NVIDIA H100-SXM5-80GB"``.

    Returns
    -------
    str
        The matching key, e.g. ``"nvidiah100sxm580gb"``.
    """
    return re.sub(r"[^a-z0-9]", "", name.lower())


@dataclass(frozen=True)
class HardwareType:
    """One accelerator type.

    Attributes
    ----------
    name
        Canonical name, e.g. ``"H100-SXM"``.
    vendor
        ``nvidia``, ``amd``, ``google``, ``intel`` or ``aws``.
    aliases
        Other spellings that resolve to this type.
    peak_tflops
        Dense bf16 (fp16 on pre-bf16 parts, fp32 on K80) TFLOP/s per accelerator.
    memory_gb
        Accelerator memory, GB.
    memory_bw_gbps
        Peak memory bandwidth, GB/s.
    interconnect_gbps
        Scale-up bandwidth per accelerator, GB/s (both directions; PCIe where there is no fabric).
    frameworks
        Training frameworks the type runs.
    price_per_hour
        On-demand USD per accelerator-hour.
    spec_source, price_source
        Where the specs and the price come from.
    peak_fp32_tflops
        TFLOP/s an fp32/tf32 job can reach (TF32 tensor rate where there is one).
    scale_out_gbps
        Network bandwidth per accelerator between scale-up domains, GB/s, one direction.
    node_size
        Accelerators per scale-up domain (a server, an instance, a TPU pod).
    max_accelerators
        Largest allocation where the platform caps it (TPU slices), else ``None``.
    fp8
        Whether the part has dense FP8 tensor math.
    architecture
        Architecture generation of the chip (``"hopper"``, ``"cdna3"``, ``"tpu-v5p"`` ...); parts
        of one architecture share kernels and compilers. Empty when not stated.
    """

    name: str
    vendor: str
    aliases: tuple[str, ...]
    peak_tflops: float
    memory_gb: float
    memory_bw_gbps: float
    interconnect_gbps: float
    frameworks: tuple[str, ...]
    price_per_hour: float
    spec_source: str
    price_source: str
    peak_fp32_tflops: float = 0.0
    scale_out_gbps: float = 0.0
    node_size: int = 8
    max_accelerators: int | None = None
    fp8: bool = False
    architecture: str = ""

    def specs(self) -> dict[str, float]:
        """The :data:`SPEC_FEATURES` of this type as a dict."""
        return {k: float(getattr(self, k)) for k in SPEC_FEATURES}

    def supports(self, framework: str) -> bool:
        """Whether a job written for ``framework`` can run here."""
        return framework in self.frameworks


def _parse_entry(raw: dict[str, Any]) -> HardwareType:
    try:
        hw = HardwareType(
            name=str(raw["name"]),
            vendor=str(raw["vendor"]),
            aliases=tuple(str(a) for a in raw.get("aliases", ())),
            peak_tflops=float(raw["peak_tflops"]),
            memory_gb=float(raw["memory_gb"]),
            memory_bw_gbps=float(raw["memory_bw_gbps"]),
            interconnect_gbps=float(raw["interconnect_gbps"]),
            frameworks=tuple(str(f) for f in raw["frameworks"]),
            price_per_hour=float(raw["price_per_hour"]),
            spec_source=str(raw["spec_source"]),
            price_source=str(raw["price_source"]),
            peak_fp32_tflops=float(raw.get("peak_fp32_tflops", 0.0)),
            # Without a stated scale-out network, assume the scale-up link reaches every peer.
            scale_out_gbps=float(raw.get("scale_out_gbps", float(raw["interconnect_gbps"]) / 2)),
            node_size=int(raw.get("node_size", 8)),
            max_accelerators=int(raw["max_accelerators"]) if "max_accelerators" in raw else None,
            fp8=bool(raw.get("fp8", False)),
            architecture=str(raw.get("architecture", "")),
        )
    except KeyError as exc:
        raise ValueError(f"hardware entry {raw.get('name', '?')!r}: missing {exc.args[0]!r}") from None
    bad = [k for k in (*SPEC_FEATURES, "price_per_hour", "scale_out_gbps", "node_size") if not getattr(hw, k) > 0]
    if bad:
        raise ValueError(f"hardware entry {hw.name!r}: {', '.join(bad)} must be positive")
    return hw


def read_price_overrides(path: Path) -> dict[str, tuple[float, str]]:
    """Read a price-override CSV.

    Parameters
    ----------
    path
        CSV with header ``hardware,price_per_hour,source`` (``source`` may be empty).

    Returns
    -------
    dict
        Hardware name as written -> (USD per accelerator-hour, source text).
    """
    out: dict[str, tuple[float, str]] = {}
    with path.open(newline="") as fh:
        for lineno, row in enumerate(csv.DictReader(fh), start=2):
            name = (row.get("hardware") or "").strip()
            if not name:
                continue
            try:
                price = float(row.get("price_per_hour") or "")
            except ValueError:
                raise ValueError(f"{path}:{lineno}: price_per_hour is not a number") from None
            if not price > 0:
                raise ValueError(f"{path}:{lineno}: price_per_hour must be positive")
            source = (row.get("source") or "").strip() or f"override file {path.name}"
            out[name] = (price, source)
    return out


@dataclass
class Catalogue:
    """All hardware types, with name resolution and (reloadable) prices.

    Attributes
    ----------
    types
        Canonical name -> :class:`HardwareType`, with override prices applied.
    prices_path
        The override CSV in use, if any.
    """

    types: dict[str, HardwareType]
    prices_path: Path | None = None
    hardware_path: Path | None = None
    _base: dict[str, HardwareType] = field(default_factory=dict, repr=False)
    _package: dict[str, HardwareType] = field(default_factory=dict, repr=False)
    _index: dict[str, str] = field(default_factory=dict, repr=False)
    _resolved: dict[str, str | None] = field(default_factory=dict, repr=False)
    _prices_mtime: float | None = field(default=None, repr=False)
    _hardware_mtime: float | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its lock, which belongs to one process: worker processes get a copy."""
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __post_init__(self) -> None:
        if not self._base:
            self._base = dict(self.types)
        if not self._package:
            self._package = dict(self._base)
        self._index = _index_of(self._base)

    def _merge_operator_file(self) -> None:
        """Rebuild the base types from the package's and the operator file's (``types`` is the
        caller's to swap, with the prices applied, so readers never see list prices meanwhile)."""
        assert self.hardware_path is not None
        mtime = self.hardware_path.stat().st_mtime
        extra = read_operator_file(self.hardware_path, {f.name for f in fields(HardwareType)})
        base = dict(self._package)
        for raw in extra.parts:
            hw = _parse_entry(raw)
            if hw.name in base or normalise(hw.name) in _index_of(base):
                raise ValueError(f"{self.hardware_path}: [[hardware]] {hw.name!r} is already a part of the "
                                 "catalogue; give its other names with [[alias]] and its price with LEAP_PRICES_FILE")
            base[hw.name] = hw
        index = _index_of(base)
        for part, names, line in extra.aliases:
            owner = index.get(normalise(part))
            if owner is None:
                raise ValueError(f"{self.hardware_path}:{line}: [[alias]] field 'hardware': {part!r} is no part "
                                 "of the catalogue or of this file")
            for name in names:
                taken = index.setdefault(normalise(name), owner)
                if taken != owner:
                    raise ValueError(f"{self.hardware_path}:{line}: [[alias]] field 'names': {name!r} already "
                                     f"names {taken}")
            base[owner] = replace(base[owner], aliases=(*base[owner].aliases, *names))
        self._base, self._index = base, index
        self._resolved = {}  # a name unknown before may name a new part now
        self._hardware_mtime = mtime

    @classmethod
    def load(cls, path: Path | None = None, prices: Path | None = None, hardware: Path | None = None) -> Catalogue:
        """Load the catalogue.

        Parameters
        ----------
        path
            TOML file with ``[[hardware]]`` tables; default ``leap/core/data/hardware.toml``.
        prices
            Optional price-override CSV; None keeps the list prices (:func:`load_catalogue`
            passes ``Settings.prices_file``).
        hardware
            Optional operator file of extra parts and aliases (``Settings.hardware_file``).

        Returns
        -------
        Catalogue
        """
        with (path or DEFAULT_PATH).open("rb") as fh:
            data = tomllib.load(fh)
        types: dict[str, HardwareType] = {}
        for raw in data.get("hardware", []):
            hw = _parse_entry(raw)
            if hw.name in types:
                raise ValueError(f"hardware type {hw.name!r} defined twice")
            types[hw.name] = hw
        cat = cls(types=types, prices_path=prices, hardware_path=hardware)
        if hardware is not None:
            cat._merge_operator_file()
            cat.types = dict(cat._base)
        if prices is not None:
            cat._apply_prices()
        return cat

    def _apply_prices(self) -> None:
        """Re-read the override CSV and rebuild ``types`` from the base specs."""
        assert self.prices_path is not None
        mtime = self.prices_path.stat().st_mtime
        overrides = read_price_overrides(self.prices_path)
        types = dict(self._base)
        for written, (price, source) in overrides.items():
            canonical = self._index.get(normalise(written))
            if canonical is None:
                # An unknown name is a typo or a type this catalogue lacks; failing loudly beats
                # silently ranking with a stale price.
                raise ValueError(f"{self.prices_path}: unknown hardware type {written!r}")
            types[canonical] = replace(types[canonical], price_per_hour=price, price_source=source)
        # Swap the whole dict at once so readers on other threads never see a half-applied file.
        self.types = types
        self._prices_mtime = mtime

    def reload_prices_if_changed(self) -> bool:
        """Re-read the price-override and operator files if either's modification time changed.

        Returns
        -------
        bool
            True when new prices or parts were applied.

        Raises
        ------
        ValueError
            A changed file is invalid; the catalogue keeps what it had.
        """
        with self._lock:
            hardware = _mtime(self.hardware_path)
            prices = _mtime(self.prices_path)
            changed = False
            if hardware is not None and hardware != self._hardware_mtime:
                kept = (self._base, self._index, self.types)
                try:
                    self._merge_operator_file()
                except ValueError:
                    self._base, self._index, self.types = kept
                    raise
                changed = True
            if prices is not None and (changed or prices != self._prices_mtime):
                self._apply_prices()
                changed = True
            elif changed:
                self.types = dict(self._base)
            return changed

    def resolve(self, name: str) -> HardwareType | None:
        """Find a type by canonical name or alias (case, space and punctuation ignored).

        Parameters
        ----------
        name
            Any spelling, e.g. ``"nvidia h100 sxm"`` or ``"v5p"``.

        Returns
        -------
        HardwareType or None
            None when nothing matches.
        """
        # Names repeat on the hot path (every candidate of every submission): memoise the
        # canonical name; prices may change on reload, so look the type up fresh each time.
        canonical = self._resolved.get(name, "")
        if canonical != "":
            return self.types.get(canonical) if canonical is not None else None
        key = normalise(name)
        canonical = self._index.get(key)
        if canonical is None:
            stripped = key
            changed = True
            while changed:
                changed = False
                for word in _VENDOR_WORDS:
                    if stripped.startswith(word) and len(stripped) > len(word):
                        stripped = stripped[len(word):]
                        changed = True
            canonical = self._index.get(stripped)
        if len(self._resolved) < 10_000:  # bounded: names come from outside
            self._resolved[name] = canonical
        return self.types.get(canonical) if canonical is not None else None

    def canonical(self, name: str) -> str:
        """The canonical name of ``name`` (any spelling); names the catalogue lacks come back unchanged."""
        hw = self.resolve(name)
        return hw.name if hw is not None else name

    def names(self) -> list[str]:
        """Canonical names in catalogue order."""
        return list(self.types)

    def price(self, name: str) -> float | None:
        """USD per accelerator-hour of a type (any spelling), None if unknown."""
        hw = self.resolve(name)
        return hw.price_per_hour if hw is not None else None

    def __len__(self) -> int:
        return len(self.types)

    def __iter__(self) -> Iterator[HardwareType]:
        return iter(self.types.values())


def _index_of(types: dict[str, HardwareType]) -> dict[str, str]:
    """Normalised spelling -> canonical name; a spelling naming two types is an error."""
    index: dict[str, str] = {}
    for hw in types.values():
        for spelling in (hw.name, *hw.aliases):
            owner = index.setdefault(normalise(spelling), hw.name)
            if owner != hw.name:
                raise ValueError(f"alias {spelling!r} names both {owner} and {hw.name}")
    return index


def _mtime(path: Path | None) -> float | None:
    try:
        return path.stat().st_mtime if path is not None else None
    except FileNotFoundError:
        return None


def load_catalogue(settings: Settings | None = None) -> Catalogue:
    """The default catalogue (``leap/core/data/hardware.toml`` + ``settings.prices_file`` and
    ``settings.hardware_file``), loaded once.

    Parameters
    ----------
    settings
        Where the price-override file comes from; default :meth:`Settings.from_env`.

    Returns
    -------
    Catalogue
        The same object on every call with the same price file, so that a reload of its prices
        is seen by every holder.
    """
    settings = settings if settings is not None else Settings.from_env()
    return _catalogue_for(settings.prices_file, settings.hardware_file)


@lru_cache(maxsize=4)
def _catalogue_for(prices: Path | None, hardware: Path | None) -> Catalogue:
    return Catalogue.load(prices=prices, hardware=hardware)
