"""The public edge: validation, batching and jit around the one-record functions of ``decision``.

``decide`` is the one obvious way to call the controller. It accepts scalars or arrays of any matching
shape, checks concrete input eagerly (ValueError naming the argument and the first bad index), and runs
the controller once, compiled:
  - concrete float32 input on the CPU: the native FFI kernel (``mdl_jax.controller.native``), one pass per
    16-record block on every core; it computes what ``decision.decide_one`` computes (parity-tested);
  - concrete float32 input on a GPU: the fused Pallas kernel (``mdl_jax.controller.fused``), one
    kernel per call with each record's controller in registers; tested against ``decide_one`` in
    Pallas interpret mode;
  - anything else (a caller's jit/vmap/grad, a traced config, float64, D ≠ 16, a kernel not built or
    not lowered): the pure-JAX batched path below, which is also the definition both kernels are
    tested against.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from mdl_jax.controller import decision as _d
from mdl_jax.controller import fused, native
from mdl_jax.controller.config import MDLConfig, _is_concrete
from mdl_jax.controller.validation import (
    ArrayLike,
    as_float_array,
    check_unit_interval,
    common_shape,
    is_real_dtype,
    is_traced,
)

_NAMES = ("M", "R", "A")
_DEFAULT = MDLConfig()

# Records per chunk of the pure-JAX batched path. Over 10^6+ records the vmapped graph streams a dozen
# (N, 16) intermediates through main memory; a compiled loop over cache-sized chunks keeps them in L2.
# On the 2-core dev machine 8192-16384 was fastest (1.2×10^7 decisions/s at N = 10^7, vs 1.1×10^6
# unchunked, 9.7×10^6 at 2048, 5.5×10^6 at 32768). That is XLA:CPU's ceiling for this graph: a
# hand-unrolled structure-of-arrays form reached only 5×10^6 (XLA split it into ~70 fusions), which
# is why the CPU default is the native kernel instead.
CHUNK = 8192
_vmapped = jax.vmap(_d.decide_one, in_axes=(0, 0, 0, None))


def _batched(M, R, A, cfg: MDLConfig) -> _d.Decision:
    """Flat (N,) signals → Decision, in cache-sized chunks when N is large.

    The chunks are written in place into preallocated outputs (dynamic_update_slice on a loop carry),
    and the last chunk starts at N - CHUNK, overlapping its predecessor, so no padding and no final
    slice copy: both cost ~25% at N = 10^7.
    """
    n = M.shape[0]
    if n <= CHUNK:
        return _vmapped(M, R, A, cfg)
    # Chunking is a CPU cache optimisation. On a GPU one fused vmapped program is the fast form, and a
    # sequential loop over 8192-record chunks would serialise it, so the choice is made per platform
    # when the program is lowered.
    return jax.lax.platform_dependent(M, R, A, cfg, cpu=_chunked, default=_vmapped)


def _chunked(M, R, A, cfg: MDLConfig) -> _d.Decision:
    n = M.shape[0]
    n_chunks = -(-n // CHUNK)
    shapes = jax.eval_shape(_vmapped, M[:CHUNK], R[:CHUNK], A[:CHUNK], cfg)
    init = jax.tree.map(lambda s: jnp.empty((n,) + s.shape[1:], s.dtype), shapes)

    def body(k, out):
        start = jnp.minimum(k * CHUNK, n - CHUNK)
        part = _vmapped(*(jax.lax.dynamic_slice_in_dim(x, start, CHUNK) for x in (M, R, A)), cfg)
        return jax.tree.map(lambda o, p: jax.lax.dynamic_update_slice_in_dim(o, p, start, 0), out, part)

    return jax.lax.fori_loop(0, n_chunks, body, init)


def _decide_shaped(M, R, A, cfg: MDLConfig) -> _d.Decision:
    shape = jnp.broadcast_shapes(M.shape, R.shape, A.shape)
    flat = [jnp.broadcast_to(x, shape).reshape(-1) for x in (M, R, A)]
    out = _batched(flat[0], flat[1], flat[2], cfg)
    return jax.tree.map(lambda t: t.reshape(shape + t.shape[1:]), out)


_decide_jit = jax.jit(_decide_shaped)


def _native_shaped(M, R, A, params, flags: int, dims: tuple[int, int, int]) -> _d.Decision:
    # The same contract as _decide_shaped, computed by the FFI kernel (mdl_jax/controller/native.py).
    shape = jnp.broadcast_shapes(M.shape, R.shape, A.shape)
    flat = [jnp.broadcast_to(x, shape).reshape(-1).astype(jnp.float32) for x in (M, R, A)]
    n = flat[0].shape[0]
    f32 = jnp.float32
    types = [jax.ShapeDtypeStruct((n,), jnp.int32)] + [jax.ShapeDtypeStruct((n,), f32)] * 3 + [
        jax.ShapeDtypeStruct((n, 16), f32), jax.ShapeDtypeStruct((n, 3), f32),
        jax.ShapeDtypeStruct((n,), f32), jax.ShapeDtypeStruct((n,), f32)]
    out = jax.ffi.ffi_call(native.TARGET, types)(
        *flat, params, flags=np.int64(flags), d_wm=np.int64(dims[0]), d_r=np.int64(dims[1]))
    return _d.Decision(*(o.reshape(shape + o.shape[1:]) for o in out))


_native_jit = jax.jit(_native_shaped, static_argnames=("flags", "dims"))


@functools.cache
def _on_cpu_and_default_supported() -> tuple[bool, bool]:
    # Neither can change in a process; supports() inspects every config leaf (~10 µs), so the default
    # config's answer is asked once.
    return jax.default_backend() == "cpu", native.supports(_DEFAULT)


def _native_ok(cfg: MDLConfig) -> bool:
    """May this call use the native kernel? CPU backend, kernel built, config within its limits."""
    if not native.enabled():
        return False
    on_cpu, default_ok = _on_cpu_and_default_supported()
    return on_cpu and (default_ok if cfg is _DEFAULT else native.supports(cfg)) and native.load()


@functools.cache
def _native_default_scalar():
    # Single-record fast path on the kernel: the packed default config is a compile-time constant, so
    # a call transfers one (3,) buffer (M, R, A) and nothing else.
    params = native.pack(_DEFAULT)
    flags, dims = native.flags(_DEFAULT), _DEFAULT.dims
    return jax.jit(lambda x: _native_shaped(x[0], x[1], x[2], params, flags, dims))


def _scalar_plan(cfg: MDLConfig):
    """(the config's params buffer, flags) for a hashable concrete config the kernel may run, else
    None (the general path then decides, and words any error)."""
    try:
        _checked_single(cfg)
    except TypeError:  # unhashable leaves (arrays, tracers): not cached, take the general path
        return None
    return _native_plan(cfg)


def _native_plan(cfg: MDLConfig):
    """(params buffer, flags) when the kernel may run ``cfg``, else None. What depends only on the
    config (the kernel's limits, ~50 µs to check, and the packed buffer) is cached per hashable
    config; whether the kernel is on and loaded is asked every call (cheap, and it can change)."""
    if not (native.enabled() and _on_cpu_and_default_supported()[0] and native.load()):
        return None
    try:
        return _supported_plan_cached(cfg)
    except TypeError:  # unhashable leaves: checked every call
        return _supported_plan(cfg)


def _supported_plan(cfg: MDLConfig):
    if not native.supports(cfg):
        return None
    return native.params(cfg), native.flags(cfg)


_supported_plan_cached = functools.lru_cache(maxsize=64)(_supported_plan)


@functools.cache
def _native_scalar(flags: int, dims: tuple[int, int, int]):
    # One program per static structure; the numbers arrive as the (1085,) params argument.
    return jax.jit(lambda x, params: _native_shaped(x[0], x[1], x[2], params, flags, dims))


@jax.jit
def _decide_default_scalar(M, R, A):
    # Single-record fast path: the default config is closed over (baked in as constants), so a call
    # dispatches three scalars instead of fourteen config leaves.
    return _d.decide_one(M, R, A, _DEFAULT)


def _prepare(M, R, A, validate: bool):
    traced = False
    for n, x in zip(_NAMES, (M, R, A)):
        if is_traced(x):
            traced = True
        elif validate:
            check_unit_interval(n, x)
    arrs = [as_float_array(x, n) for n, x in zip(_NAMES, (M, R, A))]
    # The same shape rule for concrete and traced input: shapes are static, so inside a caller's
    # jit this raises at trace time instead of broadcasting (N, 1) with (N,) to (N, N).
    common_shape(_NAMES, arrs)
    dtype = compute_dtype(arrs)
    return [a.astype(dtype) for a in arrs], traced


def compute_dtype(arrs) -> jnp.dtype:
    """The dtype the controller computes (and returns) in: the signals' common float dtype, at least
    float32. float16 / bfloat16 signals are widened: computed in their own dtype, their rounding
    (3 and 2 significant digits) moved C_final across a threshold for 0.14% / 2.31% of uniform
    records against float32 on the same values. Widening an exactly representable value is exact."""
    dtype = jnp.result_type(*arrs)
    return jnp.dtype(jnp.float32) if jnp.dtype(dtype).itemsize < 4 else jnp.dtype(dtype)


def decide(M: ArrayLike, R: ArrayLike, A: ArrayLike,
           config: MDLConfig | str | os.PathLike | None = None, *, validate: bool = True) -> _d.Decision:
    """Run the MDL controller (Algorithm 1) on relevance M, reliability R and risk A.

    Examples:
      >>> from mdl_jax import Action, decide
      >>> d = decide(0.8, 0.7, 0.2)                     # one record, the paper's defaults
      >>> Action(int(d.action)).label, float(d.C_final)  # doctest: +SKIP
      >>> decide([0.9, 0.1], [0.8, 0.5], 0.3).action.shape   # a batch; 0-d A broadcasts
      (2,)

    Args:
      M: relevance, a scalar or an array of shape ``S`` of real numbers (ints, float16/bfloat16/32/64)
        in [0, 1]. M, R and A share one shape ``S``; 0-d values broadcast, any other mismatch is a
        ValueError naming the argument (at trace time for traced input). bool, complex and text
        input is a ValueError, always.
      R: reliability, as ``M``.
      A: task risk, as ``M`` (the controller inverts it: s_A = 1 − A).
      config: an ``MDLConfig``, or the path of a config file (``save_config``; read once per file
        version); the paper's Table 2 defaults when None. Its numeric fields may be traced
        (vmap/grad over the config).
      validate: check concrete inputs for NaN, ±inf and values outside [0, 1] (ValueError naming the
        argument and its first bad index). ``validate=False`` skips only these value checks, for
        callers that checked already: dtype and shape are still checked. For values outside [0, 1]
        the output is then unspecified (any action; fields may be non-finite) but has the shapes
        and dtypes below, with one exception that every path keeps: a NaN in any signal gives
        ``Action.OPT_OUT``, the safe action, on the native kernel and on pure JAX alike.

    Returns:
      A ``Decision`` whose fields have shape ``S`` (``v_meta``: S + (D,), ``energies``: S + (3,));
        ``action`` holds ``Action`` codes (int32). The float fields are float32, or float64 for float64
        input under x64: float16 / bfloat16 signals are widened to float32 and computed (and returned)
        in float32, never in their own dtype.

    Raises:
      ValueError: a signal outside [0, 1], NaN or ±inf (with ``validate``; the message names the
        argument and its first bad index), of a non-real dtype, or of a shape that does not
        broadcast; a config holding a batch of configs (``sweep`` takes those); a config file that
        cannot be read as a config (``ConfigFileError``, a ValueError, naming the file and field).
      TypeError: ``config`` is neither an ``MDLConfig``, a path nor None.
    """
    if isinstance(config, (str, os.PathLike)):
        config = _config_file(os.fspath(config))
    if validate and type(M) is float and type(R) is float and type(A) is float and (
            config is None or type(config) is MDLConfig):
        # Hot path for one record from Python: one chained comparison per signal (NaN and ±inf fail
        # it too), the full check only to word the error.
        if not (0.0 <= M <= 1.0 and 0.0 <= R <= 1.0 and 0.0 <= A <= 1.0):
            for n, x in zip(_NAMES, (M, R, A)):
                check_unit_interval(n, x)
        if config is None or config is _DEFAULT:
            if not jax.config.jax_enable_x64 and _native_ok(_DEFAULT):
                # (under x64 Python floats mean float64: the pure-JAX path keeps that)
                # one (3,) input buffer instead of three scalars: ~2 µs less per call
                return _native_default_scalar()(np.array((M, R, A), np.float32))
            return _decide_default_scalar(M, R, A)
        if not jax.config.jax_enable_x64 and native.enabled():
            # Any other concrete config: its packed numbers are a cached device buffer, passed as an
            # argument to a program compiled once per static structure (ablation flags, dims), so a
            # call costs what the default's does (was 256 µs against 27 µs: the eager conversions of
            # the general path below, and the kernel's limits checked on every call).
            plan = _scalar_plan(config)
            if plan is not None:
                return _native_scalar(plan[1], config.dims)(np.array((M, R, A), np.float32), plan[0])
    cfg = _config(config)
    if (type(M) is np.ndarray and type(R) is np.ndarray and type(A) is np.ndarray
            and M.dtype == R.dtype == A.dtype == np.float32 and M.shape == R.shape == A.shape
            and not jax.config.jax_enable_x64):
        # Hot path for the gate and the framework components: float32 NumPy arrays of one shape go to
        # the native kernel as they are. The general path below turns each into a JAX array first
        # (three eager dispatches, ~40% of a one-query gate call's controller time), only for the
        # kernel to read them back.
        plan = _native_plan(cfg)
        if plan is not None:
            if validate:
                for n, arr in zip(_NAMES, (M, R, A)):
                    check_unit_interval(n, arr)
            return _native_jit(M, R, A, plan[0], flags=plan[1], dims=cfg.dims)
    (M, R, A), traced = _prepare(M, R, A, validate)
    if not traced and M.dtype == jnp.float32:
        plan = _native_plan(cfg)
        if plan is not None:
            return _native_jit(M, R, A, plan[0], flags=plan[1], dims=cfg.dims)
        out = _fused_decide(M, R, A, cfg)
        if out is not None:
            return out
    return _decide_jit(M, R, A, cfg)


def _fused_decide(M, R, A, cfg: MDLConfig):
    """The fused GPU kernel's Decision when it may take this call (``fused.usable``: GPU backend,
    input there, config within its limits), else None. A kernel that fails to lower or compile on
    this GPU is given up for the process with one warning, and the pure-JAX path answers."""
    if 0 in jnp.broadcast_shapes(M.shape, R.shape, A.shape):
        return None
    how = fused.usable(cfg, (M, R, A))
    if not how:
        return None
    try:
        return fused.decide(M, R, A, cfg, interpret=how == "interpret")
    except Exception as e:  # noqa: BLE001 - Pallas/Triton/XLA raise their own types
        if how == "interpret" or "RESOURCE_EXHAUSTED" in str(e):
            raise  # out of device memory is about the call, not the kernel: the XLA path needs more
        fused.give_up(e)
        return None


def _checked_impl(M, R, A, cfg):
    for n, x in zip(_NAMES, (M, R, A)):
        flat = x.reshape(-1)
        if flat.size == 0:  # shapes are static: nothing to check, and argmax of nothing is an error
            continue
        bad = ~(jnp.isfinite(flat) & (flat >= 0) & (flat <= 1))
        i = jnp.argmax(bad)
        checkify.check(~jnp.any(bad), f"{n}: expected finite values in [0, 1]; "
                       f"{n}[flat index {{i}}] = {{v}}", i=i, v=flat[i])
    out = _decide_shaped(M, R, A, cfg)
    checkify.check(~jnp.any(jnp.isnan(out.C_final)), "C_final: NaN produced by the controller")
    return out


_checked_jit = jax.jit(checkify.checkify(_checked_impl, errors=checkify.user_checks))


def _config(config) -> MDLConfig:
    if config is None:
        return _DEFAULT
    if isinstance(config, (str, os.PathLike)):
        return _config_file(os.fspath(config))
    if not isinstance(config, MDLConfig):
        raise TypeError(f"config: expected an MDLConfig, a config file path or None, got "
                        f"{type(config).__name__}")
    if config is not _DEFAULT:
        try:
            _checked_single(config)
        except TypeError:  # unhashable leaves (arrays): checked every call
            _check_single(config)
    return config


@functools.lru_cache(maxsize=64)
def _checked_single(cfg: MDLConfig) -> bool:
    _check_single(cfg)  # raises: nothing is cached for a bad config
    return True


_BASE_SHAPES = {"sigma": (), "eps_c": (), "gains": (3,), "g_A_coeffs": (2,), "gate_coeffs": (2,),
                "thresholds": (3,), "n_min": (), "n_max": ()}


def _check_single(cfg: MDLConfig) -> None:
    """One config's shapes (a batch of configs belongs to ``sweep``): else a ValueError naming the
    field, before the controller would fail on it with a broadcasting error. Fields holding tracers
    (vmap or grad over the config: a tuple of tracers, say) are not checked."""
    for f, want in _BASE_SHAPES.items():
        v = getattr(cfg, f)
        if not _is_concrete(v):
            continue
        got = np.shape(v)
        if got != want:
            raise ValueError(f"config.{f}: expected one config's value (shape {want}), got shape {got}; "
                             "a batch of configs is for sweep")
    got = np.shape(cfg.bias) if _is_concrete(cfg.bias) else ()
    if got not in ((), (cfg.D,)):
        raise ValueError(f"config.bias: expected one config's value (a number or D={cfg.D} values), got "
                         f"shape {got}; a batch of configs is for sweep")


def _config_file(path: str) -> MDLConfig:
    # Read on every call, parsed once per content: the cache is keyed by a hash of the bytes read, so a
    # file replaced by other content of the same size with its mtime kept (cp -p, rsync -t, tar x) is
    # never served stale. A config file is ~1 kB, so reading and hashing it costs a few µs.
    from mdl_jax.controller.config_file import config_from_bytes, read_config_bytes

    data = read_config_bytes(path)
    key = hashlib.blake2b(data, digest_size=16).digest()
    cfg = _FILE_CACHE.get(key)
    if cfg is None:
        cfg = config_from_bytes(data, path)
        with _FILE_LOCK:  # decide may be called from several threads (a server)
            while len(_FILE_CACHE) >= 16:
                _FILE_CACHE.pop(next(iter(_FILE_CACHE)))
            _FILE_CACHE[key] = cfg
    return cfg


_FILE_CACHE: dict = {}  # content hash → MDLConfig (at most 16, oldest dropped first)
_FILE_LOCK = threading.Lock()


def _signals(M, R, A) -> tuple[list, tuple]:
    # dtype and shape rules shared by checked_decide and soft_decide (decide's _prepare applies the same)
    arrs = [as_float_array(x, n) for n, x in zip(_NAMES, (M, R, A))]
    shape = common_shape(_NAMES, arrs)
    dtype = compute_dtype(arrs)
    return [a.astype(dtype) for a in arrs], shape


def checked_decide(M: ArrayLike, R: ArrayLike, A: ArrayLike,
                   config: MDLConfig | str | os.PathLike | None = None) -> tuple[checkify.Error, _d.Decision]:
    """``decide`` with the checks compiled in (checkify): returns ``(error, Decision)``.

    For inputs that are only known inside compiled code (a caller's jit, vmap or scan), where
    ``decide`` cannot look at the values. Always the pure-JAX path.

    Examples:
      >>> err, d = checked_decide(jnp.array([0.5, 1.5]), 0.5, 0.5)
      >>> err.get()
      'M: expected finite values in [0, 1]; M[flat index 1] = 1.5 (`check` failed)'

    Args:
      M: relevance, (S) real array in [0, 1]; dtype and shape follow ``decide``'s rules and are
        checked eagerly (at trace time under jit), the values inside the compiled program.
      R: reliability, as ``M``.
      A: task risk, as ``M``.
      config: as ``decide``'s (an ``MDLConfig``, a config file path, or None for the defaults).

    Returns:
      ``(error, decision)``: a ``checkify.Error`` whose ``error.get()`` is None when all is well,
        else a message naming the argument and the first bad (flattened) index, or saying that the
        controller produced a NaN ``C_final``; ``error.throw()`` raises it. ``decision`` is the
        ``Decision`` ``decide`` would return (unspecified values where the check failed).

    Raises:
      ValueError: a signal of a non-real dtype or a shape that does not broadcast; a batched or
        unreadable config (as ``decide``).
      TypeError: ``config`` is neither an ``MDLConfig``, a path nor None.
    """
    cfg = _config(config)
    return _checked_jit(*_signals(M, R, A)[0], cfg)


def soft_decide(M: ArrayLike, R: ArrayLike, A: ArrayLike,
                config: MDLConfig | str | os.PathLike | None = None, temperature: ArrayLike = 0.02, *,
                validate: bool = True) -> jax.Array:
    """Differentiable decision: action probabilities (..., 4) in ``Action`` order.

    The thresholds are relaxed by sigmoids of width ``temperature``: P(C_final ≥ θ_k) ≈
    sigmoid((C_final − θ_k)/τ), so every numeric config field gets a finite gradient (see
    ``decision.soft_action_probs``), and as τ → 0 the probabilities tend to ``decide``'s action.

    Examples:
      >>> p = soft_decide(0.8, 0.7, 0.2)
      >>> p.shape, float(p.sum())            # doctest: +SKIP
      ((4,), 1.0)
      >>> p_active = p[..., 0]               # P(Active); [..., 3] is P(Opt-Out)

    Args:
      M: relevance, a scalar or an array of shape ``S`` in [0, 1] (``decide``'s rules).
      R: reliability, as ``M``.
      A: task risk, as ``M``.
      config: as ``decide``'s (an ``MDLConfig``, a config file path, or None for the defaults).
      temperature: τ, the sigmoid width: a finite number > 0 in the signals' dtype (a traced value
        is not checked).
      validate: check concrete signals for NaN, ±inf and values outside [0, 1], as ``decide``;
        traced signals are never inspected.

    Returns:
      (S + (4,)) float array of probabilities that sum to 1 over the last axis, in ``Action`` order:
        ``[..., 0]`` is P(Active), ``[..., 1]`` P(Supp), ``[..., 2]`` P(Silent), ``[..., 3]``
        P(Opt-Out). float32 (float64 for float64 input under x64).

    Raises:
      ValueError: a signal outside [0, 1] (with ``validate``), of a non-real dtype or a shape that
        does not broadcast; ``temperature`` not a finite number > 0 in the signals' dtype; a
        batched or unreadable config (as ``decide``).
      TypeError: ``config`` is neither an ``MDLConfig``, a path nor None.
    """
    cfg = _config(config)
    for n, x in zip(_NAMES, (M, R, A)):
        if validate and not is_traced(x):
            check_unit_interval(n, x)
    (M, R, A), shape = _signals(M, R, A)
    _check_temperature(temperature, M.dtype)
    flat = [jnp.broadcast_to(x, shape).reshape(-1) for x in (M, R, A)]

    def one(m, r, a):
        v_meta, v_wm, _ = _d.fuse(m, r, a, cfg)
        C, alpha, _ = _d.read_out(v_meta, v_wm, cfg)
        return _d.soft_action_probs(_d.gate(C, alpha, cfg), cfg, temperature)

    return jax.vmap(one)(*flat).reshape(shape + (4,))


def _check_temperature(temperature, dtype) -> None:
    if is_traced(temperature):
        return
    try:
        t = np.asarray(temperature)
    except (TypeError, ValueError):
        t = np.asarray(None)
    if not is_real_dtype(t.dtype):
        raise ValueError(f"temperature: expected a finite number > 0, got {temperature!r}")
    # > 0 where it is used: 1e-9 is 0 in float16, and (C_final - θ) / 0 is NaN at a threshold
    with np.errstate(over="ignore", invalid="ignore"):
        in_dtype = t.astype(jnp.dtype(dtype)).astype(np.float64)
    if not np.all(np.isfinite(t.astype(np.float64)) & (in_dtype > 0)):
        raise ValueError(f"temperature: expected a finite number > 0 (in {jnp.dtype(dtype).name}), "
                         f"got {temperature!r}")
