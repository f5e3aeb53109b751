"""Checks at the public edge: bad input raises a ValueError naming the argument and the first bad index.

Concrete inputs (Python numbers, NumPy arrays, JAX arrays) are checked eagerly before any compiled code
runs. Inside someone else's ``jit``/``vmap`` the values are tracers and cannot be inspected; there, use
``mdl_jax.checked_decide`` (checkify), which reports instead of returning NaN.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np

# What the public functions take for signals and labels: Python numbers, (nested) lists, NumPy or JAX
# arrays, and JAX tracers inside a caller's jit/vmap/grad, i.e. what ``jnp.asarray`` takes. Any to the
# type checker, on purpose: these functions check the values themselves at run time (dtype, shape and
# range, errors naming the argument) and then rebind the names to arrays, and numpy.typing.ArrayLike's
# union (str and bytes in, float only through complex) made mypy call decide's one-float fast path
# unreachable and skip checking it.
ArrayLike: TypeAlias = Any


def is_traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def first_index(bad) -> tuple:
    """The index of the first True of ``bad`` (C order) as a tuple of ints; () for a 0-d ``bad``."""
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), np.shape(bad)))


@functools.cache
def is_real_dtype(dtype) -> bool:
    """Integers and floats (bfloat16 included: NumPy gives it kind 'V'); not bool, complex, text.

    Cached per dtype: it runs several times per ``decide`` call, and jnp.issubdtype is not free.
    """
    return dtype != np.bool_ and (jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating))


def zero_d_number(x: Any) -> Any:
    """``x`` as the Python number it holds where it is a 0-d NumPy or JAX array of a real dtype
    (``is_real_dtype``: JAX's bfloat16 and float8 too); anything else as it is, for the caller to
    refuse. A threshold or score handed over as ``jnp.float32(0.3)`` is that number."""
    dtype = getattr(x, "dtype", None)
    if getattr(x, "ndim", None) != 0 or not isinstance(dtype, np.dtype) or not is_real_dtype(dtype):
        return x
    return np.asarray(x).item()


def _dtype_error(name: str, dtype) -> ValueError:
    return ValueError(f"{name}: expected real numbers in [0, 1], got dtype {dtype}")


def check_unit_interval(name: str, x) -> None:
    """Raise ValueError unless every value of ``x`` is finite and inside [0, 1] (and concrete: a tracer
    has no values to check)."""
    if isinstance(x, (bool, np.bool_)):
        raise ValueError(f"{name}: expected a number in [0, 1], got the bool {x!r}")
    if is_traced(x):
        # (its callers read the records on the host: NumPy's conversion error would call a valid
        # array "not an array of real numbers", in several lines)
        raise ValueError(f"{name}: expected concrete values, got a traced array of shape {tuple(x.shape)} "
                         "(a caller's jit, vmap or grad); this function reads its records on the host, so "
                         "call it outside the transformation")
    if isinstance(x, (int, float)):
        if not math.isfinite(x):
            raise ValueError(f"{name}: expected a finite number in [0, 1], got {x!r}")
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"{name}: expected a value in [0, 1], got {x!r}")
        return
    if _on_accelerator(x) and is_real_dtype(x.dtype) and x.size:
        # Arrays on a GPU are checked where they live: two reductions, two scalars back. Only a bad
        # array is copied to the host, to find the first offending index for the message.
        lo, hi = _min_max(x)
        if float(lo) >= 0 and float(hi) <= 1:
            return
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError, OverflowError) as e:  # ragged nested lists and the like
        raise ValueError(f"{name}: expected a number or an array of real numbers in [0, 1] ({e})") from None
    if not is_real_dtype(arr.dtype):
        raise _dtype_error(name, arr.dtype)
    if arr.size == 0:
        return
    if arr.dtype.kind == "V":  # ml_dtypes' bfloat16 warns on NaN comparisons, NumPy's floats do not
        with np.errstate(invalid="ignore"):
            return _check_values(name, arr)
    return _check_values(name, arr)


def _check_values(name: str, arr: np.ndarray) -> None:
    # Fast path for the common, valid case: two streaming reductions and no temporaries. NaN makes
    # both comparisons False and ±inf fails them, so every bad array falls through to the slow path,
    # which finds the first offending index for the message.
    if arr.min() >= 0 and arr.max() <= 1:
        return
    # One mask for every reason (NaN fails both comparisons), so the index named is the first bad
    # one whatever is wrong with it, not the first of one kind.
    i = first_index(~((arr >= 0) & (arr <= 1)))
    v = arr[i]
    what = "values in [0, 1]" if np.isfinite(v) else "finite values in [0, 1]"
    where = name if arr.ndim == 0 else f"{name}[{_fmt(i)}]"  # a 0-d array has no index to name
    raise ValueError(f"{name}: expected {what}; {where} = {plain(v)}")


def check_weight_values(name: str, w: np.ndarray) -> None:
    """Raise ValueError unless every weight is finite and non-negative, naming the first one that is
    not, as the signals' checks do (``weights[0, 3] = -1.0``)."""
    bad = ~(np.isfinite(w) & (w >= 0))
    if bad.any():
        i = first_index(bad)
        where = name if w.ndim == 0 else f"{name}[{_fmt(i)}]"
        raise ValueError(f"{name}: expected finite, non-negative weights; {where} = {plain(w[i])}")


def plain(v) -> str:
    """A value as a user wrote it: ``1.5``, ``nan``, ``-inf``, ``2`` (NumPy scalars print their number,
    not ``np.float32(1.5)``; a float32 prints its shortest float32 form, not float64 digits)."""
    if isinstance(v, np.generic):
        return str(v)
    return repr(v)


def _on_accelerator(x) -> bool:
    if not isinstance(x, jax.Array) or is_traced(x):
        return False
    try:
        return any(d.platform != "cpu" for d in x.devices())
    except (RuntimeError, ValueError):  # e.g. a deleted array: let np.asarray raise the real error
        return False


@jax.jit
def _min_max(x):
    return jnp.min(x), jnp.max(x)


def _fmt(idx: tuple) -> str:
    return ", ".join(str(i) for i in idx) if idx else ""


def common_shape(names: Sequence[str], values: Sequence) -> tuple:
    """The shared shape of the signals. 0-d values broadcast; any other mismatch is an error."""
    shapes = [tuple(np.shape(v)) for v in values]
    full = [s for s in shapes if s != ()]
    if not full:
        return ()
    ref_name, ref = next((n, s) for n, s in zip(names, shapes) if s != ())
    for n, s in zip(names, shapes):
        if s not in ((), ref):
            raise ValueError(
                f"{n}: expected shape {ref} (the shape of {ref_name}) or a scalar, got shape {s}")
    return ref


def as_float_array(x, name: str = "x", dtype=None) -> jax.Array:
    """Signals as a floating JAX array; ints become float32, float64 stays if x64 is on.

    The dtype is checked for traced input too (it is known at trace time): bool, complex or text
    signals are a ValueError naming the argument, never silently cast (complex would lose its
    imaginary part).
    """
    if isinstance(x, (np.ndarray, np.generic)) and not x.dtype.isnative:
        # Big-endian arrays (from binary files, FITS, the network) are real numbers too; JAX refuses
        # a non-native byte order, so swap it here rather than call them "not real numbers".
        x = np.asarray(x).astype(x.dtype.newbyteorder("="))
    if isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind in "iu" and x.dtype.itemsize > 4 \
            and not jax.config.jax_enable_x64:
        # Without x64, JAX wraps 64-bit ints to int32 (2^62 becomes 0, a valid signal that checkify
        # then passed): convert to float32 here, where 2^62 stays 4.6e18 and fails the range check.
        x = x.astype(np.float32)
    try:
        x = jnp.asarray(x, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as e:  # text, ragged lists, ints beyond int64
        raise ValueError(f"{name}: expected a number or an array of real numbers ({e})") from None
    if not is_real_dtype(x.dtype):
        raise _dtype_error(name, x.dtype)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float32)
    return x


def binary_labels(adopt, n: int | None = None) -> np.ndarray:
    """Oracle labels ``adopt`` as a bool array: bool, or real numbers that are all 0 or 1 (ValueError
    naming ``adopt`` and the first bad index otherwise); with ``n``, also exactly shape (n,)."""
    try:
        labels = np.asarray(adopt)
    except (TypeError, ValueError) as e:
        raise ValueError(f"adopt: expected binary labels (0/1 or bool) ({e})") from None
    if n is not None and labels.shape != (n,):
        raise ValueError(f"adopt: expected shape ({n},) (one label per record), got {labels.shape}")
    if labels.dtype == np.bool_:
        return labels
    if not is_real_dtype(labels.dtype):
        raise ValueError(f"adopt: expected binary labels (0/1 or bool), got dtype {labels.dtype}")
    bad = ~((labels == 0) | (labels == 1))  # NaN is neither
    if np.any(bad):
        i = first_index(bad)
        where = f"; adopt[{', '.join(map(str, i))}] = {plain(labels[i])}" if i else f", got {plain(labels[()])}"
        raise ValueError(f"adopt: expected binary labels (0 = reject, 1 = adopt){where}")
    return labels.astype(bool)
