"""Markers the online store reserves in its key and field names, below every floor that needs them.

The store (:mod:`features.layout`) keeps its own fields beside names that come from events: a job
hash holds one field per hardware type and the attempt counters, told apart only by
:data:`RESERVED_PREFIX`. The contracts (:mod:`streams.events`) refuse an event name that starts
with it, so a hardware type can never overwrite a counter, and a job key that starts with
:data:`HASH_TAG_CLOSE`. Both read the markers from here: the contracts sit below the store and
cannot import it.
"""

from __future__ import annotations

#: Job-hash fields that belong to the store itself (attempt counters) start with this; a name
#: that an event puts into a hash field (a hardware type) must not.
RESERVED_PREFIX = "_"
#: Closes a key's Redis Cluster hash tag: a job's keys are tagged ``{job_key}``
#: (:mod:`features.keys`). A job key that starts with it would make the tag empty, which Redis
#: Cluster ignores: the job's keys would hash to different slots and its scripts fail there.
HASH_TAG_CLOSE = "}"
