"""A detector of disagreeing answers across memories: the conflicts the paper's lexical φ cannot see.

The paper's detector (``conflict.pair_flags``) flags negation, yes/no polarity and antonyms, so two
memories that give different answers in the same words, "Canberra is the capital of Australia" and
"Sydney is the capital of Australia", are not a conflict to it (φ = 0, R stays high). This detector
flags exactly those: two memories conflict when some sentence of one and some sentence of the other are
**parallel** (the same statement once the answer-bearing tokens are set aside) and each names an
answer the other does not.

  answer-bearing tokens   numbers ("1,918", "3.5", "2021"), month names, and capitalised words that do
                          not open a sentence (names, places, titles), plus a sentence's first word when
                          it is capitalised and not a common English word
  the statement's frame   the sentence's other words, lower-cased, stop words dropped, in order
  the bound               the first ``MAX_SENTENCES`` sentences of each memory (the work is quadratic
                          in them)
  parallel                the two frames share at least ``MIN_FRAME_OVERLAP`` of the larger one's words
                          (all of them, for a restatement with one answer swapped), and the two
                          sentences share at least ``MIN_SHARED`` words, frame words and answer-bearing
                          tokens together ("Australia" in both capital sentences)
  disagree                each sentence names an answer-bearing token the other lacks

Zero parameters are learned: the two constants below are fixed, like the paper's 0.3 relevance cut,
and chosen so that a statement restated with one entity, number or date swapped is caught, while two
sentences that merely share a topic are not.

Limits (also in the user guides): it reads sentences, not meaning. It misses a disagreement worded
differently ("Canberra is Australia's capital" against "The capital of Australia is Sydney" is
caught only when the frames still match), every disagreement that is not about a named or numeric answer
("raw flour is safe" / "raw flour carries E. coli"), and answers written in lower case. It flags two true
statements that differ in a name while saying the same thing about two different subjects ("Paris is
the capital of France" / "Rome is the capital of Italy" are parallel and disagree: a flag). It is an
option beside the paper's detector, which stays the default: ``MemoryGate(conflict=answer_pair_flags)``
or ``conflict=either_pair_flags`` for both.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mdl_jax.signals.conflict import STOPWORDS, checked_texts, pair_flags, pairwise_flags

# Two frames are parallel when each keeps this share of the other's words: a restatement with one
# answer swapped keeps all of them; two sentences on one topic rarely keep more than half.
MIN_FRAME_OVERLAP = 0.8
# The sentences of a memory the detector reads, first ones first: the pairwise comparison is quadratic in
# them, and a memory is a retrieved passage, not a book.
MAX_SENTENCES = 200
# ... and the sentences share at least this many words: "It is X." against "It is Y." says nothing
# about one thing.
MIN_SHARED = 2

MONTHS = frozenset("""january february march april may june july august september october november
december""".split())
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])|\n+")
_TOKEN = re.compile(r"\d[\d,.]*\d|\d|[^\W\d_][\w'\-]*")  # any script's letters ("Zürich" is one word)
# a sentence's first word is answer-bearing only if it is not one of these common openers
_OPENERS = STOPWORDS | frozenset("""however although according after before during since while today
yesterday many several most some both either neither another every no not yes""".split())


def _sentence_parts(sentence: str) -> tuple[frozenset[str], frozenset[str]]:
    """(answer-bearing tokens, frame words) of one sentence."""
    answers: set[str] = set()
    frame: set[str] = set()
    for i, tok in enumerate(_TOKEN.findall(sentence)):
        tok = tok.removesuffix("'s")  # "Australia's" names Australia
        low = tok.lower()
        if tok[0].isdigit():
            answers.add(tok.replace(",", "").rstrip("."))
        elif low in MONTHS:
            answers.add(low)
        elif tok[0].isupper() and (i > 0 or low not in _OPENERS):
            answers.add(low)
        elif low not in STOPWORDS:
            frame.add(low)
    return frozenset(answers), frozenset(frame)


def _parts(text: str) -> list[tuple[frozenset[str], frozenset[str]]]:
    """The answer and frame sets of each sentence of ``text`` that names an answer."""
    out = []
    for s in _SENTENCE.split(text.strip())[:MAX_SENTENCES]:
        answers, frame = _sentence_parts(s)
        if answers and frame:
            out.append((answers, frame))
    return out


def _disagree(x: list, y: list) -> bool:
    for ax, fx in x:
        for ay, fy in y:
            frame = len(fx & fy)
            if (frame and frame >= MIN_FRAME_OVERLAP * max(len(fx), len(fy))
                    and frame + len(ax & ay) >= MIN_SHARED and (ax - ay) and (ay - ax)):
                return True
    return False


def answer_conflict(a: str, b: str) -> bool:
    """True when memories ``a`` and ``b`` state the same thing with different answers (see the module
    docstring for the rule).

    Examples:
      >>> answer_conflict("Canberra is the capital of Australia.", "Sydney is the capital of Australia.")
      True
      >>> answer_conflict("Canberra is the capital of Australia.", "Canberra is Australia's capital.")
      False
    """
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, str):
            raise TypeError(f"{name}: expected a string, got {type(x).__name__}")
    return _disagree(_parts(a), _parts(b))


def answer_pair_flags(texts: Sequence[str]) -> list[list[bool]]:
    """S×S symmetric flags (False on the diagonal): which pairs of memories give disagreeing answers.

    Args:
      texts: the S memory texts of one store.

    Returns:
      An S×S list of lists of bools, the shape ``MemoryGate(conflict=...)`` takes.

    Raises:
      TypeError: a single string given as ``texts``, or a text that is not a string.
    """
    return pairwise_flags([_parts(t) for t in checked_texts(texts)], _disagree)


def either_pair_flags(texts: Sequence[str]) -> list[list[bool]]:
    """The paper's lexical flags OR the disagreeing-answer flags, S×S: both kinds of conflict.

    Args:
      texts: the S memory texts of one store.

    Returns:
      An S×S list of lists of bools.

    Raises:
      TypeError: a single string given as ``texts``, or a text that is not a string.
    """
    texts = checked_texts(texts)  # once: a generator would be spent by the first detector
    ans = answer_pair_flags(texts)
    lex = pair_flags(texts)
    return [[bool(x or y) for x, y in zip(r1, r2)] for r1, r2 in zip(lex, ans)]
