"""The fused GPU kernel for ``decide`` and ``sweep``: one Pallas kernel per call, lowered through Triton.

Why it exists: on a GPU the pure-JAX ``decide`` is no faster than plain ``jit(vmap(decide_one))``
(docs/benchmarks.md): XLA splits the per-record graph into several kernels whose
(N, 16) intermediates go through memory. Here each program takes a block of records and computes the
whole controller in registers — encode, the three fusion products, tanh, read-out, gate, action and
the Lemma 1 energies — and writes each output once (112 bytes in and out per record).

It computes what ``decision.decide_one`` computes, for D = 16 and any numeric config and ablation
switches, with the same float32 arithmetic in the same order where it matters: the config is packed
like the native CPU kernel's (``packing.pack``: W_k from eq. (1) with weight_matrices' operations, the
centres from the same ``jnp.linspace``), every product is a float32 ``jnp.dot`` at HIGHEST precision
(Triton's IEEE mode, not TF32), exp and tanh are libdevice's. ``tests/test_fused.py`` checks parity
with ``decide_one`` in Pallas interpret mode on the CPU, and that the kernels lower to Triton IR for
CUDA (the stage where Pallas rejects unsupported operations), so CI holds without a GPU.

Written for what Pallas Triton lowers (checked against jax's Triton lowering rules): 2-D blocks with
power-of-two sizes, no value slicing inside the kernel (columns are taken by masks, scalars are loaded
from refs), products as 2-D ``jnp.dot`` with every dimension ≥ 16, and explicit masks for a partial
last block (Pallas Triton does not mask out-of-bounds blocks itself).

Where it runs: the "pallas" engine, loaded only when a caller asks for it (``decide(...,
engine="pallas")``, ``sweep(..., engine="pallas")``, or ``engine="auto"`` on a GPU): concrete float32
input on a GPU backend, a config within its limits (``supports``). The pure-JAX engine stays the
definition and the path for traced input (a caller's jit/vmap/grad), so gradients (``soft_decide``,
``tune``) never see it. If the kernel fails to lower or compile, a named call raises the error; under
"auto" the first failure warns once and the process goes on with the pure-JAX engine.
``MDL_JAX_FUSED=0`` keeps it from running (under "auto", as the gate and the servers run);
``MDL_JAX_FUSED=interpret`` runs it in Pallas interpret mode on any backend (slow: for tests and
debugging, as the parity tests on the CPU do).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax.controller import decision as _decision
from mdl_jax.controller.config import MDLConfig, per_config_cache
from mdl_jax.engines import packing

ENV_SWITCH = "MDL_JAX_FUSED"
D = 16
# Records per program of ``decide``'s kernel and its Triton warps: one record per thread. Chosen
# without a GPU, from ptxas's report for sm_90a on this kernel's Triton IR (compiled offline with
# Triton 3.9): 128 records × 4 warps uses 168 registers and spills nothing; 256 × 4 and 512 × 8
# (two records a thread) hit the 255-register limit and spill; 256 × 8 uses 183. Not a timing:
# experiments/bench_gpu.py times these alternatives on the device.
BLOCK = 128
NUM_WARPS = 4
# The sweep kernel: each program takes one config and SWEEP_BLOCK records, in steps of BLOCK.
SWEEP_BLOCK = 4096
_HI = jax.lax.Precision.HIGHEST
# How the kernel's controller products are computed. "ieee" (the default): float32 FMAs, what
# HIGHEST means to Pallas Triton, exact as decision.PRECISION asks. "tf32x3": three TF32 tensor-core passes
# with error compensation (Triton's TF32x3), about float32's accuracy (products to ~2^-22
# relative) at a fraction of the FMA work; offered for experiments/bench_gpu.py to measure against
# the parity target on a GPU before it could become a default. The sweep's weighted sums are always
# IEEE (their integer sums must be exact).
PRECISIONS = {"ieee": _HI, "tf32x3": jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3}
# Slots of the per-config scalar vector (``pack``): loaded one by one from the ref, since a value
# cannot be sliced inside a Pallas Triton kernel.
_NEG_INV_2S2, _GA_A, _GA_B, _G_A, _G_B, _TH0, _TH1, _TH2, _N_MIN, _N_MAX = range(10)
_STATE: dict = {}  # "error": why the kernel was given up in this process
_LOCK = threading.Lock()


class Structure(NamedTuple):
    """The static part of a config the kernels branch on at trace time (hashable: a jit key)."""

    value_encoding: bool
    risk_inversion: bool
    risk_modulation: bool
    alpha_gating: bool
    qr: bool
    dims: tuple[int, int, int]


def structure(cfg: MDLConfig) -> Structure:
    return Structure(cfg.value_encoding, cfg.risk_inversion, cfg.risk_modulation, cfg.alpha_gating,
                     cfg.subspaces == "qr", (*cfg.dims,))


# ------------------------------------------------------------------------------------ when to use it

def mode() -> str:
    """'off', 'auto' (the kernel on a GPU backend) or 'interpret' (Pallas interpret mode anywhere),
    from ``$MDL_JAX_FUSED``."""
    v = os.environ.get(ENV_SWITCH, "1").strip().lower()
    if v in ("0", "false", "no", "off"):
        return "off"
    return "interpret" if v == "interpret" else "auto"


def on_gpu_backend() -> bool:
    return jax.default_backend() in ("gpu", "cuda")


def failed() -> str | None:
    """Why the kernel was given up in this process (a lowering or compile error), else None."""
    return _STATE.get("error")


def give_up(e: BaseException) -> None:
    """Record a kernel failure and warn once; callers then take the pure-JAX path."""
    with _LOCK:
        if "error" in _STATE:
            return
        _STATE["error"] = f"{type(e).__name__}: {e}"
    warnings.warn(f"mdl_jax: fused GPU kernel unavailable, using the pure-JAX engine "
                  f"({_STATE['error'][:500]}).", RuntimeWarning, stacklevel=3)


supports = packing.supports  # the kernel's structural limits: the native kernel's (D = 16, one concrete config)


def _arrays_on_gpu(arrays) -> bool:
    # Input committed to another device (jax.device_put(x, cpu) on a GPU machine) stays off the
    # kernel: the program would be compiled for that device, where the kernel does not exist. So
    # does input sharded over several devices (the pure-JAX path partitions; a kernel call would
    # not). Uncommitted arrays go wherever the program runs (the default device).
    for x in arrays:
        if isinstance(x, jax.Array) and getattr(x, "committed", True):
            try:
                devs = x.devices()
                if len(devs) > 1 or any(d.platform not in ("gpu", "cuda") for d in devs):
                    return False
            except (RuntimeError, ValueError):
                return False
    return True


def usable(cfg: MDLConfig, arrays=()) -> bool | str:
    """May ``decide`` run this config on the kernel here? False, True, or "interpret" (``why_not``'s
    answer as a flag)."""
    if why_not(cfg, arrays) is not None:
        return False
    return "interpret" if mode() == "interpret" else True


def sweep_usable(cfg: MDLConfig) -> bool:
    """Does ``sweep(engine="auto")`` take the fused engine for this batch here? (One GPU, or
    ``MDL_JAX_FUSED=interpret``; D = 16; kernel not given up.) With several local devices "auto"
    keeps the jax engine, which spreads configs and records over all of them (a mesh); the kernel
    runs on one device (``engine="fused"`` still asks for it)."""
    m = mode()
    if m == "off" or failed() is not None or cfg.D != D:
        return False
    return m == "interpret" or (on_gpu_backend() and len(jax.local_devices()) == 1)


def unavailable() -> str | None:
    """Why the engine cannot run in this process (switched off, given up after a failure, no GPU
    backend), else None."""
    m = mode()
    if m == "off":
        return f"{ENV_SWITCH}=0 switches it off"
    error = failed()
    if error is not None:
        return f"the kernel failed to lower or compile here ({error[:300]})"
    if m != "interpret" and not on_gpu_backend():
        return f"it runs on a GPU, and JAX's default backend here is {jax.default_backend()}"
    return None


def why_not(cfg: MDLConfig, signals=(), *, warn: bool = True) -> str | None:
    """Why ``decide`` cannot run this call on the engine (the process, the signals' devices, the
    config), else None. ``warn`` is the contract's (this engine warns only when "auto"'s call fails)."""
    why = unavailable()
    if why is not None:
        return why
    if mode() != "interpret" and not _arrays_on_gpu(signals):
        return "the signals are committed to a device other than one GPU"
    if not supports(cfg):
        return packing.why_unsupported(cfg)
    return None


def decide_engine(M, R, A, cfg: MDLConfig, *, strict: bool = True):
    """``decide`` on the kernel: checked float32 signals of one broadcast shape → a ``Decision`` of JAX
    arrays; None (after one warning) when the kernel fails to lower or compile and ``strict`` is
    False, the error itself when it is True. Out of device memory is always raised: it is about the
    call, not the kernel."""
    interpret = mode() == "interpret"
    try:
        return decide(jnp.asarray(M, jnp.float32), jnp.asarray(R, jnp.float32), jnp.asarray(A, jnp.float32), cfg,
                      interpret=interpret)
    except Exception as e:  # noqa: BLE001 - Pallas/Triton/XLA raise their own types
        if strict or interpret or "RESOURCE_EXHAUSTED" in str(e):
            raise
        give_up(e)
        return None


def sweep_why_not(cfg: MDLConfig, K: int, *, warn: bool = True) -> str | None:
    """Why ``sweep`` cannot run this batch on the engine here, else None (``warn``: as ``why_not``'s)."""
    why = unavailable()
    if why is None and cfg.D != D:
        why = f"the kernel takes D = {D} (this batch has D = {cfg.D})"
    return why


# ------------------------------------------------------------------------------------ the config

def pack_batch(cfg: MDLConfig, K: int | None):
    """float32 (mats (K, 4, D, D), vecs (K, 2, D), scal (K, D)) for one config (K None → K = 1) or a
    batch. mats: W_wmᵀ, W_rᵀ, W_aᵀ (so that v @ W_kᵀ = W_k v) and the basis Q; vecs: centres, bias;
    scal: the ``_NEG_INV_2S2`` ... slots. The numbers are the native kernel's (``packing.pack_batch``'s rows)."""
    k = 1 if K is None else K
    rows = packing.pack_batch(cfg, k)
    W = rows[:, packing.W_AT:packing.BIAS_AT].reshape(k, 3, D, D)
    Q = rows[:, packing.BASIS_AT:packing.BASIS_AT + D * D].reshape(k, 1, D, D)
    mats = np.concatenate([np.swapaxes(W, -1, -2), Q], axis=1)
    vecs = np.stack([rows[:, :D], rows[:, packing.BIAS_AT:packing.BIAS_AT + D]], axis=1)
    scal = np.zeros((k, D), np.float32)
    # -1/(2σ²): the Gaussians multiply by it instead of dividing by 2σ² as the pure-JAX path does
    # (as the native kernel does; ≤ 1.5 ulp apart). The ptxas listing for sm_90 showed the 48
    # IEEE divisions per record at ~15% of the kernel's instructions; folding the sign saves 48 negations.
    scal[:, _NEG_INV_2S2] = -rows[:, packing.INV_AT]
    scal[:, _GA_A:_N_MAX + 1] = rows[:, packing.G_A_AT:packing.N_MAX_AT + 1]   # g_A's (a, b), g_a, g_b, θ, n_min, n_max
    return (np.ascontiguousarray(mats), np.ascontiguousarray(vecs), scal)


def pack(cfg: MDLConfig):
    """One config as the kernel's inputs (mats (4, D, D), vecs (2, D), scal (D,)), float32 NumPy."""
    return tuple(x[0] for x in pack_batch(cfg, None))


@per_config_cache(unhashable=lambda cfg: tuple(jax.device_put(x) for x in pack(cfg)))  # arrays: every time
def params(cfg: MDLConfig):
    """``pack(cfg)`` on the default device, cached per hashable config so a call transfers nothing."""
    with jax.ensure_compile_time_eval():   # concrete buffers even when first asked inside a caller's jit
        return tuple(jax.device_put(x) for x in pack(cfg))


# ------------------------------------------------------------------------------------ the kernel body

@functools.cache
def _pallas():
    # Imported on first use, not with ``import mdl_jax`` (importing Pallas and its Triton module is a
    # noticeable cost that CPU-only users should not pay).
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    return pl, plgpu


def _controller(m, r, a, mat_ref, vec_ref, scal_ref, st: Structure, outputs: bool, prec=_HI):
    """Algorithm 1 for a block of records (m, r, a: (B,) float32) under one config held in refs.

    Returns (C_final, action) and, with ``outputs``, the other Decision fields. Mirrors
    decision.decide_one line by line; only the layout differs (records down the rows)."""
    B = m.shape[0]
    sc = lambda i: scal_ref[i]  # noqa: E731 - a scalar load (a value cannot be indexed here)
    lane = jax.lax.broadcasted_iota(jnp.int32, (1, D), 1)
    s_a = 1.0 - a if st.risk_inversion else a

    def encode(s):
        col = s[:, None]                                     # (B, 1)
        if not st.value_encoding:
            return jnp.broadcast_to(col, (B, D))
        d = col - vec_ref[0:1, :]                            # centres, (1, D)
        return col + jnp.exp((d * d) * sc(_NEG_INV_2S2))

    v_wm, v_r, v_a = encode(m), encode(r), encode(s_a)
    if st.risk_modulation:
        g_A = sc(_GA_A) + sc(_GA_B) * (jnp.sum(v_a, axis=1) * (1.0 / D))  # exact: D is a power of two
    else:
        g_A = jnp.ones((B,), jnp.float32)
    z = (jnp.dot(g_A[:, None] * v_wm, mat_ref[0], precision=prec)
         + jnp.dot(v_r, mat_ref[1], precision=prec)
         + jnp.dot(v_a, mat_ref[2], precision=prec)
         + vec_ref[1:2, :])
    v_meta = jnp.tanh(z)
    # eq. (2), with safe_norm's zero handling and α = 0 where either norm is 0
    sq = jnp.sum(v_meta * v_meta, axis=1)
    sq_wm = jnp.sum(v_wm * v_wm, axis=1)
    n = jnp.where(sq > 0, jnp.sqrt(jnp.where(sq > 0, sq, 1.0)), 0.0)
    n_wm = jnp.where(sq_wm > 0, jnp.sqrt(jnp.where(sq_wm > 0, sq_wm, 1.0)), 0.0)
    n_min, n_max = sc(_N_MIN), sc(_N_MAX)
    C = jnp.minimum(jnp.maximum((n - n_min) / (n_max - n_min), 0.0), 1.0)
    denom = n * n_wm
    ok = denom > 0
    alpha = jnp.where(ok, jnp.sum(v_wm * v_meta, axis=1) / jnp.where(ok, denom, 1.0), 0.0)
    alpha = jnp.minimum(jnp.maximum(alpha, -1.0), 1.0)
    # the product rounded alone (decision.uncontracted): Triton and XLA would contract it into an FMA
    C_final = C * (sc(_G_A) + _decision.uncontracted(sc(_G_B) * alpha)) if st.alpha_gating else C
    action = (3 - (C_final >= sc(_TH0)).astype(jnp.int32) - (C_final >= sc(_TH1)).astype(jnp.int32)
              - (C_final >= sc(_TH2)).astype(jnp.int32))
    # A NaN or ±inf signal is Opt-Out, as decide_one rules; Triton's min/max drop NaN (minnum), so the
    # lanes are caught at the input, as the native kernel does (x − x is NaN exactly for NaN and ±inf).
    action = jnp.where(((m - m) != (m - m)) | ((r - r) != (r - r)) | ((a - a) != (a - a)), 3, action)
    if not outputs:
        return C_final, action
    if st.qr:
        coords = jnp.dot(v_meta, mat_ref[3], precision=prec)   # Qᵀ v_meta, (B, D)
        csq = coords * coords
        edges = np.cumsum((0,) + tuple(st.dims))
        energies = [jnp.sum(jnp.where((lane >= lo) & (lane < hi), csq, 0.0), axis=1)
                    for lo, hi in zip(edges[:-1], edges[1:])]
    else:
        energies = [sq, sq, sq]
    return C_final, action, C, alpha, v_meta, energies, n, g_A


def _decide_kernel(m_ref, r_ref, a_ref, mat_ref, vec_ref, scal_ref, act_ref, c_ref, alpha_ref, cf_ref,
                   vm_ref, e_ref, norm_ref, ga_ref, *, st: Structure, n: int, block: int, prec=_HI):
    pl, plgpu = _pallas()
    if n % block:
        # the last block overhangs the arrays: masked loads and stores (no implicit masking here)
        idx = pl.program_id(0) * block + jax.lax.broadcasted_iota(jnp.int32, (block,), 0)
        mask = idx < n
        m, r, a = (plgpu.load(x, mask=mask, other=0.5) for x in (m_ref, r_ref, a_ref))
    else:
        mask = None
        m, r, a = m_ref[...], r_ref[...], a_ref[...]
    Cf, act, C, alpha, v_meta, energies, norm, g_A = _controller(m, r, a, mat_ref, vec_ref, scal_ref, st,
                                                                 True, prec)
    for ref, val in ((act_ref, act), (c_ref, C), (alpha_ref, alpha), (cf_ref, Cf), (norm_ref, norm),
                     (ga_ref, g_A)):
        plgpu.store(ref, val, mask=mask)
    plgpu.store(vm_ref, v_meta, mask=None if mask is None else jnp.broadcast_to(mask[:, None], (block, D)))
    # (B, 3) is not a power-of-two tile, so the energies go out as three strided column stores
    for k in range(3):
        plgpu.store(e_ref.at[:, pl.ds(k, 1)], energies[k][:, None],
                    mask=None if mask is None else mask[:, None])


def _compiler_params(interpret: bool, num_warps: int):
    plgpu = _pallas()[1]
    # The Triton lowering explicitly (jax's default GPU lowering for pallas_call is Mosaic GPU).
    return None if interpret else plgpu.CompilerParams(num_warps=num_warps, num_stages=1)


def _decide_flat(M, R, A, mats, vecs, scal, st: Structure, interpret: bool, block: int, num_warps: int,
                 precision: str = "ieee"):
    pl = _pallas()[0]
    n = M.shape[0]
    f32 = jnp.float32
    vec = lambda: pl.BlockSpec((block,), lambda i: (i,))  # noqa: E731
    whole = lambda shape: pl.BlockSpec(shape, lambda i: (0,) * len(shape))  # noqa: E731
    out_shape = [jax.ShapeDtypeStruct((n,), jnp.int32)] + [jax.ShapeDtypeStruct((n,), f32)] * 3 + [
        jax.ShapeDtypeStruct((n, D), f32), jax.ShapeDtypeStruct((n, 3), f32),
        jax.ShapeDtypeStruct((n,), f32), jax.ShapeDtypeStruct((n,), f32)]
    out_specs = [vec()] * 4 + [pl.BlockSpec((block, D), lambda i: (i, 0)),
                               pl.BlockSpec((block, 3), lambda i: (i, 0)), vec(), vec()]
    out = pl.pallas_call(
        functools.partial(_decide_kernel, st=st, n=n, block=block, prec=PRECISIONS[precision]),
        out_shape=out_shape, grid=(pl.cdiv(n, block),),
        in_specs=[vec(), vec(), vec(), whole((4, D, D)), whole((2, D)), whole((D,))],
        out_specs=out_specs, interpret=interpret, compiler_params=_compiler_params(interpret, num_warps),
        name="mdl_decide_fused",
    )(M, R, A, mats, vecs, scal)
    return _decision.Decision(*out)


def _decide_shaped(M, R, A, mats, vecs, scal, *, st, interpret, block, num_warps, precision="ieee"):
    shape = jnp.broadcast_shapes(M.shape, R.shape, A.shape)
    flat = [jnp.broadcast_to(x, shape).reshape(-1).astype(jnp.float32) for x in (M, R, A)]
    out = _decide_flat(*flat, mats, vecs, scal, st, interpret, block, num_warps, precision)
    return jax.tree.map(lambda t: t.reshape(shape + t.shape[1:]), out)


decide_jit = jax.jit(_decide_shaped, static_argnames=("st", "interpret", "block", "num_warps", "precision"))


def decide(M, R, A, cfg: MDLConfig, *, interpret: bool = False, block: int | None = None,
           num_warps: int | None = None, precision: str = "ieee") -> _decision.Decision:
    """The controller on the fused kernel: M, R, A of one shape S (float32) → Decision (fields S, v_meta
    S + (16,), energies S + (3,)). No checks here: ``mdl_jax.decide`` validates and routes; call
    this directly only with valid float32 signals and a config that ``supports``. ``interpret`` runs
    Pallas' interpreter (any backend); ``block`` (a power of two ≥ 16) records per program and
    ``num_warps``: ``BLOCK`` and ``NUM_WARPS`` when None; ``precision`` a key of ``PRECISIONS``."""
    block = BLOCK if block is None else block
    num_warps = NUM_WARPS if num_warps is None else num_warps
    if not isinstance(block, int) or block < 16 or block & (block - 1):
        raise ValueError(f"block: expected a power of two ≥ 16, got {block!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {tuple(PRECISIONS)}, got {precision!r}")
    if interpret and precision != "ieee":
        # XLA:CPU has no TF32 products, so interpret mode cannot show what this precision does
        raise ValueError(f"precision: {precision!r} runs only on a GPU; interpret mode takes 'ieee'")
    mats, vecs, scal = params(cfg)
    return decide_jit(M, R, A, mats, vecs, scal, st=structure(cfg), interpret=bool(interpret),
                       block=int(block), num_warps=int(num_warps), precision=precision)


# ------------------------------------------------------------------------------------ the sweep kernel

def _sweep_kernel(m_ref, r_ref, a_ref, adopt_ref, w_ref, mat_ref, vec_ref, scal_ref, out_ref, *,
                  st: Structure, block: int, steps: int):
    """One config × one record block (``steps`` × ``block`` records) → its raw weighted sums (Wp, 16):
    columns 0-3 the count of each action, 4 the number correct, 5 the sum of C_final."""
    pl = _pallas()[0]
    lane = jax.lax.broadcasted_iota(jnp.int32, (1, D), 1)

    def step(j, acc):
        sl = pl.ds(pl.multiple_of(j * block, block), block)
        m, r, a, adopt = m_ref[sl], r_ref[sl], a_ref[sl], adopt_ref[sl]
        C_final, action = _controller(m, r, a, mat_ref, vec_ref, scal_ref, st, False)
        correct = jnp.where((action == 0) == (adopt > 0.5), 1.0, 0.0)
        # the per-record statistics as a (block, 16) tile built by lane masks (no concatenation)
        stats = (jnp.where(lane == action[:, None], 1.0, 0.0)
                 + jnp.where(lane == 4, correct[:, None], 0.0)
                 + jnp.where(lane == 5, C_final[:, None], 0.0))
        # one (Wp, block) × (block, 16) product: every weight vector's sums at once; integer
        # weights below 2^24 sum exactly in float32 (IEEE products, HIGHEST)
        return acc + jnp.dot(w_ref[:, sl], stats, precision=_HI)

    acc = jnp.zeros(out_ref.shape, jnp.float32)
    out_ref[...] = jax.lax.fori_loop(0, steps, step, acc)


def _sweep_flat(M, R, A, adopt, w, mats, vecs, scal, *, st, interpret, block, rec_block, num_warps):
    pl = _pallas()[0]
    K = mats.shape[0]
    W, size = w.shape
    # Pad on the device (not on the host: a pass's kernel is short enough that a host copy would dominate) to
    # whole record blocks and ≥ 16 weight rows (every product dimension ≥ 16 for Triton's dot);
    # weight-0 records and rows add nothing.
    n = -(-size // rec_block) * rec_block
    Wp = pow2_at_least(W, D)
    M, R, A = (jnp.pad(x.astype(jnp.float32), (0, n - size), constant_values=0.5) for x in (M, R, A))
    adopt = jnp.pad(adopt.astype(jnp.float32), (0, n - size))
    w = jnp.pad(w.astype(jnp.float32), ((0, Wp - W), (0, n - size)))
    n_rb = n // rec_block
    rec = pl.BlockSpec((rec_block,), lambda k, b: (b,))

    def cfg_spec(shape):  # one config's leaves: the config axis squeezed away
        return pl.BlockSpec((None,) + shape, lambda k, b: (k,) + (0,) * len(shape))

    part = pl.pallas_call(
        functools.partial(_sweep_kernel, st=st, block=block, steps=rec_block // block),
        out_shape=jax.ShapeDtypeStruct((K, n_rb, Wp, D), jnp.float32), grid=(K, n_rb),
        in_specs=[rec, rec, rec, rec, pl.BlockSpec((Wp, rec_block), lambda k, b: (0, b)),
                  cfg_spec((4, D, D)), cfg_spec((2, D)), cfg_spec((D,))],
        out_specs=pl.BlockSpec((None, None, Wp, D), lambda k, b: (k, b, 0, 0)),
        interpret=interpret, compiler_params=_compiler_params(interpret, num_warps), name="mdl_sweep_fused",
    )(M, R, A, adopt, w, mats, vecs, scal)
    # the record blocks' partial sums, reduced here in XLA (exact for integer sums below 2^24)
    out = jnp.sum(part, axis=1)[:, :W]
    return out[..., 4], out[..., 0:4], out[..., 5]


sweep_jit = jax.jit(_sweep_flat, static_argnames=("st", "interpret", "block", "rec_block", "num_warps"))


def pow2_at_least(x: int, lo: int) -> int:
    """The smallest power of two ≥ ``x``, and at least ``lo`` (a block or grid size Triton accepts)."""
    return max(lo, 1 << max(0, int(x) - 1).bit_length())


def sweep_engine(cfg: MDLConfig, K: int, size: int, *, interpret: bool | None = None, fallback=None,
                 block: int | None = None, num_warps: int | None = None):
    """A ``sweep`` pass function on the fused kernel (the engine contract of ``sweep``):
    (M, R, A (size,) float32, adopt (size,) bool, w (W, size)) → NumPy (n_correct (K, W),
    counts (K, W, 4), C_final sums (K, W)), integer sums exact.

    ``cfg`` is a batch of K configs (leaves with a leading K). Passes with int32 weights (only when a
    pass's integer sums may reach 2^24, where float32 stops counting exactly) and a kernel that fails
    to lower go to ``fallback()``'s pass function (the pure-JAX engine). ``interpret`` None: Pallas
    interpret mode unless the default backend is a GPU. ``block``/``num_warps``: ``BLOCK``/``NUM_WARPS``
    when None."""
    block = BLOCK if block is None else block
    num_warps = NUM_WARPS if num_warps is None else num_warps
    if interpret is None:
        interpret = not on_gpu_backend() or mode() == "interpret"
    mats, vecs, scal = (jax.device_put(x) for x in pack_batch(cfg, K))
    st = structure(cfg)
    rec_block = min(SWEEP_BLOCK, pow2_at_least(size, block))
    blk = min(block, rec_block)
    backup: list = []   # the fallback engine, built on first need

    def other():
        if not backup:
            backup.append(fallback())
        return backup[0]

    def run_pass(M, R, A, adopt, w):
        if np.asarray(w).dtype != np.float32 or failed() is not None:
            if fallback is None:
                raise ValueError("fused sweep engine: expected float32 weights (integer sums below 2^24)")
            return other()(M, R, A, adopt, w)
        try:
            out = sweep_jit(M, R, A, adopt, w, mats, vecs, scal, st=st, interpret=bool(interpret),
                             block=blk, rec_block=rec_block, num_warps=num_warps)
            return tuple(np.asarray(x) for x in out)
        except Exception as e:  # noqa: BLE001 - a lowering/compile failure of the kernel on this device
            if fallback is None or interpret:
                raise
            give_up(e)
            return other()(M, R, A, adopt, w)

    return run_pass


@contextlib.contextmanager
def captured_triton_ir():
    """Collect the Triton MLIR modules Pallas builds while the block lowers kernels (``.lower(
    lowering_platforms=("cuda",))`` works without a GPU): how the tests and
    ``experiments/check_fused_ptx.py`` inspect the kernels here. Yields the list they are appended to."""
    from jax._src.pallas.triton import lowering

    modules = []
    real = lowering.lower_jaxpr_to_triton_module

    def keep(*a, **k):
        res = real(*a, **k)
        modules.append(res.module)
        return res

    lowering.lower_jaxpr_to_triton_module = keep
    try:
        yield modules
    finally:
        lowering.lower_jaxpr_to_triton_module = real
