"""What-if ranking: rank hypothetical configurations without submitting them.

Capacity planning asks questions a submission must not answer: "what if this job moved to 16
accelerators", "what would this new part be worth to the jobs we run". :class:`WhatIf` ranks such
configurations with the model the predictors serve (the newest announcement on the models
topic, which they follow) and the features the store holds now, in this process: nothing is
published to any topic and nothing is written to the store, so the job's history, its rankings
and the fleet's metrics stay as they were. ``leap what-if FILE.jsonl`` is the same from the command line.

It is not a method of :class:`streams.client.SchedulerClient`: ranking needs the model and the
feature store, which live on floors above the client's (``streams`` < ``features`` <
``predictor``).
"""

from __future__ import annotations

from collections.abc import Sequence

from features.store import open_store
from leap.core.hardware import Catalogue, load_catalogue
from leap.core.settings import Settings
from predictor.registry import Registry
from predictor.reload import ModelFollower
from predictor.service import ActiveModel, ModelHolder, RankingService, lookup_fallback
from streams.events import Ranking, Submission


class WhatIf:
    """Ranks hypothetical submissions as the predictors would rank them now.

    Parameters
    ----------
    settings
        Kafka (the model announcements), Redis and key prefix of the running system.
    catalogue
        Specs and prices; default :func:`leap.core.hardware.load_catalogue` (its price and operator
        files included, as the workers read them).
    """

    def __init__(self, settings: Settings, catalogue: Catalogue | None = None) -> None:
        self.settings = settings
        self.catalogue = catalogue

    def served_model(self) -> ActiveModel:
        """The newest announced model, found and loaded as predictors follow it
        (:class:`predictor.reload.ModelFollower`), without compiling its trees; the lookup
        fallback when none was announced."""
        follower = ModelFollower(self.settings, Registry(self.settings.registry_dir), ModelHolder(lookup_fallback()))
        try:
            ann = follower.latest()
            return ActiveModel(follower.load(ann), ann.model_version) if ann is not None else lookup_fallback()
        finally:
            follower.stop()

    def rank(self, submissions: Sequence[Submission]) -> list[Ranking]:
        """One ranking per submission, in order; reads the store, writes and publishes nothing."""
        catalogue = self.catalogue or load_catalogue(self.settings)
        store = open_store(self.settings, catalogue)
        return RankingService(store, catalogue, ModelHolder(self.served_model())).rank(submissions)
