"""Intervals over questions: a bootstrap of any metric, paired differences of two gates, and the
minimum detectable difference.

A question may have several records (seeds, memory sets), and those records are not independent, so
every interval here resamples whole questions (``groups``), never single records. ``bootstrap``
recomputes a metric on ``n_boot`` resamples that draw G questions with replacement from the G in
``groups`` (a drawn question brings all its records, once per draw) and returns the percentile interval;
``paired_difference`` does the same for the difference of two gates on the same records (both gates on
the same draw), with the bootstrap SE and the minimum detectable difference at 80% power, two-sided
α = 0.05: (t_{0.975, G−1} + t_{0.80, G−1}) · SE with fewer than 30 questions, (z_{0.975} + z_{0.80}) · SE
= 2.80 · SE from 30 on.

A percentile interval over few questions is too narrow: with fewer than about 30 it covers less than
its level (docs/api/metrics.md gives a simulation's figures); read it beside the minimum detectable
difference, which uses t there.

The library's own metrics are checked once and then recomputed on every resample through their kernel
(each metric module's ``KERNELS``); any other callable runs as given. ``question_layout``,
``resamples`` and ``percentile_interval`` are the pieces ``evaluate`` shares, so every gate and metric
of its table is recomputed on the same draws.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from mdl_jax.evaluation.metrics import abstention, ranking, retrieval, selective
from mdl_jax.evaluation.metrics.columns import NAN, Kernel, column

N_BOOT = 2000
Z_A, Z_B = 1.959964, 0.841621  # two-sided α = 0.05, power 0.80 (minimum detectable differences)
MIN_GROUPS_Z = 30  # from this many questions on, the MDE uses z; below it, t with G − 1 degrees of freedom

# Student's t quantiles t_{0.975, df} and t_{0.80, df} for df = 1..29 (the MDE below 30 questions); SciPy
# is not a dependency of the library, and tests/test_evaluation_metrics.py checks them against
# scipy.stats.t.ppf.
_T_975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157,
          2.228139, 2.200985, 2.178813, 2.160369, 2.144787, 2.13145, 2.119905, 2.109816, 2.100922,
          2.093024, 2.085963, 2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831,
          2.048407, 2.04523)
_T_80 = (1.376382, 1.06066, 0.978472, 0.940965, 0.919544, 0.905703, 0.89603, 0.88889, 0.883404,
         0.879058, 0.87553, 0.872609, 0.870152, 0.868055, 0.866245, 0.864667, 0.863279, 0.862049,
         0.860951, 0.859964, 0.859074, 0.858266, 0.85753, 0.856855, 0.856236, 0.855665, 0.855137,
         0.854647, 0.854192)

_KERNELS: dict[Callable[..., Any], Kernel] = {
    **ranking.KERNELS, **abstention.KERNELS, **selective.KERNELS, **retrieval.KERNELS}


def _value(fn: Callable[..., float], cols: Sequence) -> float:
    """``fn(*cols)`` as a float; a ValueError naming ``metric`` when it is not one number (an array, None,
    a string: a TypeError or NumPy's words from deep inside, before)."""
    got = fn(*cols)
    if np.ndim(got) == 0:
        try:
            return float(got)
        except (TypeError, ValueError):
            pass
    raise ValueError(f"metric: expected one number from the metric, got {type(got).__name__} "
                     f"{repr(got)[:80]}")


def _kernel(metric: Callable[..., float], cols: list[np.ndarray], what: str = "columns"
            ) -> tuple[Callable[..., float], list]:
    if not callable(metric):
        raise ValueError(f"metric: expected a function of the columns returning a float, got "
                         f"{type(metric).__name__}")
    _check_arity(metric, len(cols), what)
    fast = _KERNELS.get(metric)
    if fast is None:
        return metric, cols
    return fast.fn, list(fast.prep(*cols))


def _check_arity(metric: Callable[..., float], k: int, what: str) -> None:
    # as many columns as the metric takes: else a TypeError from inside it (a library metric's private
    # checks named "_prep() missing 1 required positional argument"); a callable with no signature runs
    try:
        sig = inspect.signature(metric)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*range(k))
    except TypeError:
        takes = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        name = getattr(metric, "__name__", type(metric).__name__)
        raise ValueError(f"{what}: expected the columns {name} takes ({', '.join(takes)}), got {k} "
                         "column(s)") from None


class Estimate(NamedTuple):
    """A metric with its question-bootstrap percentile interval.

    Attributes:
      value: the metric on all records.
      lo: the interval's lower end; NaN with fewer than 2 questions or no finite resample.
      hi: its upper end.
      n: records.
      n_groups: questions (the resampled units).
    """

    value: float
    lo: float
    hi: float
    n: int
    n_groups: int


class Difference(NamedTuple):
    """The difference of one metric between two gates on the same records.

    Attributes:
      value: metric(gate a) − metric(gate b) on all records.
      lo: the lower end of its question-bootstrap percentile interval.
      hi: the upper end.
      n: records.
      n_groups: questions.
      se: the bootstrap standard error of the difference (the resamples' standard deviation).
      mde: the minimum detectable difference at 80% power, two-sided α = 0.05 (``mde_for``).
    """

    value: float
    lo: float
    hi: float
    n: int
    n_groups: int
    se: float
    mde: float


_CHUNK = 256  # resamples drawn per call of the generator


class Layout(NamedTuple):
    """Records grouped by question, for drawing whole questions."""

    order: np.ndarray   # records sorted by question
    starts: np.ndarray  # (G,) first position of each question in ``order``
    sizes: np.ndarray   # (G,) records per question


def question_layout(groups, n: int) -> Layout:
    """The records of each question in ``groups`` ((N,) ids; None: every record its own question).

    Raises:
      ValueError: ``groups`` not 1-D of ``n`` values, holding a missing id (NaN, None, pandas' NA) or
        ids that cannot be ordered against each other (numbers beside strings).
    """
    inv = np.arange(n) if groups is None else group_index(groups, n)
    sizes = np.bincount(inv, minlength=int(inv.max()) + 1 if n else 0)
    return Layout(np.argsort(inv, kind="stable"), np.cumsum(sizes) - sizes, sizes)


def group_index(groups, n: int | None = None) -> np.ndarray:
    """(N,) index 0..G−1 of each record's question, in the sorted order of the ids in ``groups``.

    Raises:
      ValueError: ``groups`` not 1-D (of ``n`` values when given), holding a missing id (NaN, None,
        pandas' NA) or ids that cannot be ordered against each other (numbers beside strings).
    """
    g = column(groups, "groups", n)
    if g.dtype.kind == "O":
        _refuse_missing_ids(g)
    if g.dtype.kind == "f" and np.isnan(g).any():
        raise ValueError(f"groups: expected a question id per record, got NaN at index "
                         f"{int(np.flatnonzero(np.isnan(g))[0])}")
    try:
        _, inv = np.unique(g, return_inverse=True)
    except TypeError:
        raise ValueError("groups: expected question ids that can be ordered against each other (all "
                         "strings, all numbers, ...), got a mix") from None
    return inv.reshape(-1)


def _refuse_missing_ids(g: np.ndarray) -> None:
    # Question ids held as Python objects (a pandas object or string column): a missing id would
    # otherwise reach np.unique's sort as a bare TypeError.
    for i, x in enumerate(g):
        if x is None or (isinstance(x, float | np.floating) and x != x) or type(x).__name__ == "NAType":
            raise ValueError(f"groups: expected a question id per record, got a missing id ({x!r}) at index {i}")


def resamples(lay: Layout, n_boot: int, seed: int) -> Iterator[np.ndarray]:
    """Record indices of ``n_boot`` resamples, each G questions drawn with replacement (all their records)."""
    G = len(lay.sizes)
    rng = np.random.default_rng(seed)
    for b0 in range(0, n_boot, _CHUNK):
        d = rng.integers(0, G, size=(min(_CHUNK, n_boot - b0), G))
        lens = lay.sizes[d].ravel()
        end = np.cumsum(lens)
        # each drawn question's records, at their places in the concatenation of the chunk's resamples
        pos = np.repeat(lay.starts[d].ravel() - (end - lens), lens) + np.arange(end[-1])
        yield from np.split(lay.order[pos], end[G - 1::G][:-1])


def percentile_interval(est: np.ndarray, level: float) -> tuple[float, float]:
    """The ``level`` percentile interval of the finite resampled estimates; (NaN, NaN) when none is finite."""
    est = est[np.isfinite(est)]
    if not len(est):
        return NAN, NAN
    q = round(50 * (1 - level), 10)
    lo, hi = np.percentile(est, [q, 100 - q])
    return float(lo), float(hi)


def check_boot(n_boot: int, level: float) -> None:
    """A ValueError naming ``n_boot`` (not a positive int) or ``level`` (not in (0, 1))."""
    check_count(n_boot, "n_boot")
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0 < level < 1:
        raise ValueError(f"level: expected a confidence level in (0, 1), got {level!r}")


def check_count(value: int, name: str, least: int = 1) -> None:
    """A ValueError naming ``name`` when ``value`` is not an integer (Python's or NumPy's, not a bool) of
    at least ``least``: a resample count (1), a seed (0)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        kind = {0: "a non-negative integer", 1: "a positive integer"}.get(least, f"an integer ≥ {least}")
        raise ValueError(f"{name}: expected {kind}, got {value!r}")


def check_seed(seed: int) -> None:
    """A ValueError naming ``seed`` when it is not a non-negative integer (NumPy's generators need one)."""
    check_count(seed, "seed", 0)


def _columns(columns: Sequence, name: str, n: int | None = None) -> list[np.ndarray]:
    # One column (an array, a pandas Series, a list of numbers) or a sequence of columns: a sequence
    # whose items are themselves scalars is one column; a DataFrame is its columns, in order (iterating
    # over it gives its column names, which were read as one column of strings).
    if hasattr(columns, "columns") and hasattr(columns, "iloc"):
        columns = [columns[c] for c in columns.columns]
    if isinstance(columns, np.ndarray) and columns.ndim == 1:
        columns = (columns,)
    elif not isinstance(columns, np.ndarray | str):
        columns = list(columns)   # once: an iterator of columns is read here, not consumed by the test
        if columns and np.ndim(columns[0]) == 0:
            columns = (columns,)
    cols = list(columns)
    if not cols:
        raise ValueError(f"{name}: expected at least one column")
    n = len(np.asarray(cols[0])) if n is None else n
    return [column(c, f"{name}[{i}]", n) for i, c in enumerate(cols)]


def _check_se(se: float) -> None:
    if isinstance(se, bool) or not isinstance(se, numbers.Real) or se < 0:
        raise ValueError(f"se: expected a non-negative standard error, got {se!r}")


def mde(se: float) -> float:
    """Minimum detectable difference at 80% power, two-sided α = 0.05: (z_0.975 + z_0.80) · SE.

    Raises:
      ValueError: ``se`` negative or not a number (as ``mde_for``).
    """
    _check_se(se)
    return float((Z_A + Z_B) * se)


def mde_for(se: float, n_groups: int) -> float:
    """Minimum detectable difference at 80% power, two-sided α = 0.05, for ``n_groups`` questions.

    Args:
      se: the standard error of the difference.
      n_groups: the questions behind it.

    Returns:
      (t_{0.975, G−1} + t_{0.80, G−1}) · SE for G < 30 questions (the SE is itself estimated from few
      units, so z would understate it), ``mde(se)`` from 30 on; NaN for G < 2.

    Raises:
      ValueError: ``se`` negative or not a number; ``n_groups`` not an integer.
    """
    if isinstance(n_groups, bool) or not isinstance(n_groups, numbers.Integral):
        raise ValueError(f"n_groups: expected a whole number of questions, got {n_groups!r}")
    _check_se(se)
    if n_groups < 2:
        return NAN
    if n_groups < MIN_GROUPS_Z:
        return float((_T_975[n_groups - 2] + _T_80[n_groups - 2]) * se)
    return mde(se)


def bootstrap(metric: Callable[..., float], *columns, groups=None, n_boot: int = N_BOOT, seed: int = 0,
              level: float = 0.95) -> Estimate:
    """Any metric of record columns with a percentile interval from a bootstrap over questions.

    Each resample draws G questions with replacement from the G in ``groups`` and recomputes
    ``metric`` on all records of the drawn questions (a question drawn twice brings its records twice).
    Resamples where the metric is undefined (NaN: e.g. one class only) are left out of the interval.

    Args:
      metric: a function of the columns returning a float, e.g. ``auroc`` or ``lambda c, a: ...``.
      *columns: (N,) arrays passed to ``metric`` in this order.
      groups: (N,) question ids; None: every record its own question.
      n_boot: resamples.
      seed: the resampling seed (the same seed draws the same questions for every metric).
      level: the interval's confidence level.

    Returns:
      ``Estimate(value, lo, hi, n, n_groups)``; lo, hi NaN with fewer than 2 questions.

    Raises:
      ValueError: no column, more or fewer columns than ``metric`` takes, columns of different lengths
        or not 1-D, a missing group, a bad ``n_boot``, ``seed`` or ``level``; and whatever ``metric``
        raises on its columns.
    """
    check_boot(n_boot, level)
    check_seed(seed)
    cols = _columns(columns, "columns")
    n = len(cols[0])
    lay = question_layout(groups, n)
    G = len(lay.sizes)
    fn, cols = _kernel(metric, cols)
    value = _value(fn, cols)
    if G < 2:
        return Estimate(value, NAN, NAN, n, G)
    est = np.array([fn(*(c[i] for c in cols)) for i in resamples(lay, n_boot, seed)], np.float64)
    return Estimate(value, *percentile_interval(est, level), n, G)


def paired_difference(metric: Callable[..., float], cols_a, cols_b, groups=None, *, n_boot: int = N_BOOT,
                      seed: int = 0, level: float = 0.95) -> Difference:
    """metric(gate a) − metric(gate b) on the same records, with its interval, SE and MDE.

    Both gates are scored on the same resampled questions, so what the questions share cancels out.

    Args:
      metric: a function of columns returning a float.
      cols_a: gate a's columns for ``metric``: a sequence (or iterator) of (N,) columns, one column
        (an array, a pandas Series, a list of numbers), or a DataFrame (its columns, in order).
      cols_b: gate b's columns, the same records in the same order.
      groups: (N,) question ids; None: every record its own question.
      n_boot: resamples.
      seed: the resampling seed.
      level: the interval's confidence level.

    Returns:
      ``Difference(value, lo, hi, n, n_groups, se, mde)``: se is the standard deviation of the
      resampled differences; mde is ``mde_for(se, n_groups)`` (t below 30 questions, z from 30). A gate
      against itself gives 0 with lo = hi = se = mde = 0.

    Raises:
      ValueError: as ``bootstrap``, for either gate's columns.
    """
    check_boot(n_boot, level)
    check_seed(seed)
    a = _columns(cols_a, "cols_a")
    n = len(a[0])
    b = _columns(cols_b, "cols_b", n)
    lay = question_layout(groups, n)
    G = len(lay.sizes)
    fn, a = _kernel(metric, a, "cols_a")
    _, b = _kernel(metric, b, "cols_b")
    value = _value(fn, a) - _value(fn, b)
    if G < 2:
        return Difference(value, NAN, NAN, n, G, NAN, NAN)
    d = np.array([float(fn(*(c[i] for c in a))) - float(fn(*(c[i] for c in b)))
                  for i in resamples(lay, n_boot, seed)], np.float64)
    d = d[np.isfinite(d)]
    se = float(d.std(ddof=1)) if len(d) > 1 else NAN
    return Difference(value, *percentile_interval(d, level), n, G, se, mde_for(se, G))
