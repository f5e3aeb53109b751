"""The checks every metric runs on its columns, in one place.

Each metric of the package takes columns (one value per record) and refuses a bad one with a
``ValueError`` that names the argument. Those checks, and the orientation of a score by ``higher_is``,
are shared by the metric modules and by ``evaluate``, so they live here once and every message reads
the same. A metric's kernel (the function its bootstrap recomputes on every resample) takes the checked
columns this module returns; ``Kernel`` pairs the two.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

RULES = ("adarague", "helps")
SIGNS = ("positive", "negative")
NAN = float("nan")


class Kernel(NamedTuple):
    """How a metric of the library is recomputed on resamples.

    Attributes:
      fn: the metric on checked columns (NumPy arrays of one length), returning a float.
      prep: the metric's own checks: its arguments in, the checked columns ``fn`` takes out.
    """

    fn: Callable[..., float]
    prep: Callable[..., tuple]


def column(x, name: str, n: int | None = None) -> np.ndarray:
    """``x`` as a 1-D array of ``n`` values (any ``n`` when None).

    Raises:
      ValueError: ``x`` is not 1-D, or its length is not ``n``, naming ``name``.
    """
    try:
        a = np.asarray(x)
    except ValueError:  # a ragged nest of lists: NumPy's "setting an array element with a sequence"
        raise ValueError(f"{name}: expected a 1-D column (one value per record), got a ragged nest of "
                         "sequences") from None
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D column (one value per record), got shape {a.shape}")
    if n is not None and len(a) != n:
        raise ValueError(f"{name}: expected {n} values (one per record, as many as the other columns), "
                         f"got {len(a)}")
    return a


def numeric(a: np.ndarray, name: str) -> np.ndarray:
    """(N,) float64 of a column of numbers or bools.

    Raises:
      ValueError: a value that is not a number, naming ``name``.
    """
    if a.dtype == bool:
        return a.astype(np.float64)
    if a.dtype.kind == "O":
        # a string is refused here as in a str column ("0.1" is not read as a number), whatever float() says
        bad = next((i for i, x in enumerate(a) if isinstance(x, str | bytes)), None)
        if bad is None:
            try:
                return a.astype(np.float64)
            except (TypeError, ValueError):
                bad = next(i for i, x in enumerate(a) if not _is_number(x))
        raise ValueError(f"{name}: expected numbers, got {a[bad]!r} at index {bad}") from None
    if a.dtype.kind not in "iuf":
        raise ValueError(f"{name}: expected numbers, got dtype {a.dtype}")
    return a.astype(np.float64)


def _shown(x) -> str:
    """``x`` as an error message shows it: a NumPy scalar as the Python number it holds (2.0, nan)."""
    return repr(x.item() if isinstance(x, np.generic) else x)


def _is_number(x) -> bool:
    try:
        float(x)
    except (TypeError, ValueError):
        return False
    return True


def binary(x, name: str, n: int | None = None) -> np.ndarray:
    """(N,) bool from a bool or 0/1 column; anything else is a ValueError naming ``name``."""
    a = column(x, name, n)
    if a.dtype == bool:
        return a
    v = numeric(a, name)
    ok = (v == 0) | (v == 1)
    if not ok.all():
        # the value as the caller gave it (None, not the NaN NumPy reads it as) and where
        bad = int(np.flatnonzero(~ok)[0])
        raise ValueError(f"{name}: expected a binary column (bool or 0/1), got {_shown(a[bad])} at index {bad} "
                         f"({int((~ok).sum())} such record(s))")
    return v == 1


def sign_of(higher_is: str, name: str = "higher_is") -> float:
    """+1.0 for ``higher_is="positive"``, −1.0 for "negative"; anything else is a ValueError naming ``name``."""
    if higher_is not in SIGNS:
        raise ValueError(f"{name}: expected 'positive' (a higher score means the positive class) or "
                         f"'negative' (a higher score means the negative class), got {higher_is!r}")
    return 1.0 if higher_is == "positive" else -1.0


def score_column(x, name: str, n: int | None = None, higher_is: str = "positive") -> np.ndarray:
    """(N,) float64 score oriented so that higher means the positive class; NaN or ±inf is a ValueError."""
    sign = sign_of(higher_is)
    v = numeric(column(x, name, n), name)
    bad = ~np.isfinite(v)
    if bad.any():
        raise ValueError(f"{name}: expected finite scores, got {int(bad.sum())} NaN or infinite value(s) "
                         "(drop those records, or fill them, first)")
    return v if sign > 0 else -v


def counts(x, name: str, n: int | None = None) -> np.ndarray:
    """(N,) float64 of non-negative finite counts (or bools); anything else is a ValueError naming ``name``."""
    v = numeric(column(x, name, n), name)
    if not (np.isfinite(v).all() and (v >= 0).all()):
        raise ValueError(f"{name}: expected non-negative finite counts (or a bool per record)")
    return v


def check_rule(rule: str) -> str:
    """``rule`` if it is one of ``RULES`` (the retrieval oracle's rules), else a ValueError."""
    if rule not in RULES:
        raise ValueError(f"rule: expected one of {RULES}, got {rule!r}")
    return rule


def mean_or_nan(x: np.ndarray) -> float:
    """mean(x); NaN for an empty ``x`` (a metric with no record is undefined, not an error)."""
    return float(x.mean()) if len(x) else NAN


def correct_and_abstained(correct, abstained) -> tuple[np.ndarray, np.ndarray]:
    """(correct, abstained) as (N,) bool columns of one length (the selective and CRAG metrics' checks)."""
    c = binary(correct, "correct")
    return c, binary(abstained, "abstained", len(c))
