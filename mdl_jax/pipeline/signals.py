"""Signals M, R, A for every memory store, in one batched JAX pass (paper Section 3.2).

  M = max_j cos(e_q, e_mj)                                     (clipped to [0, 1]: see below)
  R = clip(s̄_rel · (1 - φ)², 0, 1), or 0.5 when fewer than two memories are relevant
      s̄_rel: mean pairwise cosine among relevant memories (cos(e_q, e_m) > 0.3)
      φ: fraction of relevant pairs the lexical detector (``conflict``) flags
  A = the risk tables of ``risk``
Stores are padded to the largest store size S and masked; embeddings are gathered from one matrix of
unique texts. The lexical flags are computed once per store (S(S-1)/2 pairs) in Python and enter the
JAX pass as a (B, S, S) boolean array. Deviation: the paper does not say what M is when every cosine
is negative; the controller needs M ∈ [0, 1], so M is clipped at 0.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mdl_jax.pipeline.conflict import pair_flags
from mdl_jax.pipeline.risk import risk
from mdl_jax.pipeline.stores import Store

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


def store_arrays(stores: Sequence[Store], q_emb: np.ndarray, text_emb: dict[str, np.ndarray],
                 flags: Sequence[list] | None = None) -> StoreArrays:
    """Pad the stores into arrays. ``text_emb`` maps every record text to its embedding."""
    B = len(stores)
    S = max(len(s.records) for s in stores)
    d = q_emb.shape[1]
    mem = np.zeros((B, S, d), np.float32)
    mask = np.zeros((B, S), bool)
    fl = np.zeros((B, S, S), bool)
    for b, s in enumerate(stores):
        n = len(s.records)
        mem[b, :n] = np.stack([text_emb[t] for t in s.texts])
        mask[b, :n] = True
        f = flags[b] if flags is not None else pair_flags(s.texts)
        fl[b, :n, :n] = np.asarray(f, bool)
    return StoreArrays(np.asarray(q_emb, np.float32), mem, mask, fl)


def compute_signals(stores: Sequence[Store], embedder, *, progress: bool = False,
                    batch: int = 4096) -> "pandas.DataFrame":  # noqa: F821
    """The signals table for ``stores``: one row per store.

    Columns: dataset, qid, category, question, M, R, A, phi, n_relevant, n_records.
    Every unique text (questions and records) is embedded once through ``embedder`` (cached).
    """
    import pandas as pd
    from tqdm.auto import tqdm

    if not stores:
        raise ValueError("stores: expected at least one store")
    questions = [s.item.question for s in stores]
    texts = sorted({t for s in stores for t in s.texts})
    q_emb = embedder.embed(questions, desc="embedding questions")
    t_emb = dict(zip(texts, embedder.embed(texts, desc="embedding memories")))
    rows = []
    for i in tqdm(range(0, len(stores), batch), desc="aggregating signals", disable=not progress):
        chunk = stores[i:i + batch]
        arr = store_arrays(chunk, q_emb[i:i + batch], t_emb)
        M, R, phi, n_rel = (np.asarray(x) for x in aggregate(arr.q, arr.mem, arr.mask, arr.flags,
                                                              RELEVANCE_THRESHOLD))
        for j, s in enumerate(chunk):
            it = s.item
            rows.append(dict(dataset=it.dataset, qid=it.qid, category=it.category,
                             question=it.question, M=float(M[j]), R=float(R[j]),
                             A=risk(it.dataset, it.question, it.category), phi=float(phi[j]),
                             n_relevant=int(n_rel[j]), n_records=len(s.records)))
    return pd.DataFrame(rows)


def signal_arrays(table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(M, R, A) float32 arrays from a signals table, ready for ``mdl_jax.decide``."""
    return tuple(table[c].to_numpy(np.float32) for c in ("M", "R", "A"))


def save_table(table, path: str | Path) -> Path:
    """Write the table as Parquet atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    table.to_parquet(tmp, index=False)
    tmp.replace(path)
    return path
