"""Topic replay for on-call work (``leap replay``): rebuild features, re-rank, copy, inspect."""
