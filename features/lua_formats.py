"""The Lua helpers of the stored formats, generated from their Python declarations into a file.

``features/lua/formats.lua`` is checked in, so that the scripts read as Lua on their own; it is
what :func:`features.layout.lua_prelude` and :func:`features.sorted_view.lua_sorted_view`
generate from the declarations the Python readers use too, and ``tests/test_keys.py`` fails when
the two differ. After changing a declaration, write the file again with
``python -m features.lua_formats``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from features.layout import lua_prelude
from features.sorted_view import lua_sorted_view

FILE_NAME = "formats.lua"
HEADER = ("-- The stored value formats, generated from their declarations in features/layout.py and\n"
          "-- features/sorted_view.py by `python -m features.lua_formats`: edit those, not this file.\n")


def generated() -> str:
    """The text ``features/lua/formats.lua`` must hold."""
    return HEADER + lua_prelude() + "\n" + lua_sorted_view()


def checked_in() -> str:
    """The text ``features/lua/formats.lua`` holds."""
    return (resources.files("features") / "lua" / FILE_NAME).read_text()


if __name__ == "__main__":
    Path(__file__).with_name("lua").joinpath(FILE_NAME).write_text(generated())
