"""Paired sampling (common random numbers): the seeds every backend draws from, and the local backend's
per-row sampler.

``record_seed(dataset, qid, run seed)`` is one int per evaluated record, the same for every system. A
row's draws come from ``row_seed(record seed, prompt)``, so an answer is a function of (prompt, record)
alone, not of the system asking, the batch it shares or its position there. ``RowSampler`` is how the
local backend keeps that promise inside a batched ``transformers`` ``generate``: its noise is a
counter-based hash of (row seed, step, token id), with no generator state a neighbour could advance.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Sequence


def record_seed(dataset: str, qid, seed: int) -> int:
    """The sampling seed of one evaluated record: a function of (dataset, qid, run seed) only, so every
    system asking about the same record draws the same random numbers (31 bits: what servers take)."""
    return zlib.crc32(f"{dataset}:{qid}:{seed}".encode()) & 0x7FFFFFFF


def _prompt_key(prompt) -> str:
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


def row_seed(seed: int, prompt) -> int:
    """Seed of one row's generator: (record seed, prompt). Different prompts of one record (B1's and
    B2's) draw independent streams; the same prompt of the same record always draws the same one."""
    h = hashlib.sha256(f"{int(seed)}\0{_prompt_key(prompt)}".encode()).digest()
    return int.from_bytes(h[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def seed_list(seed, n: int) -> list[int]:
    """One seed per prompt: ``seed`` repeated ``n`` times, or ``seed``'s ``n`` ints; ValueError otherwise."""
    if isinstance(seed, (int,)) or hasattr(seed, "__index__"):
        return [int(seed)] * n
    seeds = [int(x) for x in seed]
    if len(seeds) != n:
        raise ValueError(f"seed: expected one int or {n} ints (one per prompt), got {len(seeds)}")
    return seeds


_MASK64 = (1 << 64) - 1


def _i64(c: int) -> int:
    """A 64-bit constant as the signed int64 torch stores (two's complement)."""
    c &= _MASK64
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x, k: int):
    # logical right shift of int64 (torch's >> is arithmetic on negative numbers)
    return (x >> k) & ((1 << (64 - k)) - 1)


def _uniform(seeds, step: int, tokens):
    """Counter-based uniforms in (0, 1): splitmix64 of (row seed, step, token id). The same draw for the
    same (row, step, token) whatever the batch, the order or the other rows: no generator state."""
    import torch

    step_t = torch.tensor(step, dtype=torch.int64)
    x = (seeds[:, None] * _i64(0x9E3779B97F4A7C15) + step_t * _i64(0xD1B54A32D192ED03)
         + tokens.to(torch.int64) * _i64(0x8CB92BA72F3D8DD7))
    x = (x ^ _shr(x, 30)) * _i64(0xBF58476D1CE4E5B9)
    x = (x ^ _shr(x, 27)) * _i64(0x94D049BB133111EB)
    x = x ^ _shr(x, 31)
    return (_shr(x, 11).to(torch.float64) + 0.5) / float(1 << 53)


class RowSampler:
    """Temperature + top-p sampling with one random stream per row, written as a logits processor.

    For each row it keeps the smallest set of tokens whose probability reaches ``top_p`` (as HF's
    TopPLogitsWarper) and draws one token with the exponential race (argmax p_i / E_i, E_i ~ Exp(1):
    an exact draw from p), then returns scores that are finite only there; greedy decoding emits it.
    The noise E_i is a counter-based hash of (row seed, step, token id) (``_uniform``): no generator
    state, so a row's draws never depend on its batch neighbours or order, and because it is indexed
    by token id, a tiny change in a row's logits (bf16 under another batch shape) flips the draw only
    where two tokens nearly tie in the race.

    Cost: the nucleus is searched in the top 256 tokens (``torch.topk``, O(V)); only a row whose
    nucleus is wider falls back to a full sort. A full sort with one generator draw per vocabulary
    entry (49,152 per row) costs far more than the model's own step at batch 32; this search costs
    a small fraction of it.
    """

    K = 256

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float):
        import torch

        self.seeds = torch.tensor([_i64(int(s)) for s in seeds], dtype=torch.int64)
        self.temperature = temperature
        self.top_p = top_p
        self.step = 0  # generate calls a processor once per new token: the step of every row

    def __call__(self, input_ids, scores):
        import torch

        step = self.step
        self.step += 1
        z = scores.float() / self.temperature
        lse = torch.logsumexp(z, dim=-1, keepdim=True)
        k = min(self.K, z.shape[-1])
        top, idx = torch.topk(z, k, dim=-1)  # sorted, descending
        p = torch.exp(top - lse)
        before = torch.cumsum(p, -1) - p
        keep = before < self.top_p  # mass before this token not yet ≥ top_p
        wide = keep[:, -1] & (before[:, -1] + p[:, -1] < self.top_p)
        any_wide = bool(wide.any())
        if any_wide:  # nucleus wider than k tokens: those rows take the full sort
            rows = torch.nonzero(wide).flatten()
            pf = torch.exp(z[rows] - lse[rows])
            sp, si = torch.sort(pf, dim=-1, descending=True)
            kf = (torch.cumsum(sp, -1) - sp) < self.top_p
            n = int(kf.sum(-1).max())
            top_w, idx_w = sp[:, :n], si[:, :n]
            keep_w = kf[:, :n]
        out = torch.full_like(scores, float("-inf"))
        e = -torch.log(_uniform(self.seeds, step, idx))
        race = torch.where(keep, p.double() / e, torch.zeros_like(e))
        pick = idx.gather(1, race.argmax(-1, keepdim=True)).flatten()
        if any_wide:
            e_w = -torch.log(_uniform(self.seeds[rows], step, idx_w))
            race_w = torch.where(keep_w, top_w.double() / e_w, torch.zeros_like(e_w))
            pick[rows] = idx_w.gather(1, race_w.argmax(-1, keepdim=True)).flatten()
        out[torch.arange(out.shape[0]), pick] = 0.0
        return out


# -- the same sampler in NumPy, for engines whose logits arrive as arrays (llama.cpp) -----------------

_U64 = ("0x9E3779B97F4A7C15", "0xD1B54A32D192ED03", "0x8CB92BA72F3D8DD7", "0xBF58476D1CE4E5B9",
        "0x94D049BB133111EB")


def _uniform_np(seeds, steps, tokens):
    """``_uniform`` in NumPy: splitmix64 of (row seed, row step, token id) in uint64 arithmetic, which
    wraps mod 2^64 as torch's int64 does, so the bits are the same. ``seeds`` and ``steps`` hold one
    entry per row (rows of a continuously batched engine are at different steps), ``tokens`` (rows, k)."""
    import numpy as np

    c1, c2, c3, m1, m2 = (np.uint64(int(c, 16)) for c in _U64)
    s = np.asarray(seeds, dtype=np.uint64)[:, None]
    t = np.asarray(steps, dtype=np.uint64)[:, None]
    with np.errstate(over="ignore"):
        x = s * c1 + t * c2 + np.asarray(tokens).astype(np.uint64) * c3
        x = (x ^ (x >> np.uint64(30))) * m1
        x = (x ^ (x >> np.uint64(27))) * m2
        x = x ^ (x >> np.uint64(31))
    return ((x >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


# Candidates of the fast path in sample_rows: tokens within a factor e^-9 (1.2e-4) of the most likely
# one. A bound on what is sorted, not on what can be drawn: a row whose candidates hold less than
# top_p of the mass takes the exact top-k path below.
_CAND_LOG = 9.0


def sample_rows(logits, seeds, steps, temperature: float, top_p: float, k: int = RowSampler.K):
    """One token per row of ``logits`` (rows, vocab), drawn as ``RowSampler`` draws it: temperature,
    the smallest top-p nucleus (searched in the top ``k``, a full sort only for a wider one), and the
    exponential race on the counter-based noise of (row seed, row step, token id). Greedy
    (argmax) when ``temperature`` is 0. Same algorithm and noise as the torch sampler, so equal
    logits give the same token; logits equal up to float rounding flip a draw only at near-ties.

    How it finds the nucleus fast: the nucleus is a prefix of the tokens sorted by probability, so any
    set of the most likely tokens whose mass reaches top_p contains it, and the same prefix sums over
    that set decide it. Each row first sorts only the tokens within e^-9 of its most likely one (tens
    at T = 0.7, where ``argpartition`` over all 49,152 would be a visible share of a token's time at
    batch 32); a row whose candidates hold less than top_p takes the top-``k`` path, as before."""
    import numpy as np

    z = np.asarray(logits, dtype=np.float32)
    if z.ndim != 2:
        raise ValueError(f"logits: expected (rows, vocab), got shape {z.shape}")
    if temperature <= 0:
        return z.argmax(-1)
    z = z / np.float32(temperature)
    m = z.max(-1, keepdims=True)
    w = z - m
    np.exp(w, out=w)  # in place: at batch 32 × 49,152 tokens each full pass costs milliseconds
    lse = m + np.log(w.sum(-1, keepdims=True, dtype=np.float32))
    seeds = np.asarray(seeds, dtype=np.uint64)
    steps = np.asarray(steps, dtype=np.uint64)
    pick = np.empty(len(z), dtype=np.int64)
    rest = []
    tau = np.float32(np.exp(-_CAND_LOG))
    for r in range(len(z)):
        c = np.flatnonzero(w[r] >= tau)
        zc = z[r, c]
        order = np.argsort(-zc, kind="stable")  # descending; ties by token id
        c, zc = c[order], zc[order]
        p = np.exp(zc - lse[r])
        cs = np.cumsum(p, dtype=np.float32)
        if not len(c) or not cs[-1] >= top_p:
            rest.append(r)
            continue
        n = int(((cs - p) < top_p).sum())  # prefix sums are nondecreasing: the nucleus is a prefix
        e = -np.log(_uniform_np(seeds[r:r + 1], steps[r:r + 1], c[None, :n]))[0]
        pick[r] = c[int((p[:n].astype(np.float64) / e).argmax())]
    if rest:
        rows = np.asarray(rest)
        pick[rows] = _sample_top_k(z[rows], lse[rows], seeds[rows], steps[rows], top_p, k)
    return pick


def _sample_top_k(z, lse, seeds, steps, top_p: float, k: int):
    """``sample_rows`` for rows whose fast-path candidates fall short of top_p: the nucleus searched
    in the top ``k`` (``RowSampler``'s algorithm step for step), a full sort for a wider one."""
    import numpy as np

    k = min(k, z.shape[-1])
    part = np.argpartition(z, z.shape[-1] - k, axis=1)[:, -k:]
    top = np.take_along_axis(z, part, 1)
    order = np.argsort(-top, axis=1, kind="stable")  # sorted, descending (as torch.topk)
    idx, top = np.take_along_axis(part, order, 1), np.take_along_axis(top, order, 1)
    p = np.exp(top - lse)
    before = np.cumsum(p, -1, dtype=np.float32) - p
    keep = before < top_p  # mass before this token not yet ≥ top_p
    wide = keep[:, -1] & (before[:, -1] + p[:, -1] < top_p)
    e = -np.log(_uniform_np(seeds, steps, idx))
    race = np.where(keep, p.astype(np.float64) / e, 0.0)
    pick = idx[np.arange(len(z)), race.argmax(-1)]
    for r in np.flatnonzero(wide):  # nucleus wider than k tokens: the full sort for that row
        pf = np.exp(z[r] - lse[r])
        si = np.argsort(-pf, kind="stable")
        sp = pf[si]
        n = int(((np.cumsum(sp, dtype=np.float32) - sp) < top_p).sum())
        e_w = -np.log(_uniform_np(seeds[r:r + 1], steps[r:r + 1], si[None, :n]))[0]
        pick[r] = si[int((sp[:n].astype(np.float64) / e_w).argmax())]
    return pick

_RowSampler = RowSampler  # the earlier private name, which tests still use
