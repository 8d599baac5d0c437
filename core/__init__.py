"""The ground floor: settings, the hardware catalogue and the accuracy metrics every floor shares.

Importing this package sets the OpenMP wait policy, once for every process: LightGBM's OpenMP
threads spin while waiting by default, and on a small shared machine (workers, broker and trainer
side by side) spinning threads starve everything else. The policy is read when LightGBM's library
loads, so the packages that load LightGBM import this one first (their ``__init__``).
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
