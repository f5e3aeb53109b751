"""Signals M, R, φ for query + memory stores, in one batched JAX pass (paper Section 3.2).

  M = max_j cos(e_q, e_mj)                                     (clipped to [0, 1]: see below)
  R = clip(s̄_rel · (1 - φ)², 0, 1), or 0.5 when fewer than two memories are relevant
      s̄_rel: mean pairwise cosine among relevant memories (cos(e_q, e_m) > 0.3)
      φ: fraction of relevant pairs the lexical detector (``conflict``) flags
A comes from ``risk``. This is the one implementation behind both the benchmark pipeline
(``mdl_jax.pipeline.store_signals``) and the memory gate (``mdl_jax.gate``): both call
``memory_signals``. Stores are padded to the largest store size S and masked; embeddings are gathered
from one matrix of unique texts. The lexical flags are computed once per store (S(S-1)/2 pairs) in
Python and enter the JAX pass as a (B, S, S) boolean array. Deviation: the paper does not say what M is
when every cosine is negative; the controller needs M ∈ [0, 1], so M is clipped at 0.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax.signals.conflict import pair_flags

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
    """M, R, φ, n_relevant for ONE store: q (d,), mem (S, d), mask (S,), flags (S, S)."""
    S = mask.shape[0]
    cos_q = jnp.einsum("d,sd->s", q, mem, precision=_HI)
    sims = jnp.einsum("id,jd->ij", mem, mem, precision=_HI)
    M = jnp.clip(jnp.max(jnp.where(mask, cos_q, -1.0)), 0.0, 1.0)  # empty store → M = 0
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


def store_arrays(stores: Sequence[Sequence[str]], q_emb: np.ndarray, text_emb: Mapping[str, np.ndarray],
                 flags: Sequence | None = None,
                 conflict: Callable[[Sequence[str]], Sequence] = pair_flags) -> StoreArrays:
    """Pad stores into arrays. ``stores``: B lists of memory texts (a list may be empty); ``q_emb``
    (B, d); ``text_emb`` maps every memory text to its (d,) embedding; ``flags``: per store an S_b×S_b
    boolean matrix, else computed with ``conflict``."""
    B = len(stores)
    S = max(1, max((len(s) for s in stores), default=0))  # S ≥ 1: an all-empty chunk still has a shape
    d = q_emb.shape[1]
    mem = np.zeros((B, S, d), np.float32)
    mask = np.zeros((B, S), bool)
    fl = np.zeros((B, S, S), bool)
    for b, texts in enumerate(stores):
        n = len(texts)
        if not n:
            continue
        mem[b, :n] = np.stack([text_emb[t] for t in texts])
        mask[b, :n] = True
        f = flags[b] if flags is not None else conflict(list(texts))
        fl[b, :n, :n] = np.asarray(f, bool).reshape(n, n)
    return StoreArrays(np.asarray(q_emb, np.float32), mem, mask, fl)


def memory_signals(queries: Sequence[str], stores: Sequence[Sequence[str]], embedder, *,
                   conflict: Callable[[Sequence[str]], Sequence] = pair_flags,
                   threshold: float = RELEVANCE_THRESHOLD, batch: int = 4096,
                   progress: bool = False) -> dict[str, np.ndarray]:
    """M, R, φ and the number of relevant memories for B (query, memory texts) pairs.

    ``embedder.embed(texts, desc=...)`` → (N, d) unit-norm float32. Every query and every unique memory
    text is embedded once (the embedder batches and caches); stores are aggregated ``batch`` at a time
    so padding memory stays bounded. Returns {"M", "R", "phi": (B,) float32, "n_relevant": (B,) int32}.
    """
    from tqdm.auto import tqdm

    if len(queries) != len(stores):
        raise ValueError(f"stores: expected one memory list per query ({len(queries)}), "
                         f"got {len(stores)}")
    B = len(queries)
    out = {"M": np.zeros(B, np.float32), "R": np.zeros(B, np.float32),
           "phi": np.zeros(B, np.float32), "n_relevant": np.zeros(B, np.int32)}
    if not B:
        return out
    texts = sorted({t for s in stores for t in s})
    q_emb = np.asarray(embedder.embed(list(queries), desc="embedding queries"), np.float32)
    t_emb = dict(zip(texts, embedder.embed(texts, desc="embedding memories"))) if texts else {}
    for i in tqdm(range(0, B, batch), desc="aggregating signals", disable=not progress):
        arr = store_arrays(stores[i:i + batch], q_emb[i:i + batch], t_emb, conflict=conflict)
        res = aggregate(arr.q, arr.mem, arr.mask, arr.flags, threshold)
        for k, x in zip(("M", "R", "phi", "n_relevant"), res):
            out[k][i:i + batch] = np.asarray(x)
    return out
