import os

# LightGBM's OpenMP threads spin while waiting by default; on a small shared machine (workers,
# broker and trainer side by side) spinning threads starve everything else. Must be set before
# lightgbm is first imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
