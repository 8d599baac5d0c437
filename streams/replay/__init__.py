"""Topic replay for on-call work: ``leap replay`` (mount :data:`app`)."""

from streams.replay.cli import app

__all__ = ["app"]
