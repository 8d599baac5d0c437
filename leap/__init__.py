"""The roof: the ``leap`` command, the demo and the wiring of worker roles. Nothing imports them.

The floors below the roof live here too, as subpackages (``leap.core`` at the ground, ``leap.training``,
``leap.fleet``, ...), so keep this module import-light: ``streams``, ``features`` and ``predictor``
import ``leap.core``, which runs this file first.
"""
