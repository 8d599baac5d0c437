"""The ground floor: settings, the hardware catalogue and the accuracy metrics every floor shares.

OpenMP's wait policy is left at its default on purpose. Serving predicts on one thread (no OpenMP
team, so nothing spins), and for training the default is much the faster: fitting the served model
on 12,800 rows took 55 s with two threads by default, 68 s with one, and 278 s (110 s of it in the
kernel) with ``OMP_WAIT_POLICY=PASSIVE`` on a two-core machine.
"""
