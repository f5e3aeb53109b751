"""The item every benchmark loader returns, the registry entry that describes a loader, and the helpers the
label rules share (answer normalisation, the seeded order of a memory set).
"""

from __future__ import annotations

import dataclasses
import random
import re
import string
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

def _freeze(v: Any) -> Any:
    if isinstance(v, Mapping):
        return types.MappingProxyType({k: _freeze(x) for k, x in v.items()})
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


def frozen_mapping(d: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """A read-only copy of ``d``, nested objects included (mappings become read-only views, lists tuples):
    items are frozen, so their ``meta`` is too."""
    return _freeze(dict(d or {}))


@dataclasses.dataclass(frozen=True)
class BenchmarkItem:
    """One (question, memory set, labels) record of a benchmark.

    Attributes:
        dataset: the registry name (``"rgb_en_fact"``, ...).
        qid: unique within the data set: ``group`` plus the condition.
        group: the question's id; every memory set built from one question shares it, so a bootstrap over
            questions resamples groups.
        question: the question text.
        memories: the memory set, in its stated order (at most the data set's ``max_memories``).
        condition: which kind of memory set this is (for example RGB's ``"true"``, ``"swapped"``,
            ``"mixed"``, ``"noise"``); the data set's label rule names them.
        answers: gold answers (empty where the data set has none).
        wrong_answers: answers known to be wrong (a swapped, fabricated or poisoned answer).
        should_adopt: True when a gate should use these memories (Active), False when it should not, None
            when the label rule leaves it open.
        should_abstain: True when the right behaviour is to abstain (Opt-Out), False when the question should
            be answered, None when open.
        has_conflict: True when the memories contradict each other, False when they do not, None when unknown.
        meta: per-data-set extras (per-memory types, source file, baselines), read-only.
    """

    dataset: str
    qid: str
    group: str
    question: str
    memories: tuple[str, ...]
    condition: str
    answers: tuple[str, ...] = ()
    wrong_answers: tuple[str, ...] = ()
    should_adopt: bool | None = None
    should_abstain: bool | None = None
    has_conflict: bool | None = None
    meta: Mapping[str, Any] = dataclasses.field(default_factory=frozen_mapping)


Reader = Callable[[Path, "str | None", "int | None"], Sequence[BenchmarkItem]]
HubReader = Callable[["str | None", "int | None"], Sequence[BenchmarkItem]]

_RULE_END = re.compile(r"^\s*(Args|Returns|Raises|Memory sets|Licence|Example|Examples|Note):\s*$")


@dataclasses.dataclass(frozen=True)
class BenchmarkSpec:
    """A registry entry: how to load one benchmark and under what terms.

    The label rule is stated once, in the ``Label rule:`` section of ``read``'s docstring;
    ``label_rule`` reads it from there.

    Attributes:
        name: the registry name ``load_benchmark`` takes.
        read: ``read(path, split, limit) -> list[BenchmarkItem]`` for a local copy (``path`` is the data
            set's folder, or for hub-only sets a folder or file holding an export of the hub rows);
            ``limit`` counts source rows (questions), each with all its memory sets.
        folder: the sub-folder of the benchmark folder holding the local copy ("" when there is none).
        licence: the data's licence terms, in a line.
        source: where the data comes from (repository and path, or hub id).
        splits: the split names ``split=`` accepts (empty: none; ``None``: any name the source has).
        max_memories: the cap on memories per set (0: the set is always empty).
        hub: ``hub(split, limit)`` reading the hub copy when there is no local one, or None.
    """

    name: str
    read: Reader
    folder: str
    licence: str
    source: str
    splits: tuple[str, ...] | None = ()
    max_memories: int = 0
    hub: HubReader | None = None

    @property
    def label_rule(self) -> str:
        """The ``Label rule:`` section of ``read``'s docstring, dedented (empty when it has none)."""
        doc = (self.read.__doc__ or "").expandtabs().split("\n")
        out: list[str] = []
        inside = False
        for line in doc:
            if line.strip() == "Label rule:":
                inside = True
                continue
            if inside and _RULE_END.match(line):
                break
            if inside:
                out.append(line)
        while out and not out[-1].strip():
            out.pop()
        indent = min((len(s) - len(s.lstrip()) for s in out if s.strip()), default=0)
        return "\n".join(s[indent:] for s in out)


_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, punctuation dropped, articles dropped, whitespace squeezed."""
    s = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def mentions_answer(text: str, answers: Sequence[str]) -> bool:
    """True when any non-empty normalised answer is a substring of the normalised ``text``."""
    t = normalize_answer(text)
    return any(a and a in t for a in (normalize_answer(x) for x in answers))


def seeded_order(items: Sequence[T], seed: str) -> tuple[T, ...]:
    """``items`` in a fixed pseudo-random order chosen by ``seed`` (a string: the data set, question and
    condition), the same in every process and on every machine."""
    out = list(items)
    random.Random(seed).shuffle(out)
    return tuple(out)


def clean(text: Any) -> str:
    """A field as a stripped string ("" for None)."""
    return "" if text is None else str(text).strip()
