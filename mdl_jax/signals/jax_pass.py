"""The definition of the signals M, R, φ: a store padded and masked, one JAX pass (paper Section 3.2).

  M = max_j cos(e_q, e_mj)                                     (clipped to [0, 1]: see below)
  R = clip(s̄_rel · (1 - φ)², 0, 1), or 0.5 when fewer than two memories are relevant
      s̄_rel: mean pairwise cosine among relevant memories (cos(e_q, e_m) > RELEVANCE_THRESHOLD)
      φ: fraction of relevant pairs the lexical detector (``conflict``) flags

``aggregate_one`` is one store; ``aggregate`` its batched, jitted form; ``store_arrays`` pads stores of
texts into its inputs. Its own module because it is what ``memory_signals``' default engine runs and what
the small-store path of the others is tested against, apart from the choice among them
(``aggregation``, which re-exports these names). Deviation: the paper does not say what M is when every
cosine is negative; the controller needs M ∈ [0, 1], so M is clipped at 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from mdl_jax.signals.conflict import checked_conflict, checked_flags, pair_flags, pair_flags_among

RELEVANCE_THRESHOLD = 0.3
_HI = jax.lax.Precision.HIGHEST


@dataclasses.dataclass
class StoreArrays:
    """Padded per-store inputs of the aggregation.

    q: (B, d) query embeddings; mem: (B, S, d) memory embeddings (zeros where masked);
    mask: (B, S) real records; flags: (B, S, S) lexical conflict flags.
    """

    q: np.ndarray
    mem: np.ndarray
    mask: np.ndarray
    flags: np.ndarray


def aggregate_one(q, mem, mask, flags, threshold=RELEVANCE_THRESHOLD):
    """M, R, φ, n_relevant for ONE store: q (d,), mem (S, d), mask (S,), flags (S, S). An empty store
    (S = 0, or every slot masked) gives M = 0, R = 0.5, φ = 0, n_relevant = 0. Values are not checked
    (it runs traced, under ``aggregate``'s jit and vmap)."""
    S = mask.shape[0]
    cos_q = jnp.einsum("d,sd->s", q, mem, precision=_HI)
    sims = jnp.einsum("id,jd->ij", mem, mem, precision=_HI)
    # an empty store (masked, or S = 0) → M = 0; the initial value is below the clip, so M's bits are
    # those of the largest cosine otherwise
    M = jnp.clip(jnp.max(jnp.where(mask, cos_q, -1.0), initial=-1.0), 0.0, 1.0)
    rel = mask & (cos_q > threshold)
    pairs = rel[:, None] & rel[None, :] & (np.arange(S)[:, None] < np.arange(S)[None, :])
    n_pairs = jnp.sum(pairs)
    denom = jnp.maximum(n_pairs, 1)
    s_bar = jnp.sum(jnp.where(pairs, sims, 0.0)) / denom
    phi = jnp.sum(pairs & flags) / denom
    n_rel = jnp.sum(rel)
    R = jnp.where(n_rel >= 2, jnp.clip(s_bar * (1.0 - phi) ** 2, 0.0, 1.0), 0.5)
    return M, R, phi, n_rel


aggregate = jax.jit(jax.vmap(aggregate_one, in_axes=(0, 0, 0, 0, None)), static_argnums=4)


def store_arrays(stores: Sequence[Sequence[str]], q_emb: np.ndarray,
                 text_emb: Mapping[str, np.ndarray] | tuple[np.ndarray, Mapping[str, int]],
                 flags: Sequence | None = None,
                 conflict: Callable[[list[str]], npt.ArrayLike] = pair_flags, *,
                 pad_to: int | None = None, threshold: float | None = None) -> StoreArrays:
    """Pad stores into arrays. ``stores``: B lists of memory texts (a list may be empty); ``q_emb``
    (B, d); ``text_emb``: a mapping text → (d,) embedding, or (U (n, d), {text: row of U});
    ``flags``: per store an S_b×S_b boolean matrix, else computed with ``conflict``. ``pad_to``: add
    empty stores up to this many rows (so chunks of a stream share one compiled shape).
    ``threshold``: with the default (pairwise) detector, compute flags only among the memories that
    may be relevant (cosine above ``threshold`` less a bound on float32 rounding: a superset of those
    the aggregation counts, which reads no other pair), the rest False; same M, R, φ bits.

    Raises:
      TypeError: a store given as one string (``stores[b]``: its characters would be the memories).
      ValueError: ``flags`` not one matrix per store, or a matrix (``flags[b]``) or a ``conflict``
        detector's output that is no S_b×S_b matrix of booleans or 0/1."""
    for b, texts in enumerate(stores):
        if isinstance(texts, (str, bytes)):   # its characters would be read as the memories
            raise TypeError(f"stores[{b}]: expected a list of memory texts, got a {type(texts).__name__}")
    if conflict is not pair_flags:
        conflict = checked_conflict(conflict)
    B = len(stores)
    Bp = max(B, pad_to or 0)
    S = max(1, max((len(s) for s in stores), default=0))  # S ≥ 1: an all-empty chunk still has a shape
    d = q_emb.shape[1]
    if isinstance(text_emb, tuple):
        U, index = text_emb
    else:  # gather this chunk's vectors once, then index them
        rows: list[np.ndarray] = []
        index = {}
        for texts in stores:
            for t in texts:
                if t not in index:
                    index[t] = len(rows)
                    rows.append(text_emb[t])
        U = np.stack(rows).astype(np.float32) if rows else np.zeros((1, d), np.float32)
    idx = np.zeros((Bp, S), np.intp)
    mask = np.zeros((Bp, S), bool)
    fl = np.zeros((Bp, S, S), bool)
    if B and all(len(t) == S for t in stores):  # the common case: one conversion per chunk
        idx[:B] = [[index[t] for t in texts] for texts in stores]
        mask[:B] = True
    else:
        for b, texts in enumerate(stores):
            n = len(texts)
            if n:
                idx[b, :n] = [index[t] for t in texts]
                mask[b, :n] = True
    mem = np.asarray(U, np.float32)[idx]
    mem[~mask] = 0.0
    q = np.zeros((Bp, d), np.float32)
    q[:B] = q_emb
    fs: list
    if flags is None and conflict is pair_flags and threshold is not None and B:
        # |float32 dot - exact| ≤ d · 2^-24 · ‖q‖‖m‖ for either summation order (JAX's, NumPy's):
        # four times that, plus 1e-6, keeps every memory the JAX pass may count as relevant
        cos = np.einsum("bsd,bd->bs", mem[:B], q[:B])
        slack = (4 * d * 2.0 ** -24 + 1e-6) * np.linalg.norm(mem[:B], axis=2) \
            * np.linalg.norm(q[:B], axis=1)[:, None]
        keep = (mask[:B] & (cos > threshold - slack)).tolist()
        fs = [pair_flags_among(t, keep[b]) if t else [] for b, t in enumerate(stores)]
    else:
        if flags is not None and len(flags) != B:
            raise ValueError(f"flags: expected one matrix per store ({B}), got {len(flags)}")
        fs = [[] if not t else checked_flags(flags[b], len(t), f"flags[{b}]") if flags is not None
              else conflict(list(t)) for b, t in enumerate(stores)]
    if B and all(len(t) == S for t in stores):
        fl[:B] = np.asarray(fs, bool).reshape(B, S, S)
    else:
        for b, texts in enumerate(stores):
            n = len(texts)
            if n:
                fl[b, :n, :n] = np.asarray(fs[b], bool).reshape(n, n)
    return StoreArrays(q, mem, mask, fl)
