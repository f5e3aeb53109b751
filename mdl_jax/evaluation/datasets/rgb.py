"""RGB's English counterfactual-robustness set, read two ways: as the committed conflict runs read it
(``rgb_en_fact``: every memory set filled up to ten) and with every memory set of a question the same size
(``rgb_en_fact_equal``).

Why two: a question has ten snippets in all, true and noise together, so no question has ten noise
snippets, and filling each set up to ten leaves the noise-only set the smallest of the four. A gate that
counts memories then ranks the sets to withhold better than one that reads them (docs/benchmarks-field.md,
"A cue in the sets' sizes"). ``rgb_en_fact`` keeps its sets as they are because the committed conflict runs'
readers answered them; ``rgb_en_fact_equal`` is the reading without the cue, for reader-free scoring.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mdl_jax.evaluation.datasets.files import DataError, iter_jsonl, limited, need, need_text, text_list
from mdl_jax.evaluation.datasets.items import (
    BenchmarkItem,
    BenchmarkSpec,
    clean,
    frozen_mapping,
    mentions_answer,
    seeded_order,
)

RGB_MAX = 10
_LICENCE = "CC BY-NC-SA 4.0 (non-commercial, share-alike)"
_SOURCE = "github.com/chen700564/RGB data/en_fact.json"


def _rgb_answers(x: Any, where: str) -> tuple[str, ...]:
    """RGB's ``answer``: a string, or a list (of lists) of equivalent spellings; flattened, order kept."""
    out: list[str] = []
    stack = [x]
    while stack:
        v = stack.pop(0)
        if isinstance(v, str):
            if v.strip() and v.strip() not in out:
                out.append(v.strip())
        elif isinstance(v, list):
            stack[:0] = v
        else:
            raise DataError(f"{where}: answer: expected a string or a list of strings, got {type(v).__name__}")
    return tuple(out)


def _mixed(pos: list[str], wrong: list[str], size: int) -> list[tuple[str, str]]:
    """The first half (rounded up) of ``size`` true snippets, then the answer-swapped versions of the rest
    (of the same snippets' positions, so no snippet stands twice); one snippet: it and its swapped version."""
    if len(pos) == 1:
        return [("true", pos[0]), ("swapped", wrong[0])]
    h = math.ceil(size / 2)
    return [("true", s) for s in pos[:h]] + [("swapped", s) for s in wrong[h:size]]


def _read(path: Path, limit: int | None, name: str, equal: bool) -> list[BenchmarkItem]:
    src = path / "en_fact.json"
    out: list[BenchmarkItem] = []
    for n, row in limited(iter_jsonl(src), limit):
        where = f"{src}, line {n}"
        rid = need(row, "id", where, (int, str))
        question = need_text(row, "query", where)
        answers = _rgb_answers(need(row, "answer", where, (str, list)), where)
        fake = clean(need(row, "fakeanswer", where))
        pos = text_list(need(row, "positive", where, list), where, "positive")
        wrong = text_list(need(row, "positive_wrong", where, list), where, "positive_wrong")
        neg = text_list(need(row, "negative", where, list), where, "negative")
        if len(pos) != len(wrong):
            raise DataError(f"{where}: positive has {len(pos)} snippets, positive_wrong {len(wrong)}; "
                            "expected one answer-swapped snippet per true one")
        if not pos:  # its true set would be noise labelled should_adopt True, its mixed set hold no answer
            raise DataError(f"{where}: positive: no true snippet; expected at least one")
        if equal and not neg:  # every set would be empty, its true set labelled should_adopt True
            raise DataError(f"{where}: negative: no noise snippet; {name} makes a question's sets as large as "
                            "its noise set, so it needs at least one")
        # equal sizes: the noise-only set cannot grow past the noise snippets, so every set shrinks to it
        size = min(RGB_MAX, len(neg)) if equal else RGB_MAX
        group = f"rgb_en_fact:{rid}"  # the question, whichever reading: both share its calibration side
        signal = {"true": [("true", s) for s in pos], "swapped": [("swapped", s) for s in wrong],
                  "mixed": _mixed(pos, wrong, min(len(pos), size) if equal else len(pos)), "noise": []}
        for cond, sig in signal.items():
            if equal and cond == "mixed" and size < 2:
                continue  # one memory cannot hold both answers
            sig = sig[:size]
            # the shuffle's seed names the data set the committed runs read, so both readings order alike
            pairs = seeded_order(sig + [("noise", s) for s in neg[:size - len(sig)]], f"rgb_en_fact:{rid}:{cond}")
            mems = tuple(s for _, s in pairs)
            kinds = tuple(k for k, _ in pairs)
            noise_names = any(k == "noise" and mentions_answer(s, answers) for k, s in pairs)
            adopt = abstain = None
            conflict = False
            if cond == "true":
                adopt, abstain = True, False
            elif cond == "swapped":
                adopt, conflict = False, noise_names
            elif cond == "mixed":
                conflict = True
            elif not noise_names:
                adopt, abstain = False, True
            out.append(BenchmarkItem(
                name, f"{name}:{rid}:{cond}", group, question, mems, cond, answers, (fake,), adopt, abstain,
                conflict, frozen_mapping({"memory_kinds": kinds, "answer_in_noise": noise_names})))
    return out


def read_rgb(path: Path, split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """RGB's English counterfactual-robustness set (``en_fact.json``): 100 questions, four memory sets each.

    Memory sets (at most 10 memories; signal snippets first, then noise snippets in file order to fill the
    cap; the set's order is then shuffled with a fixed seed):
        ``true``: the true snippets (``positive``) + noise (``negative``).
        ``swapped``: the answer-swapped snippets (``positive_wrong``) + noise.
        ``mixed``: the first half (rounded up) of the true snippets, the answer-swapped versions of the rest
        (both, when there is one snippet), + noise.
        ``noise``: the noise snippets only.
    No question has ten noise snippets: its noise set is the smallest of its four, a cue a gate can count
    (docs/benchmarks-field.md, "A cue in the sets' sizes"; kept for the committed conflict runs' sets).
    ``rgb_en_fact_equal`` reads the same file without the cue.

    Label rule:
        true: should_adopt True, should_abstain False, has_conflict False.
        swapped: should_adopt False (the memories assert ``fakeanswer``); should_abstain None (Supp, Silent
        and Opt-Out all avoid the wrong answer); has_conflict True only when a noise snippet in the set
        mentions the true answer (normalised substring), else False.
        mixed: should_adopt None, should_abstain None, has_conflict True.
        noise: when no snippet mentions the answer (normalised substring, any spelling), should_adopt False
        and should_abstain True; when one does (a few noise snippets name it), both None and
        ``meta["answer_in_noise"]`` is True. has_conflict False.
        answers: ``answer`` (every spelling); wrong_answers: ``fakeanswer``.

    Args:
        path: the folder holding ``en_fact.json``.
        split: unused (the set has one split); None.
        limit: the number of questions to read, from the top of the file.

    Returns:
        Four items per question, conditions in the order true, swapped, mixed, noise.

    Raises:
        DataError: a malformed row (file, line and field named), a question with no true snippet among them.
    """
    return _read(path, limit, "rgb_en_fact", equal=False)


def read_rgb_equal(path: Path, split: str | None = None, limit: int | None = None) -> list[BenchmarkItem]:
    """RGB's English counterfactual-robustness set with every memory set of a question the same size: the
    number of its noise snippets (1-9; at most 10), so a gate cannot tell the sets apart by counting.

    Memory sets (each of the question's size k; signal snippets first, then noise snippets in file order to
    fill k; the set's order is then shuffled with the seed ``rgb_en_fact`` uses):
        ``true``: the first k true snippets + noise.
        ``swapped``: the first k answer-swapped snippets + noise.
        ``mixed``: of the first min(k, true snippets) positions, the first half (rounded up) true and the
        answer-swapped versions of the rest (a question with one true snippet: it and its swapped version),
        + noise. A question whose noise snippets number one (k = 1) has no mixed set: one memory cannot
        hold both answers.
        ``noise``: the question's k noise snippets.

    Label rule:
        The same as ``rgb_en_fact``'s, condition by condition:
        true: should_adopt True, should_abstain False, has_conflict False.
        swapped: should_adopt False; should_abstain None; has_conflict True only when a noise snippet in
        the set mentions the true answer, else False.
        mixed: should_adopt None, should_abstain None, has_conflict True.
        noise: when no snippet mentions the answer, should_adopt False and should_abstain True; when one
        does, both None and ``meta["answer_in_noise"]`` is True. has_conflict False.
        answers: ``answer`` (every spelling); wrong_answers: ``fakeanswer``.

    Args:
        path: the folder holding ``en_fact.json`` (``rgb_en_fact``'s folder).
        split: unused (the set has one split); None.
        limit: the number of questions to read, from the top of the file.

    Returns:
        Four items per question (three where k = 1), conditions in the order true, swapped, mixed, noise.

    Raises:
        DataError: a malformed row (file, line and field named), a question with no true snippet or no noise
            snippet (k = 0: every set would be empty) among them.
    """
    return _read(path, limit, "rgb_en_fact_equal", equal=True)


SPEC = BenchmarkSpec("rgb_en_fact", read_rgb, "rgb_en_fact", _LICENCE, _SOURCE, (), RGB_MAX)
EQUAL_SPEC = BenchmarkSpec("rgb_en_fact_equal", read_rgb_equal, "rgb_en_fact", _LICENCE, _SOURCE, (), RGB_MAX)
