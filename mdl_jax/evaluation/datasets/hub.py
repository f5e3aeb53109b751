"""Loaders for benchmarks that live only on the Hugging Face hub: ClashEval, FaithEval, ConflictBank and
AbstentionBench (the shared copy has none of them; ``../shared/data/benchmarks/LABELS.md`` says why).

Each reads the hub's documented schema, from the hub (``datasets.load_dataset``, which needs a network) or
from a local export of the same rows (``path=``: a ``.jsonl``, ``.json`` or ``.parquet`` file, or a
folder of ``<split>.jsonl|.json|.parquet`` files). Rows become items through one function per data set,
whichever way they came, so the tests' small fixtures written from the documented schema check the same
code a hub load runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mdl_jax.evaluation.datasets.files import DataError, hub_records, limited, need, need_text, read_records
from mdl_jax.evaluation.datasets.items import (
    BenchmarkItem,
    BenchmarkSpec,
    clean,
    frozen_mapping,
    normalize_answer,
    seeded_order,
)
from mdl_jax.strict_json import DuplicateKeyError, loads_unique

FAITHEVAL_SPLITS = ("unanswerable", "inconsistent", "counterfactual")
FAITHEVAL_REPOS = {s: f"Salesforce/FaithEval-{s}-v1.0" for s in FAITHEVAL_SPLITS}
CLASHEVAL_REPO = "kewu93/ClashEval"
CONFLICTBANK_REPO = "Warrieryes/CB_qa"
ABSTENTIONBENCH_REPO = "facebook/AbstentionBench"
CONFLICT_KINDS = ("misinformation", "temporal", "semantic")
FAITHEVAL_MAX = 10
CONFLICTBANK_MAX = 4

Record = tuple[str, str, dict]  # (split, where, row)


def local_records(path: Path, split: str | None, splits: tuple[str, ...] | None, name: str) -> list[Record]:
    """(split, where, row) for a local export of a hub data set.

    ``path`` is one file (it holds ``split``; ``split`` may be None only when the data set has at most one
    split) or a folder of ``<split>.jsonl|.json|.parquet`` files (all of them, in the order of ``splits``
    or, for free-form split names, sorted, when ``split`` is None).

    Raises:
        DataError: no file for a split, or a malformed file.
    """
    if path.is_file():
        if split is None and splits and len(splits) > 1:
            raise DataError(f"{path}: one file holds one split of {name}; pass split= (one of {list(splits)})")
        return [(split or "", where, row) for where, row in read_records(path)]
    if not path.is_dir():
        raise DataError(f"{path}: not found; expected a file or a folder of <split>.jsonl files for {name}")
    exts = (".jsonl", ".json", ".parquet")
    if split is not None:
        names = [split]
    elif splits:
        names = list(splits)
    else:
        names = sorted({p.stem for p in path.iterdir() if p.suffix in exts})
    out: list[Record] = []
    for s in names:
        found = [path / f"{s}{e}" for e in exts if (path / f"{s}{e}").is_file()]
        if not found:
            raise DataError(f"{path}: no {s}.jsonl, .json or .parquet for {name}")
        out += [(s, where, row) for where, row in read_records(found[0])]
    if not out:
        raise DataError(f"{path}: no records for {name}")
    return out


def _need(row: dict, field: str, where: str, kind: type | tuple[type, ...] = str) -> Any:
    """``row[field]`` checked against the hub's documented schema (``files.need``; null is missing)."""
    return need(row, field, where, kind, expected="the hub's documented schema", none_is_missing=True)


def _need_text(row: dict, field: str, where: str) -> str:
    """``row[field]`` stripped and not blank (``files.need_text``; null is missing)."""
    return need_text(row, field, where, expected="the hub's documented schema", none_is_missing=True)


def _strings(v: Any, where: str, field: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise DataError(f"{where}: {field}: expected a list of strings")
    return tuple(x.strip() for x in v if x.strip())


# -------------------------------------------------------------------------------------------- ClashEval
def clasheval_items(records: Iterable[Record]) -> list[BenchmarkItem]:
    """ClashEval rows → items (see ``read_clasheval`` for the label rule)."""
    out: list[BenchmarkItem] = []
    seen: dict[str, int] = {}
    for _, where, row in records:
        question = _need_text(row, "question", where)
        domain = clean(row.get("dataset"))
        truth, mod = clean(_need(row, "answer_original", where)), clean(_need(row, "answer_mod", where))
        group = f"clasheval:{domain}:{question}"
        if group not in seen:
            seen[group] = 0
            out.append(BenchmarkItem(
                "clasheval", f"{group}:original", group, question, (clean(_need(row, "context_original", where)),),
                "original", (truth,), (), True, False, False, frozen_mapping({"domain": domain})))
        k = seen[group]
        seen[group] = k + 1
        unchanged = normalize_answer(mod) == normalize_answer(truth)
        out.append(BenchmarkItem(
            "clasheval", f"{group}:modified:{k}", group, question, (clean(_need(row, "context_mod", where)),),
            "modified", (truth,), () if unchanged else (mod,), unchanged, False if unchanged else None, False,
            frozen_mapping({"domain": domain, "mod_type": clean(row.get("mod_type")),
                            "mod_degree": row.get("mod_degree")})))
    return out


def read_clasheval(path: Path, split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """ClashEval (NeurIPS 2024 D&B): over 1,200 questions in six domains (drug dosages, sports records,
    news, Wikipedia dates, names, locations), each with its original context and several perturbed copies
    (columns ``question``, ``context_original``, ``context_mod``, ``answer_original``, ``answer_mod``,
    ``mod_type``, ``dataset``).

    Label rule:
        original (once per question, from its first row): the unmodified context, should_adopt True,
        should_abstain False, has_conflict False.
        modified (one per row): the perturbed context asserts ``answer_mod`` against the true
        ``answer_original``: should_adopt False, should_abstain None; where the perturbation leaves the
        answer unchanged (normalised), should_adopt True and should_abstain False. has_conflict False.
        answers: ``answer_original``; wrong_answers: ``answer_mod`` when it differs.
        group: the domain and question, so a bootstrap over questions keeps the perturbations together.

    Args:
        path: a local export of the hub rows (file, or folder of ``<split>.jsonl`` files).
        split: the hub split name (None: every split).
        limit: the number of rows to read.

    Returns:
        The items, rows in order.
    """
    return clasheval_items(limited(local_records(path, split, None, "clasheval"), limit))


def hub_clasheval(split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """ClashEval from the hub (``kewu93/ClashEval``, a loading script: needs a ``datasets`` release that
    runs scripts, and a network). Same label rule as ``read_clasheval``."""
    return clasheval_items(limited(hub_records(CLASHEVAL_REPO, None, split, trust_remote_code=True), limit))


# -------------------------------------------------------------------------------------------- FaithEval
_DOCUMENT = re.compile(r"(?:^|\n)\s*Document(?:\s*\d+)?\s*:\s*")


def split_documents(context: str) -> tuple[str, ...]:
    """A FaithEval context cut at its ``Document:`` markers (the whole context when it has fewer than two)."""
    parts = [p.strip() for p in _DOCUMENT.split(context) if p.strip()]
    return tuple(parts) if len(_DOCUMENT.findall(context)) >= 2 else (context.strip(),)


def faitheval_items(records: Iterable[Record]) -> list[BenchmarkItem]:
    """FaithEval rows → items (see ``read_faitheval`` for the label rule)."""
    out: list[BenchmarkItem] = []
    taken: set[tuple[str, str]] = set()
    for task, where, row in records:
        if task not in FAITHEVAL_SPLITS:
            raise DataError(f"{where}: split: expected one of {list(FAITHEVAL_SPLITS)}, got {task!r}")
        rid = clean(row.get("qid") if row.get("qid") is not None else row.get("id"))
        if not rid:
            raise DataError(f"{where}: missing field 'qid' (or 'id'); expected the hub's documented schema")
        # the hub's ids are its own: one given twice in a split names two rows, each its own question
        # (load_benchmark refuses a qid twice, since gate scores are joined on it); the count skips an
        # id the split already holds, as a row of its own may be named "<id>#2"
        base, n = rid, 1
        while (task, rid) in taken:
            n += 1
            rid = f"{base}#{n}"
        taken.add((task, rid))
        question, context = _need_text(row, "question", where), clean(_need(row, "context", where))
        group = f"faitheval:{task}:{rid}"
        if task == "unanswerable":
            item = BenchmarkItem("faitheval", f"{group}:{task}", group, question, (context,), task, (), (), False,
                                 True, False,
                                 frozen_mapping({"original_answers": _strings(row.get("answers"), where, "answers")}))
        elif task == "inconsistent":
            item = BenchmarkItem("faitheval", f"{group}:{task}", group, question,
                                 split_documents(context)[:FAITHEVAL_MAX], task,
                                 _strings(row.get("answers"), where, "answers"), (), None, None, True)
        else:
            choices = _need(row, "choices", where, dict)
            labels, texts = list(choices.get("label") or []), list(choices.get("text") or [])
            key = clean(_need(row, "answerKey", where))
            if key not in labels or len(labels) != len(texts):
                raise DataError(f"{where}: answerKey {key!r}: expected one of the choices' labels {labels}")
            item = BenchmarkItem("faitheval", f"{group}:{task}", group, question, (context,), task, (),
                                 (clean(texts[labels.index(key)]),), False, None, False,
                                 frozen_mapping({"choices": dict(zip(labels, texts)), "answerKey": key}))
        out.append(item)
    return out


def read_faitheval(path: Path, split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """FaithEval (Salesforce): three hub sets, one per task (``Salesforce/FaithEval-<task>-v1.0``, split
    ``test``): ``unanswerable`` and ``inconsistent`` rows hold ``qid``, ``question``, ``context`` and
    ``answers``; ``counterfactual`` rows hold ``id``, ``question``, ``context``, ``choices`` (``label``,
    ``text``) and ``answerKey``, the choice the counterfactual context supports.

    Label rule:
        unanswerable: the context does not hold the answer: should_adopt False, should_abstain True,
        has_conflict False (the original answers are kept in ``meta["original_answers"]``).
        inconsistent: the context's documents (cut at their ``Document:`` markers, at most 10) support
        different answers: has_conflict True, should_adopt None, should_abstain None; answers: ``answers``.
        counterfactual: the context asserts a statement against world knowledge; read truth-first (as for
        ConflictNQ), should_adopt False, should_abstain None, has_conflict False; wrong_answers: the
        ``answerKey`` choice's text (the hub gives no true answer string).

    Args:
        path: a local export: one task's file (then ``split`` names the task) or a folder of
            ``<task>.jsonl|.json|.parquet`` files.
        split: ``"unanswerable"``, ``"inconsistent"``, ``"counterfactual"``, or None for all three.
        limit: the number of rows to read, across the tasks in that order.

    Returns:
        One item per row.
    """
    return faitheval_items(limited(local_records(path, split, FAITHEVAL_SPLITS, "faitheval"), limit))


def hub_faitheval(split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """FaithEval from the hub (``Salesforce/FaithEval-<task>-v1.0``, split ``test``; needs a network). Same
    label rule as ``read_faitheval``."""
    records: list[Record] = []
    for task in (FAITHEVAL_SPLITS if split is None else (split,)):
        records += [(task, where, row) for _, where, row in hub_records(FAITHEVAL_REPOS[task], None, "test")]
    return faitheval_items(limited(records, limit))


# ----------------------------------------------------------------------------------------- ConflictBank
def _evidence(row: dict, kind: str, where: str) -> str:
    # some exports carry the misinformation evidence under a doubled name; either is read
    for field in (f"{kind}_conflict_evidence", f"{kind}_conflict_evidence_evidence"):
        if clean(row.get(field)):
            return clean(row[field])
    raise DataError(f"{where}: missing field '{kind}_conflict_evidence'; expected the hub's documented schema")


def _option(options: list[str], letter: str, where: str, field: str) -> str | None:
    if not letter:
        return None
    i = "ABCDEFGH".find(letter.upper())
    if i < 0 or i >= len(options):
        raise DataError(f"{where}: {field}: expected a letter naming one of {len(options)} options, got {letter!r}")
    return options[i]


def conflictbank_items(records: Iterable[Record]) -> list[BenchmarkItem]:
    """ConflictBank QA rows → items (see ``read_conflictbank`` for the label rule)."""
    out: list[BenchmarkItem] = []
    for i, (_, where, row) in enumerate(records):
        question = _need_text(row, "question", where)
        options = [clean(o) for o in _need(row, "options", where, list)]
        truth = _option(options, clean(_need(row, "correct_option", where)), where, "correct_option")
        replaced = _option(options, clean(row.get("replace_option")), where, "replace_option")
        default = clean(_need(row, "default_evidence", where))
        conflicts = {k: _evidence(row, k, where) for k in CONFLICT_KINDS}
        group = f"conflictbank:{i}:{clean(row.get('subject'))}:{clean(row.get('relation'))}"
        answers = (truth,) if truth else ()
        wrong = (replaced,) if replaced and replaced != truth else ()
        meta = frozen_mapping({"options": tuple(options), "correct_option": clean(row.get("correct_option")),
                               "uncertain_option": clean(row.get("uncertain_option")),
                               "replace_option": clean(row.get("replace_option"))})
        out.append(BenchmarkItem("conflictbank", f"{group}:default", group, question, (default,), "default",
                                 answers, wrong, True, False, False, meta))
        for k, text in conflicts.items():
            out.append(BenchmarkItem("conflictbank", f"{group}:{k}", group, question, (text,), k, answers, wrong,
                                     False, None, False, meta))
        every = seeded_order((default, *conflicts.values()), f"{group}:all")[:CONFLICTBANK_MAX]
        out.append(BenchmarkItem("conflictbank", f"{group}:all", group, question, every, "all", answers, wrong,
                                 None, None, True, meta))
    return out


def read_conflictbank(path: Path, split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """ConflictBank's QA pairs (``Warrieryes/CB_qa``): per row a ``question``, four ``options`` with the
    ``correct_option`` letter (and ``uncertain_option``, ``replace_option``), the ``default_evidence`` and
    one conflicting evidence per cause (``misinformation_conflict_evidence``,
    ``temporal_conflict_evidence``, ``semantic_conflict_evidence``), with ``subject`` and ``relation``.

    Label rule:
        default: the default evidence alone: should_adopt True, should_abstain False, has_conflict False.
        misinformation, temporal, semantic: that conflicting evidence alone contradicts the default answer:
        should_adopt False, should_abstain None, has_conflict False.
        all: the default and the three conflicting evidences (order shuffled with a fixed seed):
        has_conflict True, should_adopt None, should_abstain None.
        answers: the correct option's text; wrong_answers: the ``replace_option`` text when it differs.

    Args:
        path: a local export of the hub rows (file, or folder of ``<split>.jsonl`` files).
        split: the hub split name (None: every split).
        limit: the number of rows to read.

    Returns:
        Five items per row, conditions in the order default, misinformation, temporal, semantic, all.
    """
    return conflictbank_items(limited(local_records(path, split, None, "conflictbank"), limit))


def hub_conflictbank(split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """ConflictBank from the hub (``Warrieryes/CB_qa``, about 553,000 rows; needs a network). Same label rule
    as ``read_conflictbank``."""
    return conflictbank_items(limited(hub_records(CONFLICTBANK_REPO, None, split), limit))


# -------------------------------------------------------------------------------------- AbstentionBench
def abstentionbench_items(records: Iterable[Record]) -> list[BenchmarkItem]:
    """AbstentionBench rows → items (see ``read_abstentionbench`` for the label rule)."""
    out: list[BenchmarkItem] = []
    counts: dict[str, int] = {}
    for subset, where, row in records:
        flag = _need(row, "should_abstain", where, bool)
        raw = row.get("metadata_json")
        try:
            meta = loads_unique(raw) if isinstance(raw, str) and raw.strip() else {}
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: metadata_json: malformed JSON ({e.msg})") from None
        except DuplicateKeyError as e:
            raise DataError(f"{where}: metadata_json: {e}") from None
        except RecursionError:  # deeper than Python's stack: a defect of the row, not a bug
            raise DataError(f"{where}: metadata_json: JSON nested too deeply") from None
        if not isinstance(meta, dict):
            meta = {"metadata": meta}
        k = counts.get(subset, 0)
        counts[subset] = k + 1
        group = f"abstentionbench:{subset}:{k}"
        out.append(BenchmarkItem(
            "abstentionbench", f"{group}:no_memory", group, _need_text(row, "question", where), (), "no_memory",
            _strings(row.get("reference_answers"), where, "reference_answers"), (), None, flag, None,
            frozen_mapping({**meta, "subset": subset})))
    return out


def read_abstentionbench(path: Path, split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """AbstentionBench (20 data sets over six abstention scenarios; CC BY-NC): rows hold ``question``,
    ``reference_answers``, ``should_abstain`` and ``metadata_json``; a split is one sub-dataset
    (``"falseqa"``, ``"squad2"``, ...).

    Label rule:
        The memory set is empty (condition ``no_memory``); any context the sub-dataset gives is part of the
        question text. should_abstain: ``should_abstain``; should_adopt None, has_conflict None.
        answers: ``reference_answers``; ``meta`` is the parsed ``metadata_json`` plus ``subset``.

    Args:
        path: a local export: one sub-dataset's file (``split`` names it) or a folder of
            ``<subset>.jsonl|.json|.parquet`` files (all, sorted by name, when ``split`` is None).
        split: a sub-dataset name, or None.
        limit: the number of rows to read.

    Returns:
        One item per row.
    """
    return abstentionbench_items(limited(local_records(path, split, None, "abstentionbench"), limit))


def hub_abstentionbench(split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """AbstentionBench from the hub (``facebook/AbstentionBench``, a loading script that fetches its
    sub-datasets from their own sources: needs a ``datasets`` release that runs scripts, and a network).
    Same label rule as ``read_abstentionbench``."""
    return abstentionbench_items(limited(hub_records(ABSTENTIONBENCH_REPO, None, split, trust_remote_code=True), limit))


SPECS = (
    BenchmarkSpec("clasheval", read_clasheval, "", "CC BY 4.0", f"hub {CLASHEVAL_REPO} (github.com/kevinwu23/StanfordClashEval)",
                  None, 1, hub_clasheval),
    BenchmarkSpec("faitheval", read_faitheval, "", "see each hub card (built from SQuAD, NewsQA, TriviaQA, NQ, ...)",
                  "hub Salesforce/FaithEval-{unanswerable,inconsistent,counterfactual}-v1.0",
                  FAITHEVAL_SPLITS, FAITHEVAL_MAX, hub_faitheval),
    BenchmarkSpec("conflictbank", read_conflictbank, "", "CC BY-SA 4.0 (share-alike)",
                  f"hub {CONFLICTBANK_REPO} (github.com/zhaochen0110/conflictbank)", None, CONFLICTBANK_MAX,
                  hub_conflictbank),
    BenchmarkSpec("abstentionbench", read_abstentionbench, "", "CC BY-NC 4.0 (non-commercial); each sub-dataset its own",
                  f"hub {ABSTENTIONBENCH_REPO} (github.com/facebookresearch/AbstentionBench)", None, 0,
                  hub_abstentionbench),
)
