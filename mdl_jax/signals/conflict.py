"""A lexical stance-conflict detector for pairs of memory records (paper Section 3.2, φ).

Two records conflict when they speak about the same thing (enough shared content words) and one of:
  - negation: exactly one of them is negated ("X is safe" / "X is not safe");
  - yes/no polarity: one opens with "yes", the other with "no";
  - antonyms: one holds a word of an antonym pair and the other its opposite, not both.
Word lists are below. Deliberately ignored (not conflicts by themselves): additive or idiomatic
negators ("not only", "not just", "no doubt", "no matter", "nothing but", "no longer" is kept as
negation); double negation (counted as negated: a lexical detector cannot parse scope); numeric and
named-entity disagreements ("July 4" vs "August 2", "Georgia" vs "California"); sarcasm and hedges.
Those stay invisible to φ by design: the paper's detector is lexical.
"""

from __future__ import annotations

import collections
import os
import re
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

NEGATORS = frozenset({
    "not", "no", "never", "none", "nothing", "nobody", "neither", "nor", "without", "cannot",
    "nowhere", "don't", "doesn't", "didn't", "isn't", "aren't", "wasn't", "weren't", "won't",
    "wouldn't", "can't", "couldn't", "shouldn't", "mustn't", "hasn't", "haven't", "hadn't",
})
IGNORED_PHRASES = ("not only", "not just", "no doubt", "no matter", "nothing but", "not to mention")
ANTONYMS = (
    ("true", "false"), ("safe", "dangerous"), ("safe", "harmful"), ("increase", "decrease"),
    ("increases", "decreases"), ("more", "less"), ("always", "never"), ("good", "bad"),
    ("healthy", "unhealthy"), ("legal", "illegal"), ("possible", "impossible"), ("alive", "dead"),
    ("hot", "cold"), ("high", "low"), ("higher", "lower"), ("larger", "smaller"),
    ("bigger", "smaller"), ("better", "worse"), ("cause", "prevent"), ("causes", "prevents"),
    ("real", "fake"), ("real", "fictional"), ("correct", "incorrect"), ("allowed", "forbidden"),
    ("allowed", "prohibited"), ("effective", "ineffective"), ("beneficial", "harmful"),
    ("positive", "negative"), ("win", "lose"), ("before", "after"), ("guilty", "innocent"),
    ("benefit", "harm"), ("proven", "disproven"), ("accurate", "inaccurate"), ("exists", "mythical"),
)
STOPWORDS = frozenset("""a an the is are was were be been being am of in on at to for from by with as and
or but if then than that this these those it its it's they them their there here you your we our i me my
he she his her do does did done have has had will would can could should may might must shall so such
what which who whom whose when where why how all any each some one ones into out up down over under about
yes also just very much many most only own same other""".split())
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_ANT: dict[str, set[str]] = {}
for _a, _b in ANTONYMS:
    _ANT.setdefault(_a, set()).add(_b)
    _ANT.setdefault(_b, set()).add(_a)
MIN_SHARED = 0.34  # Jaccard overlap of content words that makes two records "about the same thing"
_DROP = STOPWORDS | NEGATORS
_ANT_WORDS = frozenset(_ANT)
# every ignored phrase contains this ("no"): texts without it skip the six replacements
_PHRASE_HINT = os.path.commonprefix(IGNORED_PHRASES)


def analyse(text: str):
    """(negated, topic words, first word, antonym-pair words among the content, antonym-pair words
    among all words) of one text.

    Not cached, deliberately: over all 10,817 stores of both datasets (54,744 analyses, 44% of them
    texts seen in an earlier store) the flags were no faster behind an LRU cache of
    1,024-65,536 texts than uncached (what a hit saves, a miss's allocation outside the hot memory
    costs again), and the old 65,536-entry cache grew a stream's memory by ~80 MB and slowed every full
    garbage collection (its entries were sets the collector traverses)."""
    t = text.lower().replace("’", "'")
    if _PHRASE_HINT in t:
        for p in IGNORED_PHRASES:
            t = t.replace(p, " ")
    words = _WORD.findall(t)
    ws = set(words)
    content = ws - _DROP
    negated = not NEGATORS.isdisjoint(ws)
    if "n't" in t:  # a word ending in n't holds it: contractions are negators, not content
        contracted = {w for w in ws if w.endswith("n't")}
        negated = negated or bool(contracted)
        content -= contracted
    ant = content & _ANT_WORDS
    # antonym words are content words; the topic overlap leaves them out. Of all the words only
    # those of an antonym pair matter to ``analyses_conflict`` (is the opposite present?): kept alone
    return negated, content - ant, words[0] if words else "", ant, ws & _ANT_WORDS


def _overlap(a: set, b: set) -> float:
    if not a or not b:
        return 0.0
    shared = len(a & b)
    return shared / (len(a) + len(b) - shared)  # = |a ∩ b| / |a ∪ b|, without building the union


def analyses_conflict(x, y) -> bool:
    """Whether two texts, given as their ``analyse`` results, contradict each other."""
    neg_a, topic_a, first_a, ant_a, words_a = x
    neg_b, topic_b, first_b, ant_b, words_b = y
    if {first_a, first_b} == {"yes", "no"}:
        return True
    if _overlap(topic_a, topic_b) < MIN_SHARED:
        return False
    if neg_a != neg_b:
        return True
    for w in ant_a:
        for opp in _ANT[w]:
            if opp in words_b and opp not in words_a and w not in words_b:
                return True
    return False


def stance_conflict(a: str, b: str) -> bool:
    """True when records ``a`` and ``b`` take lexically opposite positions on the same topic; a
    TypeError naming ``a`` or ``b`` when it is not a string."""
    for name, text in (("a", a), ("b", b)):
        if not isinstance(text, str):
            raise TypeError(f"{name}: expected a string, got {type(text).__name__}")
    return analyses_conflict(analyse(a), analyse(b))


def checked_texts(texts) -> list[str]:
    """``texts`` as a list, each a string; a TypeError naming ``texts`` (a single string would be read
    as its characters, each a memory) or the first ``texts[i]`` that is not one."""
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"texts: expected a sequence of texts, got a {type(texts).__name__}; "
                        "wrap one text in a list: [text]")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}]: expected a string, got {type(t).__name__}")
    return texts


def pair_flags(texts) -> list[list[bool]]:
    """Symmetric S×S conflict flags for one store (diagonal False); each text is analysed once.
    A TypeError for a single string or a text that is not one (``checked_texts``)."""
    return pairwise_flags([analyse(t) for t in checked_texts(texts)])


def pairwise_flags(items: list, conflicts: Callable[[Any, Any], bool] = analyses_conflict) -> list[list[bool]]:
    """The symmetric flags of ``items`` (analysed texts, by default): each pair compared once by
    ``conflicts``, the diagonal False."""
    n = len(items)
    out = [[False] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            out[i][j] = out[j][i] = conflicts(items[i], items[j])
    return out


def pair_flags_among(texts, keep) -> list[list[bool]]:
    """``pair_flags`` for the pairs of texts whose ``keep`` entries are both true (only those texts are
    analysed); every other pair False. ``keep``: S booleans."""
    n = len(texts)
    out = [[False] * n for _ in range(n)]
    ks = [i for i in range(n) if keep[i]]
    if len(ks) < 2:
        return out
    an = {i: analyse(texts[i]) for i in ks}
    for a, i in enumerate(ks):
        for j in ks[a + 1:]:
            out[i][j] = out[j][i] = analyses_conflict(an[i], an[j])
    return out


# The analyses of the texts that one-query calls saw last (``mdl_jax.signals.aggregation``'s small
# path: a framework component or the gateway, whose retrievers return the same documents again), least
# recently used dropped first. Bounded: ANALYSES_KEPT texts of at most ANALYSED_TEXT_CHARS characters
# each (longer ones are analysed every time), ≲ 2,048 × ~6 KiB ≈ 12 MiB at the bound. Streams do not
# use it (``pair_flags``): there, most texts are new and a cache costs more than it saves (see
# ``analyse``).
ANALYSES_KEPT = 2048
ANALYSED_TEXT_CHARS = 1000
_RECENT: collections.OrderedDict[str, tuple] = collections.OrderedDict()
_RECENT_LOCK = threading.Lock()


def recent_analysis(text: str):
    """``analyse(text)``, remembered for the most recently seen short texts (at most ANALYSES_KEPT)."""
    with _RECENT_LOCK:
        a = _RECENT.get(text)
        if a is not None:
            _RECENT.move_to_end(text)
            return a
    a = analyse(text)
    if len(text) <= ANALYSED_TEXT_CHARS:
        with _RECENT_LOCK:
            _RECENT[text] = a
            if len(_RECENT) > ANALYSES_KEPT:
                _RECENT.popitem(last=False)
    return a


def pair_flags_recent(texts) -> list[list[bool]]:
    """``pair_flags``, the same flags, with the analyses of recently seen texts reused (see
    ``ANALYSES_KEPT``): for a few texts at a time, most of them seen before."""
    return pairwise_flags([recent_analysis(t) for t in texts])


def checked_flags(got: Any, n: int, name: str = "conflict") -> np.ndarray:
    """A detector's output for n memories as an (n, n) bool matrix: booleans or 0/1 (a probability, NaN
    or a string would read as flagged), else a ValueError naming ``name``."""
    try:
        out = np.asarray(got)
    except (TypeError, ValueError) as e:  # ragged rows: NumPy's words would not name the detector
        raise ValueError(f"{name}: expected an {n}×{n} matrix of flags for {n} memories, got a "
                         f"{type(got).__name__} that is not one ({e})") from None
    if out.shape != (n, n):
        raise ValueError(f"{name}: expected an {n}×{n} matrix of flags for {n} memories, "
                         f"got shape {out.shape}")
    if out.dtype == bool:
        return out
    # 0/1 numbers are flags; anything else (a probability, NaN, a string) would read as True
    ok = out.dtype.kind in "iufO"
    try:
        v = out.astype(np.float64)
        ok = ok and bool(((v == 0) | (v == 1)).all())
    except (TypeError, ValueError):
        ok = False
    if not ok:
        bad = next((repr(x) for x in out.ravel().tolist() if type(x) not in (bool, int, float) or x not in (0, 1)),
                   f"dtype {out.dtype}")
        raise ValueError(f"{name}: expected booleans (or 0/1) for the {n}×{n} pairs, got {bad}"[:200])
    return v == 1


def checked_conflict(fn: Callable[[list[str]], Any]) -> Callable[[list[str]], np.ndarray]:
    """A user's conflict detector (texts → S×S flags) behind ``checked_flags``: a ValueError naming
    ``conflict`` for output that is no S×S matrix of flags. A detector already behind it (the gate's,
    handed on to ``memory_signals``) is returned as it is."""
    if getattr(fn, "checked_flags", False):
        return fn

    def flags(texts):
        texts = list(texts)
        return checked_flags(fn(texts), len(texts))
    flags.checked_flags = True  # type: ignore[attr-defined]
    return flags
