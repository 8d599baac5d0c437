"""Training and evaluation: datasets from the history archive, training and the nightly job,
backtests, the drivers report and evaluation on public measurements."""
