"""The lexical conflict detector in C++ (``_native/conflict.cc``): ``conflict``'s flags for many stores
per call.

``conflict.analyse`` / ``analyses_conflict`` stay the definition. This library computes the same flags, pair by
pair (tests/test_conflict_native.py: generated texts, and every store of the bundled datasets), with the
word lists handed over from ``conflict`` when the library is loaded, so they live in one place. The
gate's cached bulk path spent about half of its time in the Python detector; natively the detector is
a small share of a row of ``experiments.bench_gate`` (its four relevant memories, six pairs), the
texts' encoding included.

It is built with the system C++ compiler on first use (portable flags: no ``-march``), cached under
``$MDL_JAX_CACHE_DIR/native`` keyed by source, compiler and flags, and loaded only when its bytes match
the record its build wrote (``mdl_jax.engines.native.verified``). No compiler, a failed build or
``MDL_JAX_NATIVE=0`` (the switch of all native code) leave the Python detector in use: the same flags,
slower. ``available()`` says which one runs.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mdl_jax.engines import native as _native
from mdl_jax.signals import conflict as _py

_SOURCE = Path(__file__).with_name("_native") / "conflict.cc"
FLAGS = ["-O2", "-std=c++17", "-fPIC", "-shared", "-w"]
_STATE: dict = {}
_LOCK = threading.Lock()


def library_path(cache_dir: Path | None = None) -> Path:
    """Where the built library lives: keyed by the source, the compiler, its flags and the machine."""
    return _native.source_library_path(_SOURCE, FLAGS, "conflict", cache_dir)


def _lines(words) -> bytes:
    return "\n".join(words).encode("ascii")


def _load():
    lib = _native.load_source_library(_SOURCE, FLAGS, library_path())
    lib.MdlLexNew.restype = ctypes.c_void_p
    lib.MdlLexNew.argtypes = [ctypes.c_char_p, ctypes.c_int64] * 4 + [ctypes.c_double]
    lib.MdlLexFree.argtypes = [ctypes.c_void_p]
    lib.MdlLexFlags.restype = ctypes.c_int64
    lib.MdlLexFlags.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64,
                                ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    lists = [_lines(sorted(_py.NEGATORS)), _lines(sorted(_py.STOPWORDS)),
             _lines(f"{a} {b}" for a, b in _py.ANTONYMS), _lines(_py.IGNORED_PHRASES)]
    args = [x for b in lists for x in (b, len(b))]
    handle = lib.MdlLexNew(*args, ctypes.c_double(_py.MIN_SHARED))
    if not handle:
        raise _native.NativeBuildError("the conflict library refused conflict.py's word lists")
    return {"lib": lib, "handle": handle, "fn": lib.MdlLexFlags}


def available(warn: bool = True) -> bool:
    """True when the native detector is loaded (built on the first call); False: the Python one runs.
    A failed build warns once, on the first call with ``warn``."""
    return _native.load_once(_STATE, _LOCK, _load, "native conflict detector", "the Python one", warn)


def _prepare(t: str) -> str:
    # what conflict.analyse does before its ASCII-only steps, for a text that is not ASCII
    return t.lower().replace("’", "'")


def _encode(texts: Sequence[str]) -> tuple[bytes, np.ndarray]:
    """(the texts' bytes back to back, their n + 1 offsets)."""
    joined = "".join(texts)
    off = np.zeros(len(texts) + 1, np.int64)
    if joined.isascii():  # the common case: one encode, character offsets are byte offsets
        np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)), out=off[1:])
        return joined.encode("ascii"), off
    # lone surrogates become bytes >= 0x80 too: separators, as they are to the Python pattern
    bs = [t.encode("ascii") if t.isascii() else _prepare(t).encode("utf-8", "surrogatepass") for t in texts]
    np.cumsum(np.fromiter(map(len, bs), np.int64, len(bs)), out=off[1:])
    return b"".join(bs), off


def _check_sizes(texts: Sequence[str], sizes: np.ndarray) -> None:
    if len(sizes) and int(sizes.min()) < 0:
        raise ValueError(f"sizes: expected group sizes ≥ 0, got {int(sizes.min())}")
    if int(sizes.sum()) != len(texts):
        raise ValueError(f"sizes: expected group sizes summing to the {len(texts)} texts, got {int(sizes.sum())}")


def _plain(texts: Sequence[str]) -> bool:
    # Only plain str goes native: a subclass may override len() or lower() (which analyse calls), so
    # the Python detector, the definition, answers for it.
    return set(map(type, texts)) <= {str}  # the types in one C-level pass: a third of the generator's cost


def _call(texts: Sequence[str], sizes: np.ndarray, want_flags: bool):
    _check_sizes(texts, sizes)
    data, off = _encode(texts)
    start = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=start[1:])
    counts = np.empty(len(sizes), np.int64)
    flags = None
    if want_flags:
        flags = np.empty(int((sizes * (sizes - 1) // 2).sum()), np.uint8)
    done = _STATE["fn"](_STATE["handle"], data, off.ctypes.data, len(texts), start.ctypes.data, len(sizes),
                        None if flags is None else flags.ctypes.data, counts.ctypes.data)
    if done < 0:  # -2: group starts out of range (checked above); -1: an allocation failed in C++
        raise (MemoryError("the native conflict detector could not allocate its buffers") if done == -1
               else RuntimeError("the native conflict detector refused the group starts (a bug)"))
    return counts, flags


def group_counts(texts: Sequence[str], sizes) -> np.ndarray:
    """How many pairs conflict within each group of texts.

    The native detector answers when ``available()`` and every text is a plain ``str``; otherwise the
    Python one (the same counts).

    Args:
      texts: the groups' texts back to back (N strings).
      sizes: (G,) the groups' lengths, each ≥ 0, summing to N.

    Returns:
      (G,) int64: per group, the number of its pairs i < j that ``conflict`` flags.

    Raises:
      ValueError: ``sizes`` with a negative entry or not summing to ``len(texts)``.
    """
    sizes = np.asarray(sizes, np.int64).reshape(-1)
    if available() and _plain(texts):
        return _call(texts, sizes, False)[0]
    _check_sizes(texts, sizes)
    out = np.zeros(len(sizes), np.int64)
    it = iter(texts)
    for g, n in enumerate(sizes.tolist()):
        an = [_py.analyse(t) for t in itertools.islice(it, n)]
        out[g] = sum(_py.analyses_conflict(x, y) for x, y in itertools.combinations(an, 2))
    return out


def pair_flags(texts: Sequence[str]) -> list[list[bool]]:
    """``conflict.pair_flags``, natively when ``available()`` (and every text is a plain ``str``).

    Args:
      texts: the S memory texts of one store.

    Returns:
      S lists of S booleans: symmetric, the diagonal False, True where the two texts conflict.
    """
    n = len(texts)
    if not available() or n < 2 or not _plain(texts):
        return _py.pair_flags(texts)
    flags = _call(texts, np.array([n], np.int64), True)[1].astype(bool)
    out = np.zeros((n, n), bool)
    iu, ju = np.triu_indices(n, 1)
    out[iu, ju] = out[ju, iu] = flags
    return out.tolist()


def status() -> dict:
    """{"available": bool, "path" or "error"}: which detector runs, and why (a
    failure is said here, not warned of)."""
    ok = available(warn=False)
    error = _STATE.get("error", "") if _native.enabled() else f"{_native.ENV_SWITCH}=0"
    return {"available": ok, **({"path": str(library_path())} if ok else {"error": error})}

