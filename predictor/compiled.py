"""LightGBM boosters compiled to C: the served model's trees without LightGBM's per-row cost.

At model load, :func:`trees_for` turns a booster's ``dump_model()`` into C source (one function
per tree of nested ``if``/``else``; numerical and categorical splits with LightGBM's missing-value
rules; linear leaves), compiles it with the system C compiler into a shared library kept under a
cache folder keyed by the model's hash, and loads it with :mod:`ctypes`. One call scores a whole
batch of rows, tree by tree over blocks of :data:`ROW_BLOCK` rows (a tree's code stays in cache
while it scores a block).

Exactness is the contract: the library returns what ``Booster.predict`` returns, for the
objectives whose output is the raw score (the served model's ``regression``). The rules it
copies are LightGBM's own (``include/LightGBM/tree.h``, 4.x):

- a row's values with ``|v| <= 1e-35`` (``kZeroThreshold``, a float) are read as 0.0;
- numerical split: NaN is 0.0 unless the split's missing type is NaN; then a NaN (missing type
  NaN) or a zero (missing type Zero) goes the default side, anything else left when ``v <= threshold``;
- categorical split: NaN, negatives and values past the category bitset go right; else left when
  ``int(v)`` is in the split's categories;
- linear leaf: ``leaf_const + sum(coeff * value)`` in the dump's order, unless one of its
  features is NaN: then the leaf's constant value;
- the trees' outputs summed in order from 0.0, as ``GBDT::PredictRaw`` does.

The C source holds only numbers from the dump (hexadecimal float literals, integers): no name or
other string of the model reaches it. The cache folder is created 0700 and refused when another
user owns it or others can write to it. A cached library is checked before it is called: one made
by another version of this generator (whose entry point may take other arguments) or for another
booster is compiled again. Without a compiler, or when compiling fails, the booster's
own ``predict`` is used, with one log line.
"""

from __future__ import annotations

import _ctypes
import atexit
import contextlib
import ctypes
import hashlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import lightgbm as lgb
import numpy as np

log = logging.getLogger("leap.compiled")

#: Objectives whose ``predict`` output is the raw score (no link function to apply).
RAW_OBJECTIVES = frozenset({"regression", "regression_l1", "huber", "fair", "quantile", "mape"})
#: No fast-math, no fused multiply-add: the sums must round as LightGBM's do.
CFLAGS = ("-O2", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math")
COMPILE_TIMEOUT_S = 1800.0
#: Bumped when the generated code changes meaning: part of the cache key, and compiled into the
#: library, which is checked on load (a cached library of another version is compiled again).
CODEGEN_VERSION = "3"
#: Libraries kept in the cache folder (the most recently used; each model version makes one).
KEEP_LIBRARIES = 8
#: Rows scored together tree by tree: each block walks all the compiled code once (megabytes for
#: the served model), so blocks are large; much larger blocks no longer fit the caches and were
#: slower again when the size was chosen.
ROW_BLOCK = 2048


class Unsupported(ValueError):
    """The dump has something this compiler does not evaluate exactly (the booster is used instead)."""


class StaleLibrary(Unsupported):
    """A cached library that does not belong to this code generator or this booster."""


class TreePredictor(Protocol):
    """What the served model calls: ``Booster.predict``'s signature for a float64 matrix."""

    def predict(self, data: np.ndarray, *, num_threads: int) -> Any: ...


# ---------------------------------------------------------------------------- C source


def _num(value: Any) -> str:
    """A finite number of the dump as an exact C double literal (hexadecimal)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Unsupported(f"expected a number, got {type(value).__name__}")
    v = float(value)
    if not np.isfinite(v):
        raise Unsupported(f"non-finite number {v!r} in the model")
    return v.hex()


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Unsupported(f"expected an integer, got {type(value).__name__}")
    return value


def _categories(threshold: Any) -> list[int]:
    """The categories of a categorical split (``"1||3||5"`` in the dump) as non-negative ints."""
    parts = str(threshold).split("||")
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise Unsupported("categorical threshold is not a list of non-negative integers")
    return [int(p) for p in parts]


class _Tree:
    """C source of one tree as a function ``static double t<i>(const double* x)``."""

    def __init__(self, index: int, n_features: int) -> None:
        self.index = index
        self.n_features = n_features
        self.lines: list[str] = []
        self.bitsets: list[str] = []

    def feature(self, k: Any) -> str:
        k = _int(k)
        if not 0 <= k < self.n_features:
            raise Unsupported(f"feature index {k} outside 0..{self.n_features - 1}")
        return f"x[{k}]"

    def leaf(self, node: dict[str, Any], pad: str) -> None:
        value = _num(node["leaf_value"])
        if "leaf_const" not in node:
            self.lines.append(f"{pad}return {value};")
            return
        features = [self.feature(k) for k in node.get("leaf_features", [])]
        coeffs = [_num(c) for c in node.get("leaf_coeff", [])]
        if len(features) != len(coeffs):
            raise Unsupported("linear leaf with unequal feature and coefficient counts")
        expr = _num(node["leaf_const"])
        for c, f in zip(coeffs, features, strict=True):
            expr = f"({expr} + {c} * {f})"  # left to right, as LightGBM adds them
        if features:
            nan = " || ".join(f"isnan({f})" for f in features)
            self.lines.append(f"{pad}if ({nan}) return {value};")
        self.lines.append(f"{pad}return {expr};")

    def condition(self, node: dict[str, Any]) -> str:
        """C expression true when a row goes to the node's left child."""
        f = self.feature(node["split_feature"])
        if node["decision_type"] == "==":
            cats = _categories(node["threshold"])
            words = [0] * (max(cats) // 32 + 1)
            for c in cats:
                words[c // 32] |= 1 << (c % 32)
            name = f"c{self.index}_{len(self.bitsets)}"
            values = ", ".join(f"{w}u" for w in words)
            self.bitsets.append(f"static const uint32_t {name}[{len(words)}] = {{{values}}};")
            return f"cat_in({f}, {name}, {len(words)})"
        if node["decision_type"] != "<=":
            raise Unsupported(f"decision type {node['decision_type']!r}")
        thr, left, missing = _num(node["threshold"]), bool(node["default_left"]), node["missing_type"]
        if missing == "None":  # NaN is read as 0.0
            return f"!({f} > {thr})" if float(node["threshold"]) >= 0.0 else f"{f} <= {thr}"
        if missing == "NaN":  # NaN goes the default side; !(v > t) is true for NaN, v <= t false
            return f"!({f} > {thr})" if left else f"{f} <= {thr}"
        if missing == "Zero":  # NaN is 0.0, and a zero goes the default side
            zero = f"(isnan({f}) || is_zero({f}))"
            return f"({zero} || {f} <= {thr})" if left else f"(!{zero} && {f} <= {thr})"
        raise Unsupported(f"missing type {missing!r}")

    def node(self, node: dict[str, Any], depth: int) -> None:
        pad = "  " * depth
        if "leaf_value" in node:
            self.leaf(node, pad)
            return
        self.lines.append(f"{pad}if ({self.condition(node)}) {{")
        self.node(node["left_child"], depth + 1)
        self.lines.append(f"{pad}}} else {{")
        self.node(node["right_child"], depth + 1)
        self.lines.append(f"{pad}}}")

    def source(self, structure: dict[str, Any]) -> str:
        self.node(structure, 1)
        return "\n".join([*self.bitsets, f"static double t{self.index}(const double* x) {{", *self.lines, "}"])


_PRELUDE = """\
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define NF {n_features}
#define NT {n_trees}
#define CODEGEN {codegen}

/* LightGBM's kZeroThreshold is a float: 1e-35f, compared as a double */
static inline int is_zero(double v) {{ return v >= -1e-35f && v <= 1e-35f; }}

/* LightGBM's CategoricalDecision: NaN, negatives and values past the bitset go right */
static inline int cat_in(double v, const uint32_t* bits, int words) {{
  if (isnan(v) || !(v > -2147483649.0 && v < 2147483648.0)) return 0;
  int i = (int)v;
  if (i < 0 || (i >> 5) >= words) return 0;
  return (int)((bits[i >> 5] >> (i & 31)) & 1u);
}}
"""

_MAIN = """\
typedef double (*tree_fn)(const double*);
static const tree_fn TREES[NT] = {{{names}}};

int leap_n_features(void) {{ return NF; }}
int leap_n_trees(void) {{ return NT; }}
int leap_codegen_version(void) {{ return CODEGEN; }}

/* out[i] = sum of the trees on row i of X (n rows of NF doubles, C order), tree by tree over
   blocks of `block` rows; 0 on success */
int leap_predict(const double* X, long n, long block, double* out) {{
  double* rows = malloc((size_t)(n > 0 ? n : 1) * NF * sizeof(double));
  if (!rows) return -1;
  for (long j = 0; j < n * NF; j++) {{
    double v = X[j];
    rows[j] = (fabs(v) > 1e-35f || isnan(v)) ? v : 0.0;  /* as LightGBM reads a dense row */
  }}
  for (long i = 0; i < n; i++) out[i] = 0.0;
  /* tree by tree over a block of rows: the block stays in cache while every tree reads it */
  if (block < 1) block = 1;
  for (long b = 0; b < n; b += block) {{
    long end = b + block < n ? b + block : n;
    for (int t = 0; t < NT; t++) {{
      tree_fn f = TREES[t];
      for (long i = b; i < end; i++) out[i] += f(rows + i * NF);
    }}
  }}
  free(rows);
  return 0;
}}
"""


def c_source(dump: dict[str, Any]) -> str:
    """C source evaluating every tree of ``Booster.dump_model()`` (raises :class:`Unsupported`)."""
    if dump.get("num_class", 1) != 1 or dump.get("num_tree_per_iteration", 1) != 1:
        raise Unsupported("only single-output models are compiled")
    if dump.get("average_output"):
        raise Unsupported("averaged output (random forest) is not compiled")
    objective = str(dump.get("objective", "")).split()
    if not objective or objective[0] not in RAW_OBJECTIVES or "sqrt" in objective:
        raise Unsupported("objective whose output is not the raw score")
    n_features = _int(dump["max_feature_idx"]) + 1
    trees = dump["tree_info"]
    if not trees:
        raise Unsupported("a model without trees")
    parts = [_PRELUDE.format(n_features=n_features, n_trees=len(trees), codegen=int(CODEGEN_VERSION))]
    for i, tree in enumerate(trees):
        parts.append(_Tree(i, n_features).source(tree["tree_structure"]))
    parts.append(_MAIN.format(names=", ".join(f"t{i}" for i in range(len(trees)))))
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------- build and load


class CompiledTrees:
    """A compiled booster: :meth:`predict` scores a batch of rows in one C call.

    Parameters
    ----------
    library
        The shared library :func:`build_library` made.
    n_features
        Columns a row must have (the booster's).
    n_trees
        Trees the library must evaluate (the booster's); None: not checked.

    Raises
    ------
    StaleLibrary
        The library was made by another version of the code generator (its ``leap_predict``
        may take other arguments: calling it could crash the process) or for another booster.
    """

    def __init__(self, library: Path, n_features: int, n_trees: int | None = None) -> None:
        self.path = library
        self._lib = ctypes.CDLL(str(library))
        # Checked before leap_predict is ever called: a library whose signature differs crashes.
        version = getattr(self._lib, "leap_codegen_version", None)
        made_by = int(version()) if version is not None else None
        if made_by != int(CODEGEN_VERSION):
            # Unloaded, so that a library made again at this path is loaded afresh (dlopen would
            # hand back this one for the same path while it stays open).
            _ctypes.dlclose(self._lib._handle)
            raise StaleLibrary(f"{library.name} was made by code generator version {made_by}, "
                               f"this is version {CODEGEN_VERSION}")
        self._lib.leap_n_features.restype = ctypes.c_int
        self._call = self._lib.leap_predict
        self._call.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p]
        self.block = ROW_BLOCK
        self._call.restype = ctypes.c_int
        self.n_features = int(self._lib.leap_n_features())
        trees = int(self._lib.leap_n_trees())
        if self.n_features != n_features or (n_trees is not None and trees != n_trees):
            _ctypes.dlclose(self._lib._handle)
            raise StaleLibrary(f"{library.name} evaluates {trees} trees of {self.n_features} features, "
                               f"the booster has {n_trees} of {n_features}")

    def predict(self, data: np.ndarray, *, num_threads: int = 1) -> np.ndarray:
        """Raw scores of the rows of ``data`` (one thread; ``num_threads`` is accepted and ignored)."""
        x = np.ascontiguousarray(data, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise ValueError(f"expected rows of {self.n_features} columns, got shape {x.shape}")
        out = np.empty(len(x), dtype=np.float64)
        if len(x) and self._call(x.ctypes.data, len(x), self.block, out.ctypes.data) != 0:
            raise MemoryError("compiled trees could not allocate their row buffer")
        return out


def private_dir(path: Path) -> Path:
    """``path`` created 0700; refused (:class:`PermissionError`) if it is a symlink, another
    user's, or writable by others (a library planted there would be loaded)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{path} is not a plain folder")
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise PermissionError(f"{path} is not private to this user (owner {st.st_uid}, mode {st.st_mode & 0o777:o})")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def library_path(booster: lgb.Booster, cache_dir: Path) -> Path:
    """Where the booster's library is cached: named by the hash of the model's text, the code
    generator's version and the compiler flags (the same model gives the same library)."""
    text = str(booster.model_to_string())
    key = hashlib.sha256("\0".join((CODEGEN_VERSION, *CFLAGS, text)).encode()).hexdigest()
    return cache_dir / f"trees-{key[:40]}.so"


def build_library(source: str, library: Path, compiler: str) -> None:
    """Compile ``source`` into the shared library ``library``.

    Written under a temporary name and renamed, so that a process loading it never sees half a
    file and two processes compiling the same model at once both end with a whole one. The
    source is kept beside the library, to read what was compiled. The compiler runs in a process
    group of its own, so that :func:`stop_compiles` can end it with the programs it starts.
    """
    fd, tmp = tempfile.mkstemp(prefix=".trees-", suffix=".c", dir=library.parent)
    tmp_c = Path(tmp)
    tmp_so = tmp_c.with_suffix(".so")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(source)
        proc = subprocess.Popen([compiler, *CFLAGS, "-o", str(tmp_so), str(tmp_c)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        with _RUNNING_LOCK:
            _RUNNING[proc.pid] = (proc, (tmp_c, tmp_so))
        try:
            _, err = proc.communicate(timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise
        finally:
            with _RUNNING_LOCK:
                _RUNNING.pop(proc.pid, None)
        if proc.returncode != 0:
            last = (err.strip().splitlines() or ["no output"])[-1][:200]
            raise OSError(f"{compiler} exited with {proc.returncode}: {last}")
        os.replace(tmp_so, library)
        os.replace(tmp_c, library.with_suffix(".c"))
    finally:
        tmp_c.unlink(missing_ok=True)
        tmp_so.unlink(missing_ok=True)


#: Compilers running now, by pid, with their temporary files (:func:`stop_compiles`).
_RUNNING: dict[int, tuple[subprocess.Popen[str], tuple[Path, Path]]] = {}
_RUNNING_LOCK = threading.Lock()


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """End a compiler and what it started (``cc`` runs ``cc1`` and ``as``), and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


@atexit.register
def stop_compiles() -> None:
    """Kill the compilers this process still runs and remove their temporary files.

    A worker compiles in a daemon thread, which is dropped at exit without its clean-up: without
    this, a worker stopped mid-compile left the compiler running and its temporary files behind.
    Registered to run at exit; a process killed outright leaves them to :func:`prune`.
    """
    with _RUNNING_LOCK:
        running = list(_RUNNING.values())
        _RUNNING.clear()
    for proc, files in running:
        _kill_group(proc)
        for path in files:
            path.unlink(missing_ok=True)


def prune(folder: Path, keep: int = KEEP_LIBRARIES) -> None:
    """Delete all but the ``keep`` most recently used libraries (and their sources) in ``folder``.
    A process that has one loaded keeps it: the file goes, the mapping stays.

    Temporary files older than any compile may run are left-overs of a process killed while it
    compiled (:func:`stop_compiles` cannot run then): gone too.
    """
    libraries = sorted(folder.glob("trees-*.so"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in libraries[keep:]:
        old.unlink(missing_ok=True)
        old.with_suffix(".c").unlink(missing_ok=True)
    stale = time.time() - COMPILE_TIMEOUT_S
    for tmp in folder.glob(".trees-*"):
        with contextlib.suppress(FileNotFoundError):
            if tmp.stat().st_mtime < stale:
                tmp.unlink()


def find_compiler() -> str | None:
    """The system C compiler (``cc``, else ``gcc``), or None."""
    return shutil.which("cc") or shutil.which("gcc")


def trees_for(booster: lgb.Booster, cache_dir: Path, compiler: str | None = None) -> TreePredictor:
    """The booster's compiled evaluator, or the booster itself when it cannot be compiled.

    Parameters
    ----------
    booster
        A trained or loaded booster.
    cache_dir
        Folder of compiled libraries (created 0700), e.g. ``Settings.compiled_dir``; a library
        found there is loaded without compiling.
    compiler
        Path or name of the C compiler; None: :func:`find_compiler`.
    """
    try:
        library = library_path(booster, private_dir(cache_dir))
        if library.is_file():
            os.utime(library)  # used now: kept by prune()
            try:
                return CompiledTrees(library, booster.num_feature(), booster.num_trees())
            except StaleLibrary as exc:  # e.g. left by a development build: made again below
                log.warning("compiling again: %s", exc)
                library.unlink()
        source = c_source(booster.dump_model())
        cc = compiler or find_compiler()
        if cc is None:
            raise OSError("no C compiler found (cc, gcc)")
        build_library(source, library, cc)
        prune(library.parent)
        return CompiledTrees(library, booster.num_feature(), booster.num_trees())
    except (Unsupported, KeyError, OSError, subprocess.SubprocessError) as exc:
        log.warning("trees not compiled, LightGBM's own predict is used: %s", exc)
        return booster


def compile_boosters(boosters: dict[str, lgb.Booster | None], cache_dir: Path, compiler: str | None = None
                     ) -> dict[str, TreePredictor]:
    """:func:`trees_for` each booster that is not None, by name."""
    return {name: trees_for(b, cache_dir, compiler) for name, b in boosters.items() if b is not None}
