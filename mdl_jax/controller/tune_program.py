"""The tuning program: B runs of gradient descent on the soft decision, in one jitted ``lax.scan``.

A run is a start point, a field mask and a pair of (training, validation) weight vectors over shared
records; runs with the same field set form a group that is vmapped, and every group trains in one
compiled program (``train_groups``), on a 2-D (runs, records) device mesh when one is given. Its own
module because it is the compiled part: what it takes is arrays and one frozen ``TuneSettings``
value (a key of the program), and the checks, padding, placement and results that surround it live
in ``tuning``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from mdl_jax.controller import decision as _d
from mdl_jax.controller.config import NUMERIC_FIELDS, MDLConfig
from mdl_jax.controller.tune_params import from_unconstrained
from mdl_jax.controller.tune_settings import TuneSettings

# Fields that change v_meta (and so ‖v_meta‖ and α). When a run trains none of them, the raw norm and α
# of every record are the same at every step: they are computed once, before the training loop, and
# each step only redoes the read-out normalisation, the gate and the threshold (the "gates" field set).
FUSION_FIELDS = ("sigma", "eps_c", "gains", "g_A_coeffs", "bias")


def _features(M, R, A, cfg):
    """(raw norm, α) of one record: the part of Algorithm 1 before n_min/n_max and the gate."""
    v_meta, v_wm, _ = _d.fuse(M, R, A, cfg)
    _, alpha, n = _d.read_out(v_meta, v_wm, cfg)
    return n, alpha


def _c_final_from_features(n, alpha, cfg):
    n_min = jnp.asarray(cfg.n_min, n.dtype)
    n_max = jnp.asarray(cfg.n_max, n.dtype)
    C = jnp.clip((n - n_min) / (n_max - n_min), 0.0, 1.0)   # eq. (2), as decision.read_out
    return _d.gate(C, alpha, cfg)


def _soft_adopt_logit(M, R, A, cfg, tau):
    # (C_final − θ0)/τ for one record; its sigmoid is P(adopt) = P(ACTIVE).
    C_final = _c_final_from_features(*_features(M, R, A, cfg), cfg)
    th = jnp.asarray(cfg.thresholds, C_final.dtype)
    return (C_final - th[0]) / tau, C_final


def _optax_call(fn, *args):
    """``fn(*args)`` for an optax optimiser or schedule, under JAX's standard dtype promotion.

    optax's schedules and Adam's bias correction mix Python floats with the int32 step count (e.g.
    ``1 - b1 ** count``); that promotion is the library's own choice, so it keeps JAX's standard rules
    whatever the caller's setting, and the tuning code around it stays strict-clean."""
    with jax.numpy_dtype_promotion("standard"):
        return fn(*args)


class _Carry(NamedTuple):
    params: dict
    opt_state: optax.OptState
    best_params: dict
    best_val: jax.Array
    best_step: jax.Array
    since_best: jax.Array
    stopped: jax.Array
    stopped_step: jax.Array
    diverged_step: jax.Array


def _finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _valid(c: MDLConfig) -> jax.Array:
    """MDLConfig's invariants on traced float32 values. The parametrisation keeps them for finite
    free parameters in exact arithmetic; far out (|u| ~ 1e37) float32 rounding breaks them
    (n_min + 1e-3 == n_min), which is divergence too."""
    th = jnp.asarray(c.thresholds)
    gmin = jnp.min(c.gains)
    return (_finite([getattr(c, f) for f in NUMERIC_FIELDS]) & (c.sigma > 0) & (gmin >= 0)
            & ((c.eps_c == 0) | ((c.eps_c > 0) & (c.eps_c < gmin)))
            & jnp.all((th >= 0) & (th <= 1)) & (th[0] >= th[1]) & (th[1] >= th[2]) & (c.n_max > c.n_min))


class Records(NamedTuple):
    """The records every run of a program trains on: (N,) signals, labels, and the base config's
    (raw norm, α) per record when some group trains no fusion field (else None)."""

    M: jax.Array
    R: jax.Array
    A: jax.Array
    y: jax.Array
    feats: tuple | None = None


class Run(NamedTuple):
    """One run's own arrays: start point, field mask, training and validation weights."""

    u0: dict
    mask: dict
    w_train: jax.Array
    w_val: jax.Array


class Group(NamedTuple):
    """What a group of runs shares, static: the base config, the trained fields, and whether they
    include a field of FUSION_FIELDS (if not, every step reuses the records' precomputed features)."""

    base: MDLConfig
    trained: tuple
    fused: bool


def _train_one(run: Run, data: Records, group: Group, settings: TuneSettings):
    """One run: lax.scan over steps. Returns (best params, per-step history, scalars).

    Without a fusion field in the group, ``data.feats`` = (raw norm, α) of every record, computed once
    for the whole program, and a step costs a few flops per record."""
    u0, mask, w_train, w_val = run
    M, R, A, y, feats = data
    base, trained, fused = group
    steps, patience = settings.steps, settings.patience
    opt = settings.resolved_optimizer
    temperature = settings.resolved_temperature
    if fused:
        logits_of = jax.vmap(_soft_adopt_logit, in_axes=(0, 0, 0, None, None))
    else:
        def logits_of(M, R, A, cfg, tau):
            C_final = _c_final_from_features(feats[0], feats[1], cfg)
            return (C_final - jnp.asarray(cfg.thresholds, C_final.dtype)[0]) / tau, C_final
    wt = w_train / jnp.sum(w_train)
    wv_sum = jnp.maximum(jnp.sum(w_val), 1e-12)
    has_val = jnp.sum(w_val) > 0  # without a validation part: no early stopping, keep the last step

    # One flat parameter vector (ravel_pytree), not a dict of nine leaves: the optimiser, the masks
    # and the best-step bookkeeping are then a few ops on one array instead of nine each, which keeps
    # the compiled program small.
    from jax.flatten_util import ravel_pytree

    u0, unravel = ravel_pytree(u0)
    mask = ravel_pytree(jax.tree.map(lambda m, x: jnp.broadcast_to(m, jnp.shape(x)), mask,
                                     unravel(u0)))[0]

    def loss_fn(u, tau):
        z, C_final = logits_of(M, R, A, from_unconstrained(unravel(u), base, trained), tau)
        # cross-entropy of sigmoid(z) against y, stable for large |z|
        per = jnp.where(y, jax.nn.softplus(-z), jax.nn.softplus(z))
        return jnp.sum(wt * per), z

    def step(carry: _Carry, k):
        tau = _optax_call(temperature, k)
        (loss, z), grads = jax.value_and_grad(loss_fn, has_aux=True)(carry.params, tau)
        grads = grads * mask
        updates, opt_state = _optax_call(opt.update, grads, carry.opt_state, carry.params)
        stepped = carry.params + updates
        c = from_unconstrained(unravel(stepped), base, trained)
        # Divergence (a non-finite loss, gradient, parameter or config) stops the run where it is:
        # the update is not applied, so the run keeps finite parameters, and the step is reported.
        diverged = ~(jnp.isfinite(loss) & _finite(grads) & _finite(stepped) & _valid(c)) & ~carry.stopped
        moving = ~carry.stopped & ~diverged
        params = jnp.where(moving, stepped, carry.params)
        hard_correct = ((z >= 0) == y).astype(jnp.float32)   # hard decision of the params scored
        train_acc = jnp.sum(wt * hard_correct)
        val_acc = jnp.sum(w_val * hard_correct) / wv_sum
        better = (val_acc > carry.best_val) & ~carry.stopped
        best_params = jnp.where(better, carry.params, carry.best_params)
        since = jnp.where(better, 0, carry.since_best + 1)
        stop_now = ((since >= patience) & ~carry.stopped & has_val) | diverged
        new = _Carry(params, opt_state, best_params, jnp.where(better, val_acc, carry.best_val),
                     jnp.where(better, k, carry.best_step), since, carry.stopped | stop_now,
                     jnp.where(stop_now, k, carry.stopped_step),
                     jnp.where(diverged, k, carry.diverged_step))
        c = from_unconstrained(unravel(params), base, trained)  # the invariants, step by step (tests check them)
        return new, {"loss": loss, "train_accuracy": train_acc, "val_accuracy": val_acc,
                     "temperature": tau, "sigma": c.sigma, "eps_c": c.eps_c, "min_gain": jnp.min(c.gains),
                     "thresholds": c.thresholds, "n_min": c.n_min, "n_max": c.n_max}

    init = _Carry(u0, _optax_call(opt.init, u0), u0, jnp.float32(-1.0), jnp.int32(0), jnp.int32(0),
                  jnp.bool_(False), jnp.int32(steps), jnp.int32(-1))
    final, hist = jax.lax.scan(step, init, jnp.arange(steps))
    final = final._replace(best_params=unravel(jnp.where(has_val, final.best_params, final.params)),
                           best_step=jnp.where(has_val, final.best_step, steps - 1))
    # soft vs hard on the training records at the final temperature, for the kept parameters (through
    # the same forward as training, so a "gates" group still never recomputes the fusion)
    cfg = from_unconstrained(final.best_params, base, trained)
    C_final = logits_of(M, R, A, cfg, 1.0)[1]
    probs = jax.vmap(_d.soft_action_probs, in_axes=(0, None, None))(
        C_final, cfg, _optax_call(settings.final_temperature))
    hard = jax.vmap(_d.act, in_axes=(0, None))(C_final, cfg)
    differ = (jnp.argmax(probs, -1) != hard).astype(jnp.float32)
    on_train = w_train > 0
    # record counts as float32 (exact below 2^24) for the two shares: the float32 values JAX's implicit
    # int32 → float32 promotion gave, written out so the program also traces under strict promotion
    n_train = jnp.maximum(jnp.sum(on_train), 1).astype(jnp.float32)
    disagreement = jnp.sum(jnp.where(on_train, differ, 0.0)) / n_train
    adopt_share = jnp.sum(on_train & (hard == _d.Action.ACTIVE)).astype(jnp.float32) / n_train
    scalars = {"best_step": final.best_step, "stopped_step": final.stopped_step,
               "diverged_step": final.diverged_step, "best_val_accuracy": final.best_val,
               "disagreement": disagreement, "adopt_share": adopt_share}
    return final.best_params, hist, scalars


@functools.partial(jax.jit, static_argnames=("base", "kinds", "settings", "mesh"))
def train_groups(groups, data: Records, *, base: MDLConfig, kinds: tuple, settings: TuneSettings, mesh=None):
    """Every group of runs (one per distinct field set) in ONE program; each group is vmapped.

    With a 2-D ("runs", "records") mesh each device trains its runs on its records: the losses and
    accuracies are sums over records, so their values and gradients become cross-device sums that XLA
    inserts.

    Args:
      groups: a tuple of ``Run``s, each array with a leading run axis (a multiple of the mesh's
        "runs" length).
      data: the (N,) records (N a multiple of the mesh's "records" length).
      base: the starting config, hashable (plain floats and tuples): static.
      kinds: per group, (trained field set, whether it includes a field of ``FUSION_FIELDS``).
      settings: how to train: static.
      mesh: the (runs, records) mesh, or None for one device.

    Returns:
      Per group, (best free parameters, per-step history, scalars), each with the group's run axis.
    """
    out = []
    feats = None
    M, R, A, y = data.M, data.R, data.A, data.y
    if mesh is not None:
        on_records = NamedSharding(mesh, PartitionSpec("records"))
        M, R, A, y = jax.lax.with_sharding_constraint((M, R, A, y), on_records)
    for (u0, masks, w_train, w_val), (tr, fz) in zip(groups, kinds):
        if mesh is not None:
            u0, masks = jax.lax.with_sharding_constraint((u0, masks), NamedSharding(mesh, PartitionSpec("runs")))
            w_train, w_val = jax.lax.with_sharding_constraint(
                (w_train, w_val), NamedSharding(mesh, PartitionSpec("runs", "records")))
        if not fz and feats is None:  # once for every non-fusion group: the base config's (n, α)
            feats = jax.vmap(_features, in_axes=(0, 0, 0, None))(M, R, A, base)
        records = Records(M, R, A, y, feats)
        group = Group(base, tr, fz)

        def one(u0, masks, w_train, w_val, records=records, group=group):
            return _train_one(Run(u0, masks, w_train, w_val), records, group, settings)
        out.append(jax.vmap(one)(u0, masks, w_train, w_val))
    if mesh is not None:  # small results, replicated: every device (and process) can read them whole
        out = jax.lax.with_sharding_constraint(out, NamedSharding(mesh, PartitionSpec()))
    return out


@jax.jit
def start_points(start: dict, masks: dict, keys, noise):
    """Each run's starting free parameters: seed 0 (noise 0) starts exactly at ``start``; another seed
    adds N(0, init_noise²) to its run's trained leaves (its own key per leaf).

    Args:
      start: {field: free parameter} of the base config (``to_unconstrained``).
      masks: {field: (B,) 1.0 where the run trains the field}.
      keys: (B, 2) uint32 PRNG keys.
      noise: (B,) float32 noise scales (0 for seed 0).

    Returns:
      {field: (B, ...) free parameters}.
    """
    def one(key, scale, mask):
        leaves, tree = jax.tree.flatten(start)
        ks = jax.random.split(key, len(leaves))
        noisy = jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape)
                                          for x, k in zip(leaves, ks)])
        return jax.tree.map(lambda n, x, m: jnp.where(m > 0, n, x), noisy, start, mask)
    return jax.vmap(one)(keys, noise, masks)


@functools.partial(jax.jit, static_argnames=("base", "trained"))
def constrained_fields(u: dict, *, base: MDLConfig, trained: tuple) -> dict:
    """A group's best free parameters (leading run axis) → the config fields, in one call.

    Args:
      u: {field: (B, ...) free parameters}.
      base: the hashable starting config (static).
      trained: the group's trained fields (static).

    Returns:
      {numeric field: (B, ...) value}.
    """
    def one(p):
        c = from_unconstrained(p, base, trained)
        return {f: getattr(c, f) for f in NUMERIC_FIELDS}
    return jax.vmap(one)(u)



def head(x, n: int):
    """The first ``n`` rows of a leaf (a named function, not a lambda in a loop: it binds ``n`` now)."""
    return x[:n]
