"""Loaders for seven of the benchmarks kept in ``../shared/data/benchmarks`` (RGB is in ``rgb.py``, AdaRAGUE
in ``adarague.py``).

Each reader takes the data set's folder, the split (or None for all) and a limit on source rows, and
returns ``BenchmarkItem``s in a fixed order: files in the order listed, rows in file order, memory sets in
the order of their conditions. Where a memory set mixes memories of several kinds, their order is shuffled
with a seed made of the data set, the question and the condition, so two loads give the same items. Each
reader's docstring states its label rule once; the registry (``registry.py``) reads it from there.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from mdl_jax.evaluation.datasets.files import (
    DataError,
    hub_files,
    iter_jsonl,
    limited,
    need,
    need_text,
    read_json,
    text_list,
)
from mdl_jax.evaluation.datasets.items import (
    BenchmarkItem,
    BenchmarkSpec,
    clean,
    frozen_mapping,
    mentions_answer,
    seeded_order,
)

RAMDOCS_MAX = 12
NOMIRACL_MAX = 10
CONFLICTQA_MAX = 2
CONFLICTNQ_MAX = 6
RETRIEVALQA_MAX = 25
POISONEDRAG_MAX = 5

CONFLICTQA_MODELS = ("chatgpt", "gpt4", "llama2-70b", "llama2-7b", "palm2", "qwen7b", "vicuna33b", "vicuna7b")
CONFLICTNQ_SPLITS = ("test", "val")
NOMIRACL_SPLITS = ("relevant", "non_relevant")
POISONEDRAG_SPLITS = ("nq", "hotpotqa", "msmarco")


def _need(row: dict, field: str, where: str, kind: type | tuple[type, ...] = str) -> Any:
    """``row[field]``, checked to be of ``kind`` (``files.need``)."""
    return need(row, field, where, kind)


def _splits(split: str | None, names: tuple[str, ...]) -> tuple[str, ...]:
    return names if split is None else (split,)


def _in_turn(parts: Iterable[Iterator], limit: int | None) -> Iterator:
    """The parts' items one after the other (no ``limit``), or at most ``limit`` of them taken from the
    parts in turn, one from each, so a limited read (a smoke test) sees every split and not only the
    first one's rows."""
    if limit is None:
        return itertools.chain.from_iterable(parts)

    def turns() -> Iterator:
        live = list(parts)
        while live:
            for it in list(live):
                try:
                    yield next(it)
                except StopIteration:
                    live.remove(it)

    return itertools.islice(turns(), limit)


def _split_rows(split: str | None, names: tuple[str, ...], file_of: Callable[[str], Path],
                limit: int | None) -> Iterator[tuple[str, int, dict, str]]:
    """(split name, line number, row, "<file>, line <n>") over the named splits' JSON-lines files: each
    file in order, or at most ``limit`` rows taken from the splits in turn (``_in_turn``)."""
    def rows(s: str) -> Iterator[tuple[str, int, dict, str]]:
        src = file_of(s)  # once per split, not per row
        for n, row in iter_jsonl(src):
            yield s, n, row, f"{src}, line {n}"

    return _in_turn((rows(s) for s in _splits(split, names)), limit)


def _short_hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


# ------------------------------------------------------------------------------------------------ RAMDocs
def read_ramdocs(path: Path, split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """RAMDocs (MADAM-RAG) test set: 500 questions, one memory set each (all 1-12 of its documents, in file
    order; none is dropped).

    Label rule:
        The condition names the document types present, sorted and joined by "+" (``"correct+misinfo"``).
        should_adopt: True when the set holds a correct document and no misinformation; False when it holds
        no correct document; None when correct documents and misinformation are both present.
        should_abstain: True when no document is correct, else False.
        has_conflict: True when misinformation sits alongside a correct document, else False.
        answers: ``gold_answers`` (several for the ambiguous questions, one per entity); wrong_answers:
        ``wrong_answers``. Per-document labels are in ``meta["doc_types"]`` (correct / misinfo / noise,
        aligned with the memories) and ``meta["doc_answers"]``; ``meta["ambiguous"]`` marks questions with
        more than one gold answer.

    Args:
        path: the folder holding ``RAMDocs_test.jsonl``.
        split: unused; None.
        limit: the number of questions to read, from the top of the file.

    Returns:
        One item per question, in file order.
    """
    src = path / "RAMDocs_test.jsonl"
    out: list[BenchmarkItem] = []
    for i, (n, row) in enumerate(limited(iter_jsonl(src), limit)):
        where = f"{src}, line {n}"
        question = need_text(row, "question", where)
        docs = _need(row, "documents", where, list)
        texts, types_, doc_answers = [], [], []
        for d in docs:
            if not isinstance(d, dict):
                raise DataError(f"{where}: documents: expected objects with text, type and answer")
            t = clean(_need(d, "type", where))
            if t not in ("correct", "misinfo", "noise"):
                raise DataError(f"{where}: documents: type: expected correct, misinfo or noise, got {t!r}")
            texts.append(clean(_need(d, "text", where)))
            types_.append(t)
            doc_answers.append(clean(d.get("answer")))
        texts, types_, doc_answers = texts[:RAMDOCS_MAX], types_[:RAMDOCS_MAX], doc_answers[:RAMDOCS_MAX]
        gold = tuple(text_list(_need(row, "gold_answers", where, list), where, "gold_answers"))
        wrong = tuple(text_list(row.get("wrong_answers") or [], where, "wrong_answers"))
        has_correct, has_mis = "correct" in types_, "misinfo" in types_
        adopt = None if (has_correct and has_mis) else has_correct
        cond = "+".join(sorted(set(types_))) or "empty"
        group = f"ramdocs:{i}"
        out.append(BenchmarkItem(
            "ramdocs", f"{group}:{cond}", group, question, tuple(texts), cond, gold, wrong, adopt,
            not has_correct, has_correct and has_mis,
            frozen_mapping({"doc_types": tuple(types_), "doc_answers": tuple(doc_answers),
                            "disambig_entity": tuple(row.get("disambig_entity") or ()),
                            "ambiguous": len(gold) > 1})))
    return out


# ---------------------------------------------------------------------------------------------- NoMIRACL
def parse_nomiracl_prompt(prompt: str, n_passages: int, where: str) -> tuple[str, tuple[str, ...]]:
    """The question and the passages (``"<title>: <text>"``) of a NoMIRACL vanilla prompt.

    The prompt reads ``QUESTION:\\n<q>\\n\\nCONTEXTS:\\n[1] ...\\n\\n[2] ...\\n\\nOUTPUT:``; each passage
    is cut at the next ``\\n\\n[i+1] `` marker, in order, so a bracketed number inside a passage is kept.

    Raises:
        DataError: a marker is missing.
    """
    q0 = prompt.find("QUESTION:\n")
    c0 = prompt.find("\n\nCONTEXTS:\n")
    end = prompt.rfind("\n\nOUTPUT:")
    if q0 < 0 or c0 < q0 or end < c0:
        raise DataError(f"{where}: prompt: expected QUESTION:, CONTEXTS: and OUTPUT: sections")
    question = prompt[q0 + len("QUESTION:\n"):c0].strip()
    if not question:
        raise DataError(f"{where}: prompt: expected a non-blank question after QUESTION:")
    body = prompt[c0 + len("\n\nCONTEXTS:\n"):end]
    if not body.startswith("[1] "):
        raise DataError(f"{where}: prompt: expected the contexts to start with '[1] '")
    passages, pos = [], len("[1] ")
    for i in range(1, n_passages + 1):
        nxt = body.find(f"\n\n[{i + 1}] ", pos) if i < n_passages else len(body)
        if nxt < 0:
            raise DataError(f"{where}: prompt: context [{i + 1}] not found; expected {n_passages} contexts")
        passages.append(body[pos:nxt].strip())
        pos = nxt + len(f"\n\n[{i + 1}] ")
    return question, tuple(passages)


def read_nomiracl(path: Path, split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """NoMIRACL English test: 250 queries whose 10 passages hold an answer (``relevant``) and 250 whose
    passages do not (``non_relevant``); the question and passages are parsed out of the baseline prompt.

    Label rule:
        relevant: should_adopt True, should_abstain False.
        non_relevant: annotators judged none of the 10 passages relevant, so should_adopt False and
        should_abstain True.
        has_conflict None (not annotated); there is no gold answer string. The 11 LLMs' raw outputs are in
        ``meta["baselines"]``; ``meta["docids"]`` aligns with the memories.

    Args:
        path: the folder holding ``relevant/`` and ``non_relevant/``.
        split: ``"relevant"``, ``"non_relevant"``, or None for both (relevant first).
        limit: the number of queries to read, taken from the subsets in turn (one from each).

    Returns:
        One item per query.
    """
    out: list[BenchmarkItem] = []
    for sub, _n, row, where in _split_rows(split, NOMIRACL_SPLITS,
                                          lambda s: path / s / "en.test.vanilla_prompt.jsonl", limit):
        docids = _need(row, "docids", where, list)
        question, passages = parse_nomiracl_prompt(_need(row, "prompt", where), len(docids), where)
        relevant = sub == "relevant"
        group = f"nomiracl_en:{clean(_need(row, 'query_id', where))}"
        out.append(BenchmarkItem(
            "nomiracl_en", f"{group}:{sub}", group, question, passages[:NOMIRACL_MAX], sub, (), (), relevant,
            not relevant, None,
            frozen_mapping({"docids": tuple(docids[:NOMIRACL_MAX]), "baselines": dict(row.get("results") or {})})))
    return out


# -------------------------------------------------------------------------------------------- ConflictQA
_NEGATION = re.compile(r"\b(not|no|never|cannot|none|neither|nor)\b|n't\b", re.IGNORECASE)


def conflictqa_memory_side_true(memory_answer: str, counter_answer: str, ground_truth: str) -> bool | None:
    """Whether ConflictQA's memory side is true: each side's yes/no polarity from a negation-word check,
    compared with ``ground_truth`` ("True" = yes). None when both sides read the same polarity."""
    neg_m, neg_c = bool(_NEGATION.search(memory_answer)), bool(_NEGATION.search(counter_answer))
    if neg_m == neg_c:
        return None
    return (not neg_m) == (ground_truth.strip().lower() == "true")


def read_conflictqa(path: Path, split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """ConflictQA, StrategyQA part: one file per LLM whose parametric memory was elicited (6,628 rows over
    eight files), three memory sets per row.

    Memory sets: ``both`` (``parametric_memory`` and ``counter_memory``, order shuffled with a fixed seed),
    ``memory`` (``parametric_memory`` alone), ``counter`` (``counter_memory`` alone).

    Label rule:
        Which side is true is decided without an LLM: each side's answer (``memory_answer``,
        ``counter_answer``) is read as yes or no by a negation-word check, and compared with
        ``ground_truth``; when both read the same, the row is undecidable (``meta["memory_true"]`` None).
        both: has_conflict True (the two texts contradict each other); should_adopt None.
        memory: should_adopt = the memory side is true; counter: should_adopt = the counter side is true
        (None when undecidable); has_conflict False.
        should_abstain None throughout (every question has an answer).
        answers: the true side's answer statement (empty when undecidable); wrong_answers: the other.
        group: the question (shared by the eight files, so a bootstrap over questions keeps them together).

    Args:
        path: the folder holding ``conflictQA-strategyQA-<model>.json``.
        split: one model (``"chatgpt"``, ``"gpt4"``, ``"llama2-70b"``, ``"llama2-7b"``, ``"palm2"``,
            ``"qwen7b"``, ``"vicuna33b"``, ``"vicuna7b"``), or None for all in that order.
        limit: the number of rows to read, taken from the files in turn (one from each).

    Returns:
        Three items per row, conditions in the order both, memory, counter.
    """
    out: list[BenchmarkItem] = []
    for model, n, row, where in _split_rows(split, CONFLICTQA_MODELS,
                                            lambda m: path / f"conflictQA-strategyQA-{m}.json", limit):
        question = need_text(row, "question", where)
        gt = _need(row, "ground_truth", where, list)
        if not gt or not isinstance(gt[0], str):
            raise DataError(f"{where}: ground_truth: expected a list holding 'True' or 'False'")
        m_ans, c_ans = clean(_need(row, "memory_answer", where)), clean(_need(row, "counter_answer", where))
        m_text, c_text = clean(_need(row, "parametric_memory", where)), clean(_need(row, "counter_memory", where))
        mem_true = conflictqa_memory_side_true(m_ans, c_ans, gt[0])
        answers, wrong = ((), ()) if mem_true is None else (((m_ans,), (c_ans,)) if mem_true else ((c_ans,), (m_ans,)))
        group = f"conflictqa_strategyqa:{_short_hash(question)}"
        meta = frozen_mapping({"model": model, "ground_truth": gt[0], "memory_true": mem_true,
                               "popularity": row.get("popularity")})
        base = f"conflictqa_strategyqa:{model}:{n}"
        both = seeded_order((m_text, c_text), f"{base}:both")
        counter_true = None if mem_true is None else not mem_true
        out += [
            BenchmarkItem("conflictqa_strategyqa", f"{base}:both", group, question, both, "both", answers, wrong,
                          None, None, True, meta),
            BenchmarkItem("conflictqa_strategyqa", f"{base}:memory", group, question, (m_text,), "memory", answers,
                          wrong, mem_true, None, False, meta),
            BenchmarkItem("conflictqa_strategyqa", f"{base}:counter", group, question, (c_text,), "counter", answers,
                          wrong, counter_true, None, False, meta),
        ]
    return out


# -------------------------------------------------------------------------------------------- ConflictNQ
def _conflictnq_passages(row: dict, field: str, where: str) -> list[str]:
    out = []
    for p in _need(row, field, where, list):
        if not isinstance(p, dict):
            raise DataError(f"{where}: {field}: expected objects with a passage")
        out.append(clean(_need(p, "passage", where)))
    return [p for p in out if p]


def read_conflictnq(path: Path, split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """ConflictNQ test + val (226 + 225 questions): one real NQ passage and five fabricated passages per
    question, three memory sets each.

    Memory sets: ``real`` (the real passage), ``fake`` (the five fake passages, file order), ``mixed`` (real
    and fake, order shuffled with a fixed seed); at most 6 memories.

    Label rule:
        The data set was built to test context adherence; these labels are the truth-first reading, scored
        against ``real_short_answer`` and ``fake_short_answer`` explicitly.
        real: should_adopt True, has_conflict False.
        fake: the passages tell a coherent fabricated story that contradicts the truth: should_adopt False,
        has_conflict False.
        mixed: should_adopt None, has_conflict True.
        should_abstain None throughout. answers: ``real_short_answer``; wrong_answers: ``fake_short_answer``.

    Args:
        path: the folder holding ``conflict_nq_test.jsonl`` and ``conflict_nq_val.jsonl``.
        split: ``"test"``, ``"val"``, or None for both (test first).
        limit: the number of questions to read, taken from the splits in turn (one from each).

    Returns:
        Three items per question, conditions in the order real, fake, mixed.
    """
    out: list[BenchmarkItem] = []
    for s, _n, row, where in _split_rows(split, CONFLICTNQ_SPLITS, lambda s: path / f"conflict_nq_{s}.jsonl", limit):
        real, fake = _conflictnq_passages(row, "real_passages", where), _conflictnq_passages(row, "fake_passages", where)
        group = f"conflictnq:{clean(_need(row, 'id', where, (str, int)))}"
        question = need_text(row, "question", where)
        answers, wrong = (clean(_need(row, "real_short_answer", where)),), (clean(_need(row, "fake_short_answer", where)),)
        meta = frozen_mapping({"split": s, "cleaned_question": clean(row.get("cleaned_question")),
                               "real_answer": clean(row.get("real_answer")), "fake_answer": clean(row.get("fake_answer"))})
        mixed = seeded_order(real + fake, f"{group}:mixed")[:CONFLICTNQ_MAX]
        out += [
            BenchmarkItem("conflictnq", f"{group}:real", group, question, tuple(real[:CONFLICTNQ_MAX]), "real",
                          answers, wrong, True, None, False, meta),
            BenchmarkItem("conflictnq", f"{group}:fake", group, question, tuple(fake[:CONFLICTNQ_MAX]), "fake",
                          answers, wrong, False, None, False, meta),
            BenchmarkItem("conflictnq", f"{group}:mixed", group, question, mixed, "mixed", answers, wrong, None,
                          None, True, meta),
        ]
    return out


# --------------------------------------------------------------------------------------------- SelfAware
def read_selfaware(path: Path, split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """SelfAware: 3,369 questions (2,337 answerable, 1,032 unanswerable), with no passages.

    Label rule:
        The memory set is empty (condition ``no_memory``): this tests abstention driven by the question.
        should_abstain: True for the unanswerable questions (``answerable`` false), False for the others.
        should_adopt None, has_conflict None. answers: ``answer`` (empty for the unanswerable ones).

    Args:
        path: the folder holding ``SelfAware.json``.
        split: unused; None.
        limit: the number of questions to read, taken in turn from the answerable and the unanswerable
            ones (each in file order).

    Returns:
        One item per question.
    """
    src = path / "SelfAware.json"
    doc = read_json(src)
    if not isinstance(doc, dict) or not isinstance(doc.get("example"), list):
        raise DataError(f"{src}: expected an object with an 'example' list")
    rows = list(enumerate(doc["example"]))
    for i, row in rows:
        if not isinstance(row, dict):
            raise DataError(f"{src}, example {i}: expected an object")
    # The file holds the answerable questions first, then the unanswerable ones: a limited read takes
    # from the two blocks in turn, as from a set's splits, so that it holds both labels.
    blocks = [(r for r in rows if r[1].get("answerable") is not False),
              (r for r in rows if r[1].get("answerable") is False)]
    out: list[BenchmarkItem] = []
    for i, row in (rows if limit is None else _in_turn(blocks, limit)):
        where = f"{src}, example {i}"
        ans = _need(row, "answerable", where, bool)
        answers = tuple(text_list(row.get("answer") or [], where, "answer"))
        group = f"selfaware:{clean(_need(row, 'question_id', where, (int, str)))}"
        out.append(BenchmarkItem(
            "selfaware", f"{group}:no_memory", group, need_text(row, "question", where), (), "no_memory",
            answers, (), None, not ans, None, frozen_mapping({"source": clean(row.get("source"))})))
    return out


# ------------------------------------------------------------------------------------------- RetrievalQA
def _retrievalqa_memory(c: Any, where: str) -> str:
    if isinstance(c, str):
        return c.strip()
    if not isinstance(c, dict):
        raise DataError(f"{where}: context: expected strings or objects with title and text")
    title, text = clean(c.get("title")), clean(c.get("text"))
    return f"{title}: {text}" if title and text else (title or text)


def read_retrievalqa(path: Path, split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """RetrievalQA, the 250-question GPT-4 subset (50 each from RealTimeQA, FreshQA, ToolQA, PopQA and
    TriviaQA): questions that need retrieval, with the retrieved context (at most 25 memories; a context of
    title and text reads ``"<title>: <text>"``).

    Label rule:
        The benchmark kept questions whose answer parametric knowledge lacks. A memory set that contains a
        gold answer (``ground_truth``, SQuAD-normalised substring of a memory) should be adopted:
        should_adopt True, should_abstain False. A set without one should lead to abstention (Silent is
        wrong here): should_adopt False, should_abstain True. ``meta["gold_in_memory"]`` holds the check;
        has_conflict None.

    Args:
        path: the folder holding ``retrievalqa_gpt4.jsonl``.
        split: unused; None.
        limit: the number of questions to read, in file order.

    Returns:
        One item per question (condition ``retrieved``).
    """
    src = path / "retrievalqa_gpt4.jsonl"
    out: list[BenchmarkItem] = []
    for n, row in limited(iter_jsonl(src), limit):
        where = f"{src}, line {n}"
        mems = tuple(m for m in (_retrievalqa_memory(c, where) for c in _need(row, "context", where, list)) if m)
        mems = mems[:RETRIEVALQA_MAX]
        gold = tuple(text_list(_need(row, "ground_truth", where, list), where, "ground_truth"))
        hit = any(mentions_answer(m, gold) for m in mems)
        group = f"retrievalqa_gpt4:{clean(_need(row, 'question_id', where))}"
        out.append(BenchmarkItem(
            "retrievalqa_gpt4", f"{group}:retrieved", group, need_text(row, "question", where), mems, "retrieved",
            gold, (), hit, not hit, None,
            frozen_mapping({"data_source": clean(row.get("data_source")), "gold_in_memory": hit})))
    return out


# ------------------------------------------------------------------------------------------- PoisonedRAG
def read_poisonedrag(path: Path, split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """PoisonedRAG's targeted adversarial passages: 100 NQ, 100 HotpotQA and 100 MS MARCO questions, five
    crafted passages each asserting the same wrong answer (no clean passages are staged).

    Label rule:
        Every passage is a poisoned memory that contradicts the truth (condition ``poisoned``):
        should_adopt False, has_conflict False (the five agree with each other), should_abstain None.
        answers: ``correct answer``; wrong_answers: ``incorrect answer``.

    Args:
        path: the folder holding ``nq.json``, ``hotpotqa.json`` and ``msmarco.json``.
        split: ``"nq"``, ``"hotpotqa"``, ``"msmarco"``, or None for all three in that order.
        limit: the number of questions to read, taken from the files in turn (one from each).

    Returns:
        One item per question, in each file's key order.
    """

    def rows(s: str) -> Iterator[tuple[str, Path, str, dict]]:
        src = path / f"{s}.json"
        doc = read_json(src)
        if not isinstance(doc, dict):
            raise DataError(f"{src}: expected an object of questions keyed by id")
        for key, row in doc.items():
            if not isinstance(row, dict):
                raise DataError(f"{src}, {key}: expected an object")
            yield s, src, key, row

    out: list[BenchmarkItem] = []
    for s, src, key, row in _in_turn((rows(s) for s in _splits(split, POISONEDRAG_SPLITS)), limit):
        where = f"{src}, {key}"
        mems = tuple(text_list(_need(row, "adv_texts", where, list), where, "adv_texts"))[:POISONEDRAG_MAX]
        group = f"poisonedrag_adv:{s}:{key}"
        out.append(BenchmarkItem(
            "poisonedrag_adv", f"{group}:poisoned", group, need_text(row, "question", where), mems, "poisoned",
            (clean(_need(row, "correct answer", where)),), (clean(_need(row, "incorrect answer", where)),), False,
            None, False, frozen_mapping({"source": s})))
    return out


def hub_ramdocs(split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """RAMDocs from the hub (``HanNight/RAMDocs``, the same ``RAMDocs_test.jsonl``; needs a network). Same
    label rule as ``read_ramdocs``."""
    return read_ramdocs(hub_files("HanNight/RAMDocs", ["RAMDocs_test.jsonl"]), split, limit)


def hub_conflictqa(split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """ConflictQA's StrategyQA files from the hub (``osunlp/ConflictQA``, the same files; needs a network).
    Same label rule as ``read_conflictqa``."""
    names = [f"conflictQA-strategyQA-{m}.json" for m in _splits(split, CONFLICTQA_MODELS)]
    return read_conflictqa(hub_files("osunlp/ConflictQA", names), split, limit)


SPECS = (
    BenchmarkSpec("ramdocs", read_ramdocs, "ramdocs", "MIT (Wikipedia text)",
                  "github.com/HanNight/RAMDocs RAMDocs_test.jsonl (hub: HanNight/RAMDocs)", (), RAMDOCS_MAX, hub_ramdocs),
    BenchmarkSpec("nomiracl_en", read_nomiracl, "nomiracl_en", "Apache-2.0 (passages Wikipedia, CC BY-SA)",
                  "github.com/project-miracl/nomiracl results/baselines/{relevant,non_relevant}/en.test.vanilla_prompt.jsonl",
                  NOMIRACL_SPLITS, NOMIRACL_MAX),
    BenchmarkSpec("conflictqa_strategyqa", read_conflictqa, "conflictqa_strategyqa",
                  "Apache-2.0 (StrategyQA questions MIT)",
                  "github.com/OSU-NLP-Group/LLM-Knowledge-Conflict conflictQA/conflictQA-strategyQA-*.json "
                  "(hub: osunlp/ConflictQA)", CONFLICTQA_MODELS, CONFLICTQA_MAX, hub_conflictqa),
    BenchmarkSpec("conflictnq", read_conflictnq, "conflictnq", "Apache-2.0 (NQ text CC BY-SA 3.0)",
                  "github.com/4-en/ConflictNQ dataset/conflict_nq_{test,val}.jsonl", CONFLICTNQ_SPLITS, CONFLICTNQ_MAX),
    BenchmarkSpec("selfaware", read_selfaware, "selfaware", "CC BY-SA 4.0 (share-alike)",
                  "github.com/yinzhangyue/SelfAware data/SelfAware.json", (), 0),
    BenchmarkSpec("retrievalqa_gpt4", read_retrievalqa, "retrievalqa_gpt4", "MIT",
                  "github.com/hyintell/RetrievalQA data/retrievalqa_gpt4.jsonl", (), RETRIEVALQA_MAX),
    BenchmarkSpec("poisonedrag_adv", read_poisonedrag, "poisonedrag_adv",
                  "MIT (MS MARCO questions: non-commercial research only; NQ, HotpotQA CC BY-SA)",
                  "github.com/sleeepeer/PoisonedRAG results/adv_targeted_results/{nq,hotpotqa,msmarco}.json",
                  POISONEDRAG_SPLITS, POISONEDRAG_MAX),
)
