"""AdaRAGUE (ACL 2025): a field-sized reader's answers with no, one and multi-step retrieval, for scoring
adaptive-retrieval gates offline, and the answer accuracy its report defines.

The data are the joined files ``adarague_llama8b/joined/<dataset>_<split>.jsonl`` (six data sets × test and
dev_500, 500 questions each), written from the authors' repository by the ``join.py`` beside them; their
``REPORT.md`` says how the pieces fit.
"""

from __future__ import annotations

import dataclasses
import re
import string
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mdl_jax.evaluation.datasets.files import DataError, iter_jsonl, need_text
from mdl_jax.evaluation.datasets.items import BenchmarkItem, BenchmarkSpec, clean, frozen_mapping, normalize_answer

ADARAGUE_DATASETS = ("nq", "squad", "trivia", "hotpotqa", "2wikimultihopqa", "musique")
ADARAGUE_SPLITS = tuple(f"{d}_{s}" for d in ADARAGUE_DATASETS for s in ("test", "dev_500"))
ADARAGUE_MAX = 15


def _need_str(prediction: object) -> str:
    if not isinstance(prediction, str):
        raise TypeError(f"prediction: expected a string, got {type(prediction).__name__}")
    return prediction


def acc(prediction: str, golds: Sequence[str]) -> int:
    """The report's Acc: 1 when any SQuAD-normalised gold answer is a non-empty substring of the
    SQuAD-normalised prediction, else 0 (the repository's ``calculate_acc``).

    Args:
        prediction: the reader's answer.
        golds: the gold answers (aliases included).

    Returns:
        1 or 0.

    Raises:
        TypeError: ``prediction`` is not a string.
    """
    p = normalize_answer(_need_str(prediction))
    return int(any(g and g in p for g in (normalize_answer(x) for x in golds)))


_TOKEN = re.compile(r"(?:[^\W_]|[\u0300-\u036f])+|\S")
_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def _tokens(text: str) -> list[str]:
    s = unicodedata.normalize("NFD", text).lower()
    s = "".join(" " if ch in _PUNCT else ch for ch in s)
    return _TOKEN.findall(" ".join(_ARTICLES.sub(" ", s).split()))


def acc_tok(prediction: str, golds: Sequence[str]) -> int:
    """The report's ``tok`` variant, a standard-library reading of the paper's In-Accuracy: NFD,
    punctuation to spaces, articles dropped, and some gold answer's tokens must occur as a contiguous run of
    the prediction's tokens.

    Args, returns and raises: as ``acc``.
    """
    t = _tokens(_need_str(prediction))
    for g in golds:
        a = _tokens(g)
        if a and any(t[i:i + len(a)] == a for i in range(len(t) - len(a) + 1)):
            return 1
    return 0


@dataclasses.dataclass(frozen=True)
class AdaRAGUEItem(BenchmarkItem):
    """A ``BenchmarkItem`` that also carries the reader's three answers and the test-split signals.

    Attributes:
        source: the source data set (``"nq"``, ``"squad"``, ``"trivia"``, ``"hotpotqa"``,
            ``"2wikimultihopqa"``, ``"musique"``).
        split: ``"test"`` or ``"dev_500"``.
        answer_no_retrieval: Llama-3.1-8B-Instruct's answer with no retrieval.
        answer_one_retrieval: with one BM25 retrieval (the ``oner`` run).
        answer_multi_retrieval: with IRCoT multi-step retrieval.
        passages: (title, text) pairs of the authors' retrieved contexts, HotpotQA and 2Wiki test only
            (empty elsewhere); ``memories`` holds them as ``"<title>: <text>"``.
        classifier_option: the Adaptive-RAG classifier's choice, ``"A"`` (no retrieval), ``"B"`` (one) or
            ``"C"`` (multi); None off the test split.
        classifier_probas: its probabilities of A, B, C; None off the test split.
        wtr_giveup: When-to-Retrieve's verbalised "uncertain" flag; None off the test split.
        seakr: SeaKR's per-question scores where present (single-hop: perplexity, energy, entropy and eigen
            scores aligned by line order; multi-hop: final answer, retrieval and LLM calls); None elsewhere.
        ircot_steps: IRCoT's number of steps (test only), else None.
    """

    source: str = dataclasses.field(default="", kw_only=True)
    split: str = dataclasses.field(default="", kw_only=True)
    answer_no_retrieval: str = dataclasses.field(default="", kw_only=True)
    answer_one_retrieval: str = dataclasses.field(default="", kw_only=True)
    answer_multi_retrieval: str = dataclasses.field(default="", kw_only=True)
    passages: tuple[tuple[str, str], ...] = dataclasses.field(default=(), kw_only=True)
    classifier_option: str | None = dataclasses.field(default=None, kw_only=True)
    classifier_probas: tuple[float, float, float] | None = dataclasses.field(default=None, kw_only=True)
    wtr_giveup: bool | None = dataclasses.field(default=None, kw_only=True)
    seakr: Mapping[str, Any] | None = dataclasses.field(default=None, kw_only=True)
    ircot_steps: int | None = dataclasses.field(default=None, kw_only=True)


def _str_field(row: dict, field: str, where: str) -> str:
    v = row.get(field)
    if not isinstance(v, str):
        raise DataError(f"{where}: {field}: expected a string, got {type(v).__name__ if field in row else 'nothing'}")
    return v


def _probas(p: Any, where: str) -> tuple[float, float, float] | None:
    if p is None:
        return None
    if (not isinstance(p, list) or len(p) != 3
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in p)):
        raise DataError(f"{where}: extra.adaptive_rag_classifier.probas_ABC: expected three probabilities")
    return float(p[0]), float(p[1]), float(p[2])


def _item(row: dict, where: str) -> AdaRAGUEItem:
    source, split, qid = _str_field(row, "dataset", where), _str_field(row, "split", where), clean(row.get("qid"))
    golds = row.get("gold_answers")
    if not isinstance(golds, list) or not all(isinstance(g, str) for g in golds):
        raise DataError(f"{where}: gold_answers: expected a list of strings")
    no, one, multi = (_str_field(row, f"answer_{k}_retrieval", where) for k in ("no", "one", "multi"))
    passages = tuple((clean(p.get("title")), clean(p.get("text"))) for p in (row.get("passages") or [])
                     if isinstance(p, dict))[:ADARAGUE_MAX]
    extra = row.get("extra") or {}
    if not isinstance(extra, dict):
        raise DataError(f"{where}: extra: expected an object")
    clf = extra.get("adaptive_rag_classifier") or {}
    wtr = extra.get("when_to_retrieve") or {}
    a_no, a_one, a_multi = acc(no, golds), acc(one, golds), acc(multi, golds)
    helps = True if (a_one and not a_no) else False if (a_no and not a_one) else None
    group = f"adarague_llama8b:{source}_{split}:{qid}"
    cond = "passages" if passages else "no_passages"
    return AdaRAGUEItem(
        "adarague_llama8b", f"{group}:{cond}", group, need_text(row, "question", where),
        tuple(f"{t}: {x}" if t else x for t, x in passages), cond, tuple(golds), (), helps,
        not (a_no or a_one or a_multi), None, frozen_mapping(extra),
        source=source, split=split, answer_no_retrieval=no, answer_one_retrieval=one, answer_multi_retrieval=multi,
        passages=passages, classifier_option=clf.get("option"),
        classifier_probas=_probas(clf.get("probas_ABC"), where),
        wtr_giveup=wtr.get("giveup_uncertain"), seakr=frozen_mapping(extra["seakr"]) if "seakr" in extra else None,
        ircot_steps=extra.get("ircot_steps"))


def read_adarague(path: Path, split: str | None = None, limit: int | None = None) -> list[AdaRAGUEItem]:
    """AdaRAGUE's joined files: 12 × 500 questions with Llama-3.1-8B-Instruct's answers with no retrieval,
    one retrieval and IRCoT, gold answers, and on the test split the gates' signals.

    Passages exist for HotpotQA and 2Wiki test only. Caveat (REPORT.md): they appear to go with the CSV
    ``rag_one_retrieve`` answers (kept in ``meta["csv_rag_one_retrieve"]``), not with
    ``answer_one_retrieval`` (the ``oner`` run, whose passages are lost); ``meta`` is the joined file's
    ``extra`` as it stands (the CoT, ``dataset_context``, the CSV columns, the signals).

    Label rule:
        The labels are the reader's, scored with ``acc`` (normalised gold substring of the answer).
        should_adopt: retrieving helps this reader: True when the one-retrieval answer is right and the
        no-retrieval answer wrong, False when the reverse, None when both agree.
        should_abstain: True when none of the three answers (no, one, multi) is right, else False.
        has_conflict None. The condition is ``passages`` where the retrieved passages are present,
        else ``no_passages``. answers: ``gold_answers``.

    Args:
        path: the ``adarague_llama8b`` folder (holding ``joined/``).
        split: ``"<dataset>_<split>"`` (``"hotpotqa_test"``, ``"nq_dev_500"``, ...), or None for all twelve in
            the order nq, squad, trivia, hotpotqa, 2wikimultihopqa, musique, test before dev_500.
        limit: the number of questions to read, counted across the files in that order.

    Returns:
        One ``AdaRAGUEItem`` per question, in file order.
    """
    out: list[AdaRAGUEItem] = []
    for name in (ADARAGUE_SPLITS if split is None else (split,)):
        src = path / "joined" / f"{name}.jsonl"
        for n, row in iter_jsonl(src):
            if limit is not None and len(out) >= limit:
                return out
            out.append(_item(row, f"{src}, line {n}"))
    return out


SPEC = BenchmarkSpec(
    "adarague_llama8b", read_adarague, "adarague_llama8b",
    "MIT (repo root; Adaptive_Rag/ and UC/ Apache-2.0, SeaKR/ GPL-3.0); NQ CC BY-SA 3.0, SQuAD and HotpotQA "
    "CC BY-SA 4.0, TriviaQA and 2Wiki Apache-2.0, MuSiQue CC BY 4.0; answers under the Llama 3.1 licence",
    "github.com/s-nlp/AdaRAGUE (joined by adarague_llama8b/join.py)", ADARAGUE_SPLITS, ADARAGUE_MAX)
