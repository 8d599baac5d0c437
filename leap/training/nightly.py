"""Nightly training on the history archive: train, compare on the same holdout, promote if not worse.

:func:`run_nightly` is one night's job; :func:`serve` (the ``leap worker trainer`` role) runs it
daily at a fixed UTC time. The job trains on what was known before today's UTC midnight: the
holdout is yesterday's submissions that finished before midnight, so a run at 02:00 does not
score a model on the two hours of today that happen to be in the archive already.
"""

from __future__ import annotations

import datetime as dt
import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leap.core.settings import Settings
from leap.training.dataset import DAY
from leap.training.days import day_text
from leap.training.train import not_worse, train
from predictor.registry import Registry
from streams.events import ModelAnnouncement

log = logging.getLogger("leap.nightly")


@dataclass(frozen=True)
class NightlyConfig:
    """What the trainer role trains on, where it registers, and when.

    Parameters
    ----------
    archive
        History archive (the archiver's folder, or any ``leap fleet history`` output).
    registry
        Model registry folder.
    schedule
        Time of day (UTC) of the daily run.
    window_days
        Days of finished attempts to train on.
    run_now
        Run once immediately and return instead of following the schedule.
    params
        LightGBM parameters; None for the defaults.
    row_cache
        Folder of the rows' checkpoint, so a night replays only the events since the last
        (:mod:`leap.training.row_cache`); None: every night builds its rows from the whole archive.
    """

    archive: Path
    registry: Path
    schedule: dt.time = dt.time(2, 0)
    window_days: int = 30
    run_now: bool = False
    params: dict[str, Any] | None = field(default=None)
    row_cache: Path | None = None


def parse_schedule(text: str) -> dt.time:
    """``HH:MM`` (UTC) to a time of day."""
    try:
        return dt.datetime.strptime(text, "%H:%M").time()
    except ValueError:
        raise ValueError(f"{text!r} is not a time of day in HH:MM form") from None


def next_run(now: float, at: dt.time) -> float:
    """Unix seconds of the first ``at`` (UTC) strictly after ``now``."""
    today = dt.datetime.fromtimestamp(now, tz=dt.UTC).replace(hour=at.hour, minute=at.minute, second=0,
                                                               microsecond=0)
    t = today.timestamp()
    return t if t > now else t + DAY


def last_archived_day(archive: Path) -> float | None:
    """Midnight (UTC) of the newest ``submissions/day=`` folder, without reading any file."""
    days = [p.name.removeprefix("day=") for p in (archive / "submissions").glob("day=*") if p.is_dir()]
    if not days:
        return None
    return dt.datetime.strptime(max(days), "%Y-%m-%d").replace(tzinfo=dt.UTC).timestamp()


def nightly_as_of(archive: Path, now: float) -> float:
    """Train on what was known before today's midnight, or right after the archive's last day if
    that is earlier (an archive that stopped, or a simulated history)."""
    today = now // DAY * DAY
    last = last_archived_day(archive)
    return today if last is None else min(today, last + DAY)


def decide(report: dict[str, Any]) -> tuple[bool, str]:
    """Whether a training report's candidate should be promoted, and why (for the promotion log)."""
    candidate = report["metrics"]["lightgbm"]
    current = report.get("current")
    if current is None:
        return True, "nightly: no current model"
    acc, cur = candidate["acc@10"], current["holdout"]["acc@10"]
    if not_worse(candidate, current["holdout"]):
        return True, f"nightly: acc@10 {acc:.4f} >= {cur:.4f} of {current['version']} on holdout {_holdout(report)}"
    return False, f"nightly: acc@10 {acc:.4f} < {cur:.4f} of {current['version']} on holdout {_holdout(report)}"


def _holdout(report: dict[str, Any]) -> str:
    return str(report["holdout"]["day"])


def promote_and_announce(registry: Registry, version: str, reason: str, settings: Settings) -> ModelAnnouncement:
    """Make ``version`` current in the registry and announce it on ``leap.models``.

    The registry is updated first: a predictor that (re)starts between the two steps still
    finds the new model through the announcement that follows, never an announced model the
    registry does not list as current.
    """
    from predictor.models import BASELINES
    from predictor.reload import announce

    record = None if version in BASELINES else registry.record(version)
    registry.set_current(version, reason)
    return announce(settings, record, version)


def run_nightly(
    archive: Path,
    registry: Registry,
    settings: Settings,
    as_of: float | None = None,
    window_days: int = 30,
    params: dict[str, Any] | None = None,
    now: float | None = None,
    row_cache: Path | None = None,
) -> dict[str, Any]:
    """Train on the archive, register the candidate, and promote and announce it if not worse.

    Parameters
    ----------
    archive
        History folder.
    registry
        Where the candidate is registered and CURRENT lives.
    settings
        Kafka connection for the announcement.
    as_of
        Train on what was known before this time; default :func:`nightly_as_of`.
    window_days, params
        Passed to :func:`leap.training.train.train`.
    now
        Clock for the default ``as_of`` (tests).
    row_cache
        Passed to :func:`leap.training.train.train`.

    Returns
    -------
    dict
        The training report plus ``promoted`` (bool) and ``decision`` (the reason).
    """
    t = as_of if as_of is not None else nightly_as_of(archive, time.time() if now is None else now)
    log.info("nightly training on %s as of %s (window %d days)", archive, day_text(t), window_days)
    record, report = train(archive, registry, t, window_days, params, row_cache=row_cache)
    promote, reason = decide(report)
    report["decision"] = reason
    report["promoted"] = promote
    if promote:
        promote_and_announce(registry, record.version, reason, settings)
    log.info("%s %s: %s", "promoted" if promote else "kept the current model, not", record.version, reason)
    return report


def serve(settings: Settings, config: NightlyConfig, stop: threading.Event | None = None) -> None:
    """Run :func:`run_nightly` daily at ``config.schedule`` (UTC) until SIGTERM/SIGINT.

    A failed night (no data, an unreadable archive) is logged and the schedule goes on; the
    current model stays.
    """
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s")
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    registry = Registry(config.registry)
    if config.run_now:  # cron and manual runs: a failure must show in the exit code
        run_nightly(config.archive, registry, settings, window_days=config.window_days, params=config.params,
                    row_cache=config.row_cache)
        return
    while not stop.is_set():
        at = next_run(time.time(), config.schedule)
        log.info("next nightly training at %s UTC", dt.datetime.fromtimestamp(at, tz=dt.UTC).isoformat())
        if stop.wait(max(0.0, at - time.time())):
            break
        try:
            run_nightly(config.archive, registry, settings, window_days=config.window_days, params=config.params,
                        row_cache=config.row_cache)
        except Exception:  # the role outlives a bad night; tomorrow's run may succeed
            log.exception("nightly training failed; the current model stays")
