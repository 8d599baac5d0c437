"""The ground floor: settings, the hardware catalogue and the accuracy metrics every floor shares.

OpenMP's wait policy is left at its default on purpose. Serving predicts on one thread (no OpenMP
team, so nothing spins), and for training the default is much the faster: with
``OMP_WAIT_POLICY=PASSIVE`` the threads of a fit sleep in the kernel between parallel regions, and
fitting the served model took several times as long on a two-core machine.
"""
