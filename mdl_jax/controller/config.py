"""The controller's frozen configuration: Table 2 of the paper, zero trained parameters.

Numeric fields are pytree leaves, so ``jax.vmap`` and ``jax.grad`` run over them (sensitivity sweeps,
gradient-tuned gates). Structural fields (dimensions, QR seed, ablation switches) are static: they choose
shapes and branches at trace time and take part in the jit cache key.

Each field's facts (leaf or static, its shape in one config, its range) are declared once, beside the
field, as ``FieldSpec`` metadata; validation, config files, the sweep's batches, the kernels' shape
checks and tuning read them through ``field_specs()``, so a new field is one declaration.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax.controller.validation import first_index

# The smallest σ: 2^-63, the square root of float32's smallest normal number (see FieldSpec's sigma row).
SIGMA_MIN = 2.0 ** -63


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """What the package knows about one ``MDLConfig`` field, written once beside the field.

    Validation, the config file format, the sweep's batching, the native kernel's shape checks and
    tuning's static set all read these declarations (``field_specs()``), so adding a field to
    ``MDLConfig`` with its spec is the whole change for every one of them.

    Attributes:
      leaf: True for a numeric pytree leaf (traceable; batched with a leading axis K in a sweep);
        False for a static field (part of the jit cache key).
      shape: a leaf's shape for one config: () for a number, (n,) for a vector of n values.
      or_d_vector: a leaf that may also hold one value per value-vector coordinate, shape (D,).
      components: names of a vector leaf's components, one per value, so a grid can vary one alone.
      low: the least value a leaf may take (inclusive), or None.
      high: the greatest value a leaf may take (inclusive), or None.
      descending: a vector leaf whose values must not increase.
      above: a leaf this one must exceed, config by config.
      zero_or_below_min_of: a vector leaf whose smallest value this one must stay under, unless it is 0.
      what: the rule in words, as an error message says what was expected.
      check: for a static field, a function of (value, config) giving what was expected when the value
        is wrong, else None.
    """

    leaf: bool
    shape: tuple[int, ...] = ()
    or_d_vector: bool = False
    components: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None
    descending: bool = False
    above: str | None = None
    zero_or_below_min_of: str | None = None
    what: str = "finite values"
    check: Callable[[Any, Any], str | None] | None = None


def _leaf(default, **spec) -> Any:
    return dataclasses.field(default=default, metadata={"mdl": FieldSpec(leaf=True, **spec)})


def _static(default, check: Callable[[Any, Any], str | None]) -> Any:
    return dataclasses.field(default=default, metadata={"mdl": FieldSpec(leaf=False, check=check)})


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _check_D(v, cfg) -> str | None:
    return None if _is_int(v) and v > 0 else "a positive int"


def _check_dims(v, cfg) -> str | None:
    # dims is static (part of the jit cache key), so it must be hashable: a tuple, not a list
    if not (isinstance(v, tuple) and len(v) == 3 and all(_is_int(d) and d > 0 for d in v)):
        return "a tuple of three positive ints"
    # named with D: a caller who set only D would otherwise read of dims they never gave
    return None if sum(v) == cfg.D else f"dimensions summing to D={cfg.D} (set D and dims together)"


def _check_seed(v, cfg) -> str | None:
    return None if _is_int(v) and v >= 0 else "a non-negative int"


def _check_subspaces(v, cfg) -> str | None:
    return None if v in ("qr", "identity") else "'qr' or 'identity'"


def _check_bool(v, cfg) -> str | None:
    return None if isinstance(v, bool) else "a bool"


@dataclasses.dataclass(frozen=True)
class MDLConfig:
    """Hyperparameters of the MDL controller (paper, Table 2, and Sections 3.2-3.4).

    Frozen: change fields with ``replace``. Numeric fields are pytree leaves (traceable numbers:
    ``jax.vmap`` / ``jax.grad`` run over them, and a batch of configs, built by ``config_grid`` or
    ``stack_configs``, holds them with a leading axis K); static fields choose shapes and branches
    at trace time and are part of the jit cache key. The defaults are the paper's (n_min and n_max by
    its Section 3.4 rule on this project's calibration split: see ``n_min``). Each field's kind,
    shape and range are declared beside it (``FieldSpec``, read through ``field_specs()``).

    Examples:
      >>> cfg = MDLConfig().replace(thresholds=(0.7, 0.5, 0.3))
      >>> ablated = MDLConfig(alpha_gating=False)       # Table 7(a): w/o α gating

    Attributes:
      sigma: σ, width of the Gaussian value-encoding peaks (paper: 0.20). Numeric.
      eps_c: ε_c, cross-subspace leakage in W_k = s_k Π_k + ε_c Σ_{j≠k} Π_j (eq. 1; paper: 0.10);
        Theorem 1 needs eps_c < min(gains). Numeric.
      gains: s = (s_wm, s_r, s_a), the principal gains of eq. (1): (1.0, 0.7, 0.5). Numeric, (3,).
      g_A_coeffs: (a, b) of the risk gain g_A = a + b·mean(v_a); paper (0.5, 0.5). Numeric, (2,).
      gate_coeffs: (g_a, g_b), the α gating coefficients of C_final = C·(g_a + g_b·α); paper
        (0.3, 0.7). Numeric, (2,).
      thresholds: θ = (θ0, θ1, θ2), descending; paper (0.6, 0.4, 0.2). C_final ≥ θ0 → Active,
        ≥ θ1 → Supp, ≥ θ2 → Silent, else Opt-Out (a value exactly on a threshold takes the higher
        action). Numeric, (3,).
      bias: the fusion bias b of v_meta = tanh(... + b). The paper writes +b but never gives a value;
        we use the scalar 0 broadcast over D, which keeps the controller parameter-free. Numeric, a
        scalar or (D,).
      n_min: n_min, the lower end of the normalisation of the raw norm ‖v_meta‖ into C (eq. 2). The
        paper takes n_min and n_max from the calibration split: the minimum and maximum of
        ‖v_meta‖ over the calibration questions (Section 3.4). The defaults are computed the
        paper's way: over the signals of the TruthfulQA calibration split (80 questions, split seed
        0) under the other defaults here, by ``mdl_repro.pipeline.defaults.deployed_norm_range`` (no
        LLM needed; a test recomputes and pins them). An earlier version used the range over the
        whole signal cube [0, 1]^3 (``signal_cube_norm_range``: 1.252-3.281), which left an
        uncalibrated controller Active for 64% of the cube; real signals occupy the top of that
        range, so the deployed range is narrower and all four actions occur on ordinary inputs
        (``mdl-jax demo``). Numeric.
      n_max: n_max, the upper end of that normalisation (see ``n_min``). Numeric.
      D: D, the value-vector dimension (16). Static.
      dims: (d_wm, d_r, d_a), the subspace dimensions (5, 5, 6), summing to D. Static.
      qr_seed: seed of the random matrix R_rand whose QR decomposition gives the subspace bases
        (42). The paper does not say which random matrix; we use a standard-normal D×D matrix from
        ``numpy.random.default_rng(qr_seed)`` (stable across NumPy versions) and fix the QR sign so
        that diag(R) > 0, which makes Q unique. Static.
      alpha_gating: ablation switch of Table 7(a): False drops the α gate (C_final = C). Static.
      risk_modulation: ablation switch: False fixes g_A = 1. Static.
      subspaces: "qr" (orthogonal subspaces) or "identity" (ablation: every Π_k is the identity).
        Static.
      risk_inversion: ablation switch: False encodes A itself instead of s_A = 1 − A. Static.
      value_encoding: ablation switch: False encodes a signal as v(s) = s·1 without the Gaussian
        peaks. Static. (The five switches are the five ablations of Table 7(a); the defaults are
        the full controller.)

    Raises:
      ValueError: at construction, naming the field: every concrete numeric field must be a real
        number or array of them (not bool, complex or text), finite and within float32's range
        (|v| ≤ 3.4e38, where the engines and the sweep compute), and in its domain: sigma > 0
        (≥ 2^-63), gains ≥ 0, eps_c = 0 or 0 < eps_c < min(gains), thresholds in [0, 1] with
        θ0 ≥ θ1 ≥ θ2, n_max > n_min; dims a tuple of three positive ints summing to D, qr_seed an
        int ≥ 0, subspaces "qr" or "identity", the switches bools. The rules hold elementwise for a
        batch of configs (leaves shaped (K, ...)), and the message names the first bad config's
        index. Traced leaves (inside jit/vmap/grad) cannot be read and are not checked.
    """

    # σ ≥ 2^-63 keeps σ² a normal float32: below it XLA flushes σ² to 0 and the pure-JAX path's
    # (s - c)²/(2σ²) is 0/0 = NaN at a centre, while the native kernel's 1/(2σ²) overflows (the two
    # paths then disagree); every σ from 2^-63 up is a finite, matching decision.
    sigma: Any = _leaf(0.20, low=SIGMA_MIN,
                       what=f"a finite width > 0 (at least 2^-63 ≈ {SIGMA_MIN:.4g}, so σ² is a normal float32)")
    # Theorem 1's condition; eps_c = 0 (no leakage) keeps every pathway monotone for any gains
    eps_c: Any = _leaf(0.10, low=0.0, zero_or_below_min_of="gains",
                       what="0 ≤ eps_c < min(gains), or eps_c = 0 with any gains ≥ 0 (Theorem 1)")
    # ≥ 0: a zero gain switches a pathway off (all zero with eps_c = 0 gives v_meta = tanh(b))
    gains: Any = _leaf((1.0, 0.7, 0.5), shape=(3,), components=("s_wm", "s_r", "s_a"), low=0.0,
                       what="finite gains ≥ 0")
    g_A_coeffs: Any = _leaf((0.5, 0.5), shape=(2,), components=("g_A_a", "g_A_b"))
    gate_coeffs: Any = _leaf((0.3, 0.7), shape=(2,), components=("g_a", "g_b"))
    thresholds: Any = _leaf((0.6, 0.4, 0.2), shape=(3,), components=("theta0", "theta1", "theta2"),
                            low=0.0, high=1.0, descending=True, what="θ0 ≥ θ1 ≥ θ2 within [0, 1]")
    bias: Any = _leaf(0.0, or_d_vector=True)
    n_min: Any = _leaf(2.179652452468872)
    n_max: Any = _leaf(3.1749186515808105, above="n_min", what="n_max > n_min")
    D: int = _static(16, _check_D)
    dims: tuple[int, int, int] = _static((5, 5, 6), _check_dims)
    qr_seed: int = _static(42, _check_seed)
    alpha_gating: bool = _static(True, _check_bool)
    risk_modulation: bool = _static(True, _check_bool)
    subspaces: str = _static("qr", _check_subspaces)
    risk_inversion: bool = _static(True, _check_bool)
    value_encoding: bool = _static(True, _check_bool)

    def __post_init__(self):
        # Invariants are checked once, here. Numeric ones only where the values are concrete: inside
        # vmap/grad a leaf may be a tracer, and pytree ops rebuild configs without this method.
        for name, spec in _SPECS.items():
            if spec.check is not None:
                value = getattr(self, name)
                what = spec.check(value, self)
                if what is not None:
                    raise ValueError(f"{name}: expected {what}, got {value!r}")
        _check_numeric(self)

    def replace(self, **changes: Any) -> MDLConfig:
        """A copy with some fields changed (the config is frozen), checked like a new config.

        Args:
          **changes: field=value pairs, e.g. ``thresholds=(0.7, 0.5, 0.3)``.

        Returns:
          A new ``MDLConfig``.

        Raises:
          TypeError: a keyword that is not a field.
          ValueError: a value outside its field's domain (as at construction).
        """
        return dataclasses.replace(self, **changes)

    @property
    def projectors(self) -> np.ndarray:
        """Π_k as a (3, D, D) float64 array: QR-orthogonal, or the identity under the ablation."""
        return projector_stack(self.D, self.dims, self.qr_seed, self.subspaces)

    @property
    def basis(self) -> np.ndarray:
        """Q from the QR decomposition, (D, D) float64; columns [0:d_wm], [d_wm:d_wm+d_r], rest span Π_k."""
        return _qr_basis(self.D, self.qr_seed)


def field_specs() -> dict[str, FieldSpec]:
    """Every field's declaration, in ``MDLConfig``'s field order.

    Returns:
      {field name: ``FieldSpec``}.
    """
    return dict(_SPECS)


_SPECS: dict[str, FieldSpec] = {f.name: f.metadata["mdl"] for f in dataclasses.fields(MDLConfig)}
# Fields that are pytree leaves (traceable numbers) versus static aux data, in field order.
_NUMERIC = tuple(name for name, spec in _SPECS.items() if spec.leaf)
_STATIC = tuple(name for name, spec in _SPECS.items() if not spec.leaf)
# Trailing (per-config) shape of each vector field; any leading axes are a batch of configs.
_VECTOR = {name: spec.shape[0] for name, spec in _SPECS.items() if spec.leaf and len(spec.shape) == 1}


def config_shapes(name: str, D: int) -> tuple[tuple[int, ...], ...]:
    """The shapes a numeric field may have in one config (not a batch).

    Args:
      name: a numeric field (one of ``NUMERIC_FIELDS``).
      D: the config's value-vector dimension.

    Returns:
      The allowed shapes: the declared shape, and (D,) too for a field that may hold one value per
      coordinate (``bias``).

    Raises:
      ValueError: ``name`` is not a numeric field.
    """
    spec = _SPECS.get(name)
    if spec is None or not spec.leaf:
        raise ValueError(f"name: expected one of {list(_NUMERIC)}, got {name!r}")
    return (spec.shape, (D,)) if spec.or_d_vector else (spec.shape,)


def components() -> dict[str, tuple[str, int]]:
    """The names of single components of vector fields, for grids that vary one alone.

    Returns:
      {component name: (field, index)}, e.g. ``"theta0": ("thresholds", 0)``.
    """
    return {c: (name, i) for name, spec in _SPECS.items() for i, c in enumerate(spec.components)}


FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_RULE = "values a float32 holds (|v| ≤ 3.4e38: the engines and the sweep compute in float32)"


def field_violations(values: dict) -> list[tuple[str, np.ndarray, str, str | None]]:
    """Every broken range rule of the numeric fields, one flag per config.

    The one reading of the declared ranges: ``MDLConfig`` (any batch axes) and ``sweep``'s batch check
    both report from it, each in its own words around the same rule.

    Args:
      values: {numeric field: float64 array of leading batch axes + the field's shape, or None for a
        field that cannot be read (traced)}; every batch axis broadcasts with the others'.

    Returns:
      A list of (field, per-config bad flags, what was expected, the other field the rule compares
      with or None) for each rule some config breaks, fields' own ranges first, then rules between
      fields.

    Raises:
      ValueError: two fields compared by a rule whose batch axes do not broadcast.
    """
    out: list[tuple[str, np.ndarray, str, str | None]] = []

    def per_config(name, bad):  # vector fields: a config is bad if any component is
        return bad.any(axis=-1) if name in _VECTOR else bad

    # Every engine and the sweep compute a config's numbers in float32 (x64 decide aside): a value past
    # float32's range would become ±inf there and the decisions NaN or Opt-Out, silently. It is one more
    # way a field is bad, in the field's one mask: the first bad config is named whichever rule it breaks.
    big: dict[str, np.ndarray] = {}
    ruled: dict[str, np.ndarray] = {}  # per field: the configs bad by a rule other than float32's range
    for name in _NUMERIC:
        v, spec = values.get(name), _SPECS[name]
        if v is None:
            continue
        big[name] = per_config(name, np.isfinite(v) & (np.abs(v) > FLOAT32_MAX))
        bad = ~np.isfinite(v)
        if spec.low is not None:
            bad = bad | ~(v >= spec.low)
        if spec.high is not None:
            bad = bad | ~(v <= spec.high)
        bad = per_config(name, bad)
        if spec.descending:
            bad = bad | (np.diff(v, axis=-1) > 0).any(axis=-1)
        ruled[name] = bad
        if np.any(bad | big[name]):
            # a field with a range of its own says it; one ruled only against another field is finite here
            own = spec.what if (spec.low, spec.high, spec.descending) != (None, None, False) else "finite values"
            out.append((name, np.asarray(bad | big[name]), own, None))
    for name in _NUMERIC:
        v, spec = values.get(name), _SPECS[name]
        ref = spec.above or spec.zero_or_below_min_of
        if v is None or ref is None or values.get(ref) is None:
            continue
        if spec.above is not None:
            lo, hi = _broadcast(f"{ref}, {name}", values[ref], v)
            bad = ~(hi > lo)
        else:
            x, low = _broadcast(f"{name}, {ref}", v, values[ref].min(axis=-1))
            bad = (x > 0) & (x >= low)
        if np.any(bad):
            ruled[name] = np.asarray(ruled[name] | bad)
            # one entry a field: a config that breaks either of its rules is a bad config, so the first
            # bad config is reported whichever rule it breaks
            at = next((i for i, o in enumerate(out) if o[0] == name), None)
            if at is None:
                out.append((name, bad, spec.what, ref))
            else:
                prev = out[at]
                out[at] = (name, np.asarray(prev[1] | bad), prev[2], ref)
    for i, (name, bad, _, _) in enumerate(out):
        first = first_index(bad)
        if not np.broadcast_to(ruled[name], np.shape(bad))[first]:  # the first bad config is bad by its size alone
            out[i] = (name, bad, FLOAT32_RULE, None)
    return out


def _real(name: str, value) -> np.ndarray | None:
    """The field as a float64 array, or None when any of its leaves is traced (not checkable)."""
    if not is_concrete(value):
        return None
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as e:  # ragged tuples and the like
        raise ValueError(f"{name}: expected a number or an array of real numbers, got "
                         f"{_short(value)} ({e})") from None
    # bool and complex are numbers to NumPy but not a value of any field; bfloat16 has kind 'V'
    if arr.dtype == np.bool_ or not (jnp.issubdtype(arr.dtype, jnp.integer)
                                     or jnp.issubdtype(arr.dtype, jnp.floating)):
        raise ValueError(f"{name}: expected a number or an array of real numbers, got {_short(value)} "
                         f"(dtype {arr.dtype})")
    arr = arr.astype(np.float64)
    if name in _VECTOR and arr.shape[-1:] != (_VECTOR[name],):
        raise ValueError(f"{name}: expected {_VECTOR[name]} values (a trailing axis of "
                         f"{_VECTOR[name]}), got shape {arr.shape}: {_short(value)}")
    return arr


def _short(value) -> str:
    # one line, bounded: a batch of configs can hold thousands of values. NumPy scalars print as the
    # number a user wrote (0.5, not np.float32(0.5)).
    if isinstance(value, np.generic):
        text = str(value)
    elif isinstance(value, (tuple, list)) and any(isinstance(x, np.generic) for x in value):
        inner = ", ".join(str(x) if isinstance(x, np.generic) else repr(x) for x in value)
        text = f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    else:
        text = " ".join(repr(value).split())
    return text if len(text) <= 200 else text[:200] + " ..."


def _broadcast(names: str, *arrays) -> tuple:
    try:
        return np.broadcast_arrays(*arrays)
    except ValueError:
        raise ValueError(f"{names}: expected batch axes that broadcast together, got shapes "
                         f"{[np.shape(a) for a in arrays]}") from None


def _check_numeric(cfg: MDLConfig) -> None:
    """Every rule of a field in one mask per config, so the index named is the first config that
    is wrong for any reason (as ``decide`` names the first bad record)."""
    v = {f: _real(f, getattr(cfg, f)) for f in _NUMERIC}
    for name, bad, what, ref in field_violations(v):
        if ref is not None:
            what += f" ({ref}={_short(getattr(cfg, ref))})"
        # ``bad`` holds one flag per config (field_violations lists only rules some config breaks): 0-d
        # for one config, (K, ...) for a batch of configs, so the message says which is the first wrong one
        where = "" if np.ndim(bad) == 0 else f" (first at index {first_index(bad)})"
        raise ValueError(f"{name}: expected {what}, got {_short(getattr(cfg, name))}{where}")


def per_config_cache(fn: Callable | None = None, *, maxsize: int = 64, unhashable: Callable | None = None):
    """Cache a function of a config per hashable config; recompute for one with unhashable leaves.

    A config of plain floats and tuples is hashable and its result is kept (an LRU of ``maxsize``); a
    config holding arrays or tracers cannot be a key, and is computed every call (by ``unhashable``
    when given, else by the function itself). A call that raises caches nothing.

    Examples:
      >>> @per_config_cache
      ... def packed(cfg): ...

    Args:
      fn: the function, whose positional arguments (the config first) are the cache key.
      maxsize: how many results to keep.
      unhashable: what to call instead for arguments that cannot be a key; ``fn`` when None.

    Returns:
      The wrapped function (or a decorator, when ``fn`` is None); ``cache_clear`` clears its cache.
    """
    if fn is None:
        return functools.partial(per_config_cache, maxsize=maxsize, unhashable=unhashable)
    cached = functools.lru_cache(maxsize=maxsize)(fn)
    fallback = fn if unhashable is None else unhashable

    @functools.wraps(fn)
    def wrapper(*args):
        try:
            return cached(*args)
        except TypeError:
            try:
                hash(args)
            except TypeError:  # arrays or tracers in the config: no key, computed every call
                return fallback(*args)
            raise  # the function's own TypeError

    wrapper.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
    wrapper.cache_info = cached.cache_info  # type: ignore[attr-defined]
    return wrapper


def is_concrete(x) -> bool:
    """True when no leaf of ``x`` is a JAX tracer (its values can be read and checked now).

    Args:
      x: any pytree (a config, an array, a number).

    Returns:
      False inside ``jit`` / ``vmap`` / ``grad`` for a traced leaf, else True.
    """
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


@functools.cache
def _qr_basis(D: int, seed: int) -> np.ndarray:
    rand = np.random.default_rng(seed).standard_normal((D, D))
    q, r = np.linalg.qr(rand)
    q = q * np.sign(np.diag(r))[None, :]  # unique QR: positive diagonal of R
    q.setflags(write=False)
    return q


@functools.cache
def projector_stack(D: int, dims: tuple[int, int, int], seed: int, subspaces: str) -> np.ndarray:
    """Π_k of a config's static fields, cached: what ``MDLConfig.projectors`` returns.

    Args:
      D: the value-vector dimension.
      dims: (d_wm, d_r, d_a), summing to D.
      seed: the QR seed.
      subspaces: "qr" or "identity" (the ablation).

    Returns:
      A read-only (3, D, D) float64 array.
    """
    if subspaces == "identity":
        # Ablation "w/o orthogonal subspaces": every Π_k is the identity, so eq. (1) gives
        # W_k = (s_k + 2 ε_c) I and Lemma 1 no longer holds (each 'energy' is the full ‖v‖²).
        out = np.broadcast_to(np.eye(D), (3, D, D)).copy()
    else:
        q = _qr_basis(D, seed)
        edges = np.cumsum((0,) + tuple(dims))
        out = np.stack([q[:, a:b] @ q[:, a:b].T for a, b in zip(edges[:-1], edges[1:])])
    out.setflags(write=False)
    return out


def flatten(cfg: MDLConfig) -> tuple[tuple, tuple]:
    """A config's pytree split: (numeric leaves in ``NUMERIC_FIELDS`` order, static fields in
    ``STATIC_FIELDS`` order). The static tuple is hashable and compares two configs' structure.

    Args:
      cfg: a single config or a batch.

    Returns:
      (leaves, static fields).
    """
    return tuple(getattr(cfg, f) for f in _NUMERIC), tuple(getattr(cfg, f) for f in _STATIC)


def unflatten(aux, children) -> MDLConfig:
    """A config from ``flatten``'s parts, without ``__post_init__``'s checks: the leaves may be tracers,
    placeholders or a batch (callers that hold concrete values check them their own way).

    Args:
      aux: the static fields, as ``flatten(cfg)[1]``.
      children: the numeric leaves, in ``NUMERIC_FIELDS`` order.

    Returns:
      An ``MDLConfig``.
    """
    obj = object.__new__(MDLConfig)  # skip __post_init__: leaves may be tracers or placeholders
    for f, v in zip(_NUMERIC, children):
        object.__setattr__(obj, f, v)
    for f, v in zip(_STATIC, aux):
        object.__setattr__(obj, f, v)
    return obj


jax.tree_util.register_pytree_node(MDLConfig, flatten, unflatten)

NUMERIC_FIELDS = _NUMERIC
STATIC_FIELDS = _STATIC
