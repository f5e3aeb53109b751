"""Memory stores per question (paper Section 5.1) and the calibration / evaluation split.

A store holds the conflicting positions under study plus noise:
  - up to ``n_correct`` reference correct answers (TruthfulQA: the best answer first, then others in file
    order, skipping non-answers such as "I have no comment"; HaluEval has one),
  - up to ``n_incorrect`` reference incorrect answers (TruthfulQA: drawn in file order; HaluEval: one),
  - HaluEval only: its knowledge snippet as a ``context`` record,
  - ``n_distractors`` records drawn, seeded, from the correct answers of *other* questions.
Defaults (2, 2, 2) give the paper's six-record stores on TruthfulQA for 679 of the 817 questions
(118 have a single usable correct or incorrect answer and get five records, 20 get four); HaluEval stores hold
1 + 1 + context + 2 = 5 records because the dataset has one answer of each kind.
Record order inside a store is shuffled with the same seed, so no position leaks the label.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from mdl_repro.pipeline.data import Item

NON_ANSWERS = ("i have no comment", "no comment")


@dataclasses.dataclass(frozen=True)
class MemoryRecord:
    text: str
    kind: str        # "correct" | "incorrect" | "context" | "distractor"
    source_qid: int  # the question the text was taken from


@dataclasses.dataclass(frozen=True)
class Store:
    item: Item
    records: tuple[MemoryRecord, ...]

    @property
    def texts(self) -> list[str]:
        return [r.text for r in self.records]


@dataclasses.dataclass(frozen=True)
class StoreConfig:
    """How stores are built. seed drives distractor choice and record order."""

    n_correct: int = 2
    n_incorrect: int = 2
    n_distractors: int = 2
    seed: int = 0

    def __post_init__(self):
        for f in ("n_correct", "n_incorrect", "n_distractors"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"{f}: expected a non-negative int, got {v!r}")
        if self.n_correct + self.n_incorrect == 0:
            raise ValueError("n_correct, n_incorrect: a store needs at least one reference answer")


def _answers(xs: Sequence[str], n: int) -> list[str]:
    out = []
    for x in xs:
        if x.strip().rstrip(".").lower() in NON_ANSWERS or x in out:
            continue
        out.append(x)
        if len(out) == n:
            break
    return out


def build_stores(items: Sequence[Item], cfg: StoreConfig = StoreConfig()) -> list[Store]:
    """One store per item. Distractors come from other items of the same list."""
    pool = [(it.qid, a) for it in items for a in _answers(it.correct, 1)]
    # Where each question's own entries sit in the pool: the distractor population of a question is
    # the pool without them, and rebuilding it by a scan per question cost O(N²) (seconds for HaluEval's
    # 10,000 rows). A contiguous run is cut out by slicing instead: the same list, so the same draws.
    where: dict = {}
    for i, (q, _) in enumerate(pool):
        where.setdefault(q, []).append(i)
    stores = []
    for it in items:
        rng = random.Random(f"{cfg.seed}:{it.dataset}:{it.qid}")  # per-question: stable under subsets
        recs = [MemoryRecord(a, "correct", it.qid) for a in _answers(it.correct, cfg.n_correct)]
        recs += [MemoryRecord(a, "incorrect", it.qid) for a in _answers(it.incorrect, cfg.n_incorrect)]
        if it.context:
            recs.append(MemoryRecord(it.context, "context", it.qid))
        own = where.get(it.qid, [])
        if not own:
            others = pool
        elif own[-1] - own[0] + 1 == len(own):
            others = pool[:own[0]] + pool[own[-1] + 1:]
        else:
            others = [p for p in pool if p[0] != it.qid]
        if len(others) < cfg.n_distractors:
            raise ValueError(f"items: {cfg.n_distractors} distractors need at least that many other "
                             f"questions with an answer; only {len(others)} for question {it.qid}")
        chosen = rng.sample(others, cfg.n_distractors)
        recs += [MemoryRecord(t, "distractor", q) for q, t in chosen]
        rng.shuffle(recs)
        stores.append(Store(it, tuple(recs)))
    return stores


def split_calibration(items: Sequence[Item], n_calibration: int = 80, seed: int = 0):
    """Seeded, disjoint (calibration, evaluation) split of the items (paper: 80 per dataset)."""
    if not 0 <= n_calibration < len(items):
        raise ValueError(f"n_calibration: expected 0 ≤ n < {len(items)} (the number of items), "
                         f"got {n_calibration}")
    order = list(range(len(items)))
    random.Random(f"split:{seed}").shuffle(order)
    cal = sorted(order[:n_calibration])
    ev = sorted(order[n_calibration:])
    return [items[i] for i in cal], [items[i] for i in ev]
