"""The lexical conflict detector (``mdl_jax.signals.conflict``): what it flags, what it leaves, its rules
on random sentences, and its bounded memory of recent analyses."""


import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mdl_jax.signals import conflict as lexical
from mdl_jax.signals.conflict import pair_flags, stance_conflict


@pytest.mark.parametrize("a, b", [
    ("Vaccines are safe for children", "Vaccines are not safe for children"),
    ("Yes, MSG is harmful", "No, MSG is harmless in small doses"),
    ("Cracking your knuckles is healthy", "Cracking your knuckles is unhealthy"),
    ("You can swim immediately after eating", "You shouldn't swim right after eating"),
    ("It is legal to marry your cousin in California", "It is illegal to marry your cousin in California"),
])
def test_detector_flags_true_conflicts(a, b):
    assert stance_conflict(a, b) and stance_conflict(b, a)


@pytest.mark.parametrize("a, b", [
    ("Not only cats but also dogs like fish", "Cats and dogs like fish"),   # additive "not only"
    ("The sun is white", "The moon is not made of cheese"),                 # different topics
    ("Georgia produces the most peaches", "California produces the most peaches"),  # entities: ignored
    ("Nothing happens", "You grow watermelons in your stomach"),            # no shared topic
    ("There is no doubt the earth is round", "The earth is round"),         # idiom "no doubt"
])
def test_detector_does_not_flag_non_conflicts(a, b):
    assert not stance_conflict(a, b)


def test_pair_flags_symmetric_with_empty_diagonal():
    f = np.array(pair_flags(["X is safe", "X is not safe", "Y is blue"]))
    assert (f == f.T).all() and not f.diagonal().any() and f[0, 1] and not f[0, 2]


def _conflict_as_specified(a: str, b: str) -> bool:
    """The detector's rules spelled out word by word over its word lists (the module's docstring),
    without the set algebra the implementation uses for speed."""
    def words(text):
        t = text.lower().replace("’", "'")
        for p in lexical.IGNORED_PHRASES:
            t = t.replace(p, " ")
        return lexical._WORD.findall(t)

    def negator(w):
        return w in lexical.NEGATORS or w.endswith("n't")

    opposite: dict[str, set[str]] = {}
    for x, y in lexical.ANTONYMS:
        opposite.setdefault(x, set()).add(y)
        opposite.setdefault(y, set()).add(x)
    wa, wb = words(a), words(b)
    ca = {w for w in wa if w not in lexical.STOPWORDS and not negator(w)}
    cb = {w for w in wb if w not in lexical.STOPWORDS and not negator(w)}
    if {wa[0] if wa else "", wb[0] if wb else ""} == {"yes", "no"}:
        return True
    ta, tb = ca - set(opposite), cb - set(opposite)
    if not ta or not tb or len(ta & tb) / len(ta | tb) < lexical.MIN_SHARED:
        return False
    if any(map(negator, wa)) != any(map(negator, wb)):
        return True
    return any(o in wb and o not in wa and w not in wb for w in ca & set(opposite) for o in opposite[w])


_VOCAB = ["Yes,", "No,", "no", "not", "Not", "never", "don't", "isn’t", "needn't", "ain’t", "can'tx",
          "n't", "nothing", "not only", "no doubt", "nothing but", "safe", "dangerous", "harmful", "legal",
          "illegal", "true", "false", "more", "less", "always", "cause", "prevents", "the", "is", "it",
          "of", "vaccines", "water", "children", "region", "7", "Item", "item", "cats", "dogs", "fish"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_VOCAB), max_size=9), st.lists(st.sampled_from(_VOCAB), max_size=9))
@example(["water", "needn't", "ain’t", "n't"], ["water"])  # contractions are negators, not topic words
@example(["not only", "cats", "safe"], ["cats", "safe"])  # an ignored phrase is no negation
def test_detector_follows_its_rules_on_random_sentences(xs, ys):
    a, b = " ".join(xs), " ".join(ys)
    assert stance_conflict(a, b) == _conflict_as_specified(a, b)
    assert pair_flags([a, b])[0][1] == stance_conflict(a, b)


def test_recent_analyses_give_the_same_flags_and_stay_bounded(monkeypatch):
    monkeypatch.setattr(lexical, "ANALYSES_KEPT", 8)
    monkeypatch.setattr(lexical, "_RECENT", type(lexical._RECENT)())
    texts = [f"Raw dough {i} is {'not ' * (i % 2)}safe to eat" for i in range(12)] + ["x" * 1001]
    for _ in range(3):  # the second and third pass reuse analyses
        assert lexical.pair_flags_recent(texts) == pair_flags(texts)
        assert len(lexical._RECENT) <= 8 and "x" * 1001 not in lexical._RECENT
