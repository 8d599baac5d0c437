"""The roof: the ``leap`` command, the demo and the wiring of worker roles. Nothing imports it."""
