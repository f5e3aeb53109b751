"""The public edge: validation, batching and jit around the one-record functions of ``decision``.

``decide`` is the one obvious way to call the controller. It accepts scalars or arrays of any matching
shape, checks concrete input eagerly (ValueError naming the argument and the first bad index), and runs
the controller as one compiled program: the pure-JAX definition (``decision.decide_one``, vmapped and
jitted here), compiled once per config structure (the static fields and leaf shapes) and signal
dtype and shape. A config's numbers travel as one packed buffer, cached per config, so a call
converts nothing it has seen before.

Faster implementations live in ``mdl_jax.engines`` and run only when a caller names one
(``engine="native"``: the CPU kernel; ``engine="pallas"``: the fused GPU kernel) or asks for
``engine="auto"`` (the fastest that can run the call here). The controller holds no import of them:
``engine_module`` loads one by name on the first call that asks for it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import threading
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from mdl_jax.controller import config as _config_mod
from mdl_jax.controller import decision as _d
from mdl_jax.controller.config import MDLConfig, is_concrete
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

# The engines ``decide``, ``sweep`` and ``calibrate`` take: "jax" (the default, the definition, any
# backend), the named engines of ``mdl_jax.engines`` and "auto" (the fastest that can run the call here).
ENGINES = ("jax", "native", "pallas", "auto")
# Engine name → the module that implements it, imported on first use (never at import time).
_ENGINE_MODULES = {"native": "mdl_jax.engines.native", "pallas": "mdl_jax.engines.fused"}


_LOADED: dict = {}  # engine name → its module, once imported


def engine_module(name: str):
    """The module of a named engine ("native" or "pallas"), imported on first use.

    Args:
      name: an engine name of ``_ENGINE_MODULES``.

    Returns:
      The engine's module (``mdl_jax.engines.native`` or ``mdl_jax.engines.fused``).

    Raises:
      ValueError: ``name`` is not a named engine.
    """
    mod = _LOADED.get(name)
    if mod is None:
        try:
            mod = _LOADED[name] = importlib.import_module(_ENGINE_MODULES[name])
        except KeyError:
            raise ValueError(f"engine: expected one of {ENGINES}, got {name!r}") from None
    return mod


def check_engine(engine, allowed: tuple[str, ...] = ENGINES) -> str:
    """``engine`` when it is one of ``allowed``, else a ValueError naming the choices."""
    if not isinstance(engine, str) or engine not in allowed:
        raise ValueError(f"engine: expected one of {allowed}, got {engine!r}")
    return engine


def cannot_run(engine: str, why: str) -> ValueError:
    """The one-line error for an engine asked for by name that cannot run the call here."""
    return ValueError(f"engine={engine!r} cannot run here: {why}")


@functools.cache
def default_backend() -> str:
    """JAX's default backend ("cpu", "gpu", ...), asked once: what ``engine="auto"`` chooses by."""
    # Fixed for the life of a process once JAX's backends exist; asked only by engine="auto".
    return jax.default_backend()


# Records per chunk of the pure-JAX batched path. Over 10^6+ records the vmapped graph streams a dozen
# (N, 16) intermediates through main memory; a compiled loop over cache-sized chunks keeps them in L2.
CHUNK = 8192
_vmapped = jax.vmap(_d.decide_one, in_axes=(0, 0, 0, None))


def _batched(M, R, A, cfg: MDLConfig) -> _d.Decision:
    """Flat (N,) signals → Decision, in cache-sized chunks when N is large.

    The chunks are written in place into preallocated outputs (dynamic_update_slice on a loop carry),
    and the last chunk starts at N - CHUNK, overlapping its predecessor, so no padding and no final
    slice copy.
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


# ------------------------------------------------------------------------------------ the compiled program

class _Structure(NamedTuple):
    """What a compiled program depends on in a config: its static fields, its numeric leaves' shapes
    and the dtype its numbers are packed in (hashable: the key of ``_program``)."""

    aux: tuple
    shapes: tuple
    packed: str


class _Plan(NamedTuple):
    structure: _Structure
    buf: jax.Array   # the config's numbers, packed (one device buffer)
    scalar: object   # the program of one record from three Python floats (in the packed dtype)


def _pack(cfg: MDLConfig, x64: bool) -> tuple[_Structure, np.ndarray]:
    # The widest float JAX holds here: the program casts each number to the signals' dtype as
    # decide_one does, so the packed value rounds exactly as the field's own value would.
    dt = np.dtype(np.float64 if x64 else np.float32)
    leaves = [np.asarray(getattr(cfg, f), dt) for f in _config_mod.NUMERIC_FIELDS]
    buf = np.concatenate([leaf.ravel() for leaf in leaves]) if leaves else np.zeros(0, dt)
    return _Structure(_config_mod.flatten(cfg)[1], tuple(leaf.shape for leaf in leaves), dt.name), buf


def _unpack(structure: _Structure, buf) -> MDLConfig:
    leaves, at = [], 0
    for shape in structure.shapes:
        size = int(np.prod(shape, dtype=np.int64))
        leaves.append(buf[at:at + size].reshape(shape))
        at += size
    return _config_mod.unflatten(structure.aux, leaves)


def _plan_uncached(cfg: MDLConfig, x64: bool) -> _Plan | None:
    # A config with arrays for leaves: packed every call; one with traced leaves: None.
    if not all(is_concrete(x) for x in jax.tree.leaves(cfg)):
        return None
    structure, buf = _pack(cfg, x64)
    return _Plan(structure, buf, _program(structure, structure.packed, True))


@_config_mod.per_config_cache(unhashable=_plan_uncached)
def _plan(cfg: MDLConfig, x64: bool) -> _Plan | None:
    """The packed config of a concrete config (cached per hashable one); None for a config with
    traced leaves, which the program then takes as a pytree."""
    if cfg is not _DEFAULT:
        _check_single(cfg)  # raises: nothing is cached for a bad config
    structure, buf = _pack(cfg, x64)
    # Eagerly on the device even when the first call comes from inside a caller's jit: a buffer staged
    # into that trace would be a tracer, cached past its life.
    with jax.ensure_compile_time_eval():
        return _Plan(structure, jax.device_put(buf), _program(structure, structure.packed, True))


def _program_body(M, R, A, buf, structure: _Structure, dtype: str):
    return _tree_body(M, R, A, _unpack(structure, buf), dtype)


def _scalar_body(x, buf, structure: _Structure, dtype: str):
    # One record from Python floats: one (3,) buffer in, instead of three scalars.
    return _d.decide_one(x[0], x[1], x[2], _unpack(structure, buf))


@functools.cache
def _program(structure: _Structure, dtype: str, scalar: bool):
    """The compiled program of one config structure and signal dtype (jit adds the signals' shapes)."""
    body = _scalar_body if scalar else _program_body
    return jax.jit(functools.partial(body, structure=structure, dtype=dtype))


def _tree_body(M, R, A, cfg: MDLConfig, dtype: str):
    M, R, A = (jnp.asarray(x).astype(dtype) for x in (M, R, A))
    return _decide_shaped(M, R, A, cfg)


# A config with traced leaves (a caller's vmap/grad over the config) is passed as a pytree.
_tree_jit = jax.jit(_tree_body, static_argnames=("dtype",))


# ------------------------------------------------------------------------------------ the signals

def _standard_result_type(*args) -> np.dtype:
    # The compute dtype is JAX's standard lattice over the signals' dtypes, by definition (see
    # compute_dtype), whatever promotion mode the caller runs under: the signals are then cast to it
    # explicitly, so no value is promoted implicitly and strict mode gives the same dtype as standard.
    with jax.numpy_dtype_promotion("standard"):
        return jnp.dtype(jnp.result_type(*args))


@functools.lru_cache(maxsize=256)
def _result_dtype(kinds: tuple, x64: bool) -> np.dtype:
    # kinds: a float dtype per signal, or None for a Python float (weakly typed: it takes the others' dtype)
    return compute_dtype([0.0 if k is None else jax.dtypes.canonicalize_dtype(k) for k in kinds])


def _signal(x, name: str):
    """(the signal to hand the program, its float dtype or None for a Python float). NumPy and JAX
    arrays and Python numbers pass as they are (the program's transfer converts them); everything else
    (lists, other array types) through ``as_float_array``'s conversion."""
    t = type(x)
    if t is float:
        return x, None
    if t is int:
        return np.float32(x), np.dtype(np.float32)
    if isinstance(x, jax.Array):  # JAX arrays and tracers
        if not is_real_dtype(x.dtype):
            raise ValueError(f"{name}: expected real numbers in [0, 1], got dtype {x.dtype}")
        return x, (x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else np.dtype(np.float32))
    if isinstance(x, (np.ndarray, np.generic)) and x.dtype.isnative and x.dtype.kind in "fiu":
        if x.dtype.kind in "iu":
            x = np.asarray(x, np.float32)
        return x, x.dtype
    arr = as_float_array(x, name)
    return arr, arr.dtype


def _prepare(M, R, A, validate: bool):
    """The signals checked (values with ``validate``, dtype and shape always) → (signals, dtype, traced)."""
    traced = False
    for n, x in zip(_NAMES, (M, R, A)):
        if is_traced(x):
            traced = True
        elif validate:
            check_unit_interval(n, x)
    sig, kinds = zip(*(_signal(x, n) for n, x in zip(_NAMES, (M, R, A))))
    # The same shape rule for concrete and traced input: shapes are static, so inside a caller's
    # jit this raises at trace time instead of broadcasting (N, 1) with (N,) to (N, N).
    common_shape(_NAMES, sig)
    return list(sig), _result_dtype(tuple(kinds), bool(jax.config.jax_enable_x64)), traced


def compute_dtype(arrs) -> jnp.dtype:
    """The dtype the controller computes (and returns) in: the signals' common float dtype, at least
    float32. float16 / bfloat16 signals are widened: computed in their own dtype, their rounding
    (3 and 2 significant digits) moved C_final across a threshold for 0.14% / 2.31% of uniform
    records against float32 on the same values. Widening an exactly representable value is exact."""
    dtype = _standard_result_type(*arrs)
    return jnp.dtype(jnp.float32) if dtype.itemsize < 4 else dtype


def _run_jax(sig, dtype, cfg: MDLConfig) -> _d.Decision:
    plan = _plan(cfg, bool(jax.config.jax_enable_x64))
    if plan is None:
        return _tree_jit(*sig, cfg, dtype=dtype.name)
    if all(isinstance(x, (float, np.generic)) for x in sig):
        # one record of host scalars (NumPy's, Python's): one (3,) buffer in the computed dtype
        return _program(plan.structure, dtype.name, True)(np.array(sig, dtype), plan.buf)
    return _program(plan.structure, dtype.name, False)(*sig, plan.buf)


def decide(M: ArrayLike, R: ArrayLike, A: ArrayLike,
           config: MDLConfig | str | os.PathLike | None = None, *, validate: bool = True,
           engine: str = "jax") -> _d.Decision:
    """Run the MDL controller (Algorithm 1) on relevance M, reliability R and risk A.

    Examples:
      >>> from mdl_jax import Action, decide
      >>> d = decide(0.8, 0.7, 0.2)                     # one record, the paper's defaults
      >>> Action(int(d.action)).label, float(d.C_final)  # doctest: +SKIP
      >>> decide([0.9, 0.1], [0.8, 0.5], 0.3).action.shape   # a batch; 0-d A broadcasts
      (2,)
      >>> d = decide(M, R, A, engine="auto")  # the fastest engine here   # doctest: +SKIP

    Args:
      M: relevance, a scalar or an array of shape ``S`` of real numbers (ints, float16/bfloat16/32/64)
        in [0, 1]. M, R and A share one shape ``S``; 0-d values broadcast, any other mismatch is a
        ValueError naming the argument (at trace time for traced input). bool, complex and text
        input is a ValueError, always.
      R: reliability, as ``M``.
      A: task risk, as ``M`` (the controller inverts it: s_A = 1 − A).
      config: an ``MDLConfig``, or the path of a config file (``save_config``; read on every call,
        parsed once per content); the paper's defaults when None. Its numeric fields may be traced
        (vmap/grad over the config).
      validate: check concrete inputs for NaN, ±inf and values outside [0, 1] (ValueError naming the
        argument and its first bad index). ``validate=False`` skips only these value checks, for
        callers that checked already: dtype and shape are still checked. For values outside [0, 1]
        the output is then unspecified (any action; fields may be non-finite) but has the shapes
        and dtypes below, with one exception that every engine keeps: a NaN or ±inf in any signal
        gives ``Action.OPT_OUT``, the safe action, whatever the config's thresholds.
      engine: "jax" (default): the pure-JAX program, on any backend, for any input (traced, float64).
        "native": the CPU kernel of ``mdl_jax.engines.native`` (concrete float32 signals, D = 16,
        JAX's CPU backend; built with the system C++ compiler on first use); it answers with NumPy
        arrays. "pallas": the fused GPU kernel of ``mdl_jax.engines.fused`` (concrete float32
        signals on a GPU, D = 16). "auto": the fastest of these that can run the call here, else
        "jax". Every engine computes what the "jax" engine computes (parity-tested).

    Returns:
      A ``Decision`` whose fields have shape ``S`` (``v_meta``: S + (D,), ``energies``: S + (3,));
        ``action`` holds ``Action`` codes (int32). The float fields are float32, or float64 for float64
        input under x64: float16 / bfloat16 signals are widened to float32 and computed (and returned)
        in float32, never in their own dtype. JAX arrays, except on the "native" engine (NumPy), which
        "auto" runs on the CPU: code that calls ``block_until_ready`` converts with ``jnp.asarray`` first.

    Raises:
      ValueError: a signal outside [0, 1], NaN or ±inf (with ``validate``; the message names the
        argument and its first bad index), of a non-real dtype, or of a shape that does not
        broadcast; a config holding a batch of configs (``sweep`` takes those); a config file that
        cannot be read as a config (``ConfigFileError``, a ValueError, naming the file and field);
        an unknown ``engine``, or a named engine that cannot run this call here (the message says
        why).
      TypeError: ``config`` is neither an ``MDLConfig``, a path nor None.
    """
    if engine != "jax":
        return _decide_on_engine(check_engine(engine), M, R, A, config, validate)
    if type(M) is float and type(R) is float and type(A) is float:
        # One record from Python: one chained comparison per signal (NaN and ±inf fail it too), the
        # full check only to word the error; the three floats travel as one buffer.
        if validate and not (0.0 <= M <= 1.0 and 0.0 <= R <= 1.0 and 0.0 <= A <= 1.0):
            for n, x in zip(_NAMES, (M, R, A)):
                check_unit_interval(n, x)
        cfg = _DEFAULT if config is None else resolve_config(config)
        x64 = bool(jax.config.jax_enable_x64)
        plan = _plan(cfg, x64)
        if plan is not None:   # (Python floats are float64 under x64, float32 without: the packed dtype)
            return plan.scalar(np.array((M, R, A), plan.structure.packed), plan.buf)
    else:
        cfg = resolve_config(config)
    sig, dtype, _ = _prepare(M, R, A, validate)
    return _run_jax(sig, dtype, cfg)


def _decide_on_engine(engine: str, M, R, A, config, validate: bool) -> _d.Decision:
    """``decide`` on a named engine or "auto": the same checks, then the engine, or for "auto" the
    pure-JAX program where no engine can run the call."""
    cfg = _DEFAULT if config is None else resolve_config(config)
    if (type(M) is float and type(R) is float and type(A) is float and engine != "pallas"
            and not jax.config.jax_enable_x64 and (engine == "native" or default_backend() == "cpu")):
        # One record from Python on the CPU kernel: its inline path, without the array machinery.
        if validate and not (0.0 <= M <= 1.0 and 0.0 <= R <= 1.0 and 0.0 <= A <= 1.0):
            for n, x in zip(_NAMES, (M, R, A)):
                check_unit_interval(n, x)
        mod = engine_module("native")
        if mod.why_not(cfg, warn=engine == "auto") is None:
            out = mod.decide_record(M, R, A, cfg)
            if out is not None:
                return out
    sig, dtype, traced = _prepare(M, R, A, validate)
    why = None
    if traced:
        why = "traced input (a caller's jit, vmap or grad) runs on the pure-JAX engine only"
    elif dtype != jnp.float32:
        why = f"the kernels compute in float32, and these signals are {dtype.name}"
    # No records: as with records, a named engine that cannot run here is an error and the CPU kernel
    # answers (NumPy); the fused kernel, able to run, is not launched for nothing: the program answers.
    empty = 0 in jnp.broadcast_shapes(*(np.shape(x) for x in sig))
    names = (_auto_engines() if engine == "auto" else (engine,)) if why is None else ()
    for name in names:
        mod = engine_module(name)
        reason = mod.why_not(cfg, sig, warn=engine == "auto")
        if reason is None and empty and name != "native":
            break
        if reason is None:
            out = mod.decide_engine(*sig, cfg, strict=engine != "auto")
            if out is not None:
                return out
            reason = mod.why_not(cfg, sig, warn=engine == "auto") or "it failed on this call"
        why = reason
    if engine not in ("auto", "jax") and why is not None:
        raise cannot_run(engine, why)
    return _run_jax(sig, dtype, cfg)


def _auto_engines() -> tuple[str, ...]:
    # Which engine "auto" tries on this backend: the CPU kernel on the CPU, the fused kernel on a GPU.
    backend = default_backend()
    if backend == "cpu":
        return ("native",)
    if backend in ("gpu", "cuda"):
        return ("pallas",)
    return ()


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


def resolve_config(config) -> MDLConfig:
    """The single ``MDLConfig`` that ``decide``'s and ``calibrate``'s ``config`` argument means: the
    defaults for None, a file loaded from a path, a config checked (TypeError / ValueError naming it)."""
    if config is None:
        return _DEFAULT
    if isinstance(config, (str, os.PathLike)):
        return _config_file(os.fspath(config))
    if not isinstance(config, MDLConfig):
        raise TypeError(f"config: expected an MDLConfig, a config file path or None, got "
                        f"{type(config).__name__}")
    if config is not _DEFAULT:
        _checked_single(config)
    return config


@_config_mod.per_config_cache
def _checked_single(cfg: MDLConfig) -> bool:
    _check_single(cfg)  # raises: nothing is cached for a bad config
    return True


def _check_single(cfg: MDLConfig) -> None:
    """One config's shapes (a batch of configs belongs to ``sweep``): else a ValueError naming the
    field, before the controller would fail on it with a broadcasting error. Fields holding tracers
    (vmap or grad over the config: a tuple of tracers, say) are not checked."""
    for f in _config_mod.NUMERIC_FIELDS:
        v = getattr(cfg, f)
        if not is_concrete(v):
            continue
        got, want = np.shape(v), _config_mod.config_shapes(f, cfg.D)
        if got not in want:
            one = " or ".join(str(w) for w in want)
            raise ValueError(f"config.{f}: expected one config's value (shape {one}), got shape {got}; "
                             "a batch of configs is for sweep")


def _config_file(path: str) -> MDLConfig:
    # Read on every call, parsed once per content: the cache is keyed by a hash of the bytes read, so a
    # file replaced by other content of the same size with its mtime kept (cp -p, rsync -t, tar x) is
    # never served stale. A config file is ~1 kB, so reading and hashing it is cheap beside a decision.
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
    cfg = resolve_config(config)
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
        does not broadcast; ``temperature`` not one finite number > 0 in the signals' dtype; a
        batched or unreadable config (as ``decide``).
      TypeError: ``config`` is neither an ``MDLConfig``, a path nor None.
    """
    cfg = resolve_config(config)
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
    # One τ, its shape checked at trace time too: a (3,) τ would broadcast over the three thresholds
    if is_traced(temperature) and np.ndim(temperature) == 0:
        return
    try:
        t = np.asarray(temperature)
    except (TypeError, ValueError):   # a ragged list, a tracer of another shape, an object NumPy cannot read
        t = np.asarray(None)
    if not is_real_dtype(t.dtype) or t.ndim != 0:
        got = f"shape {t.shape}" if t.ndim and is_real_dtype(t.dtype) else repr(temperature)
        raise ValueError(f"temperature: expected one finite number > 0, got {got}")
    # > 0 where it is used: 1e-9 is 0 in float16, and (C_final - θ) / 0 is NaN at a threshold
    with np.errstate(over="ignore", invalid="ignore"):
        in_dtype = t.astype(jnp.dtype(dtype)).astype(np.float64)
    if not np.all(np.isfinite(in_dtype) & (in_dtype > 0)):   # 1e39 is inf in float32
        raise ValueError(f"temperature: expected a finite number > 0 (in {jnp.dtype(dtype).name}), "
                         f"got {temperature!r}")
