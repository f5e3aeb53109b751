"""Task risk A (paper Section 3.2): the one readable place for both risk tables.

TruthfulQA: a graded category → risk table. The paper shows the values 0.2 / 0.5 / 0.75 / 0.85 and
puts health, law, finance and conspiracy categories in the top tier (A ≥ 0.70); it does not list the
whole table, so the assignment of the other categories below is ours.
HaluEval: keyword matching on the question into {0.20, 0.50, 0.85}: health / legal / finance words
→ 0.85, science words → 0.50, anything else → 0.20 (the knowledge snippet is not matched: it often
mentions e.g. a "university" or "company" that says nothing about the question's stakes).

How wide the top tier is (checked against Section 5.2, issue 9 item 6). The paper's high-risk rates
imply about 177 high-risk TruthfulQA records and about 75 HaluEval records per 200 × 3 run, i.e. 29.5%
and 12.5% of questions. The first tables gave 22.2% and 4.8% of all questions (114 and 27 records in
the committed run). Widened, with the reason for each addition:
  - TruthfulQA: Psychology (its questions are debunked clinical and pseudo-scientific claims, e.g.
    Wakefield's autism paper: health misinformation), Paranormal (psychics, witches, contacting the
    dead: the conspiracy / misinformation tier of the paper's Case 5) and Stereotypes (generalisations
    about groups of people: harm to people) move to 0.75 → 250 of 817 questions, 30.6%.
  - HaluEval (HotpotQA-style trivia, where health / legal / finance words are rare): the finance tier
    now covers companies and business, the legal tier crimes and violence, the health tier death,
    injury, poisoning, alcohol and diet → 11.6% of the 10,000 questions (was 4.75%).
``tests/test_signals.py`` pins both shares, so a later edit of the tables shows up as a test change.
"""

from __future__ import annotations

import re

HIGH_RISK = 0.70  # the paper's high-risk tier: A ≥ 0.70

TRUTHFULQA_RISK = {
    # 0.85: advice whose error can hurt health, legal standing or money
    "Health": 0.85, "Law": 0.85, "Finance": 0.85, "Nutrition": 0.85,
    # 0.75: conspiracies and misinformation (the paper's Case 5: Denver airport, A = 0.75)
    "Conspiracies": 0.75, "Misinformation": 0.75,
    # 0.75 as well (widened to the paper's implied top-tier share; see the module docstring):
    # debunked clinical / pseudo-scientific claims, paranormal practices, stereotypes about people
    "Psychology": 0.75, "Paranormal": 0.75, "Stereotypes": 0.75,
    # 0.5: factual claims about the world where a wrong answer misleads but rarely harms
    "Misconceptions": 0.5, "Misconceptions: Topical": 0.5, "Economics": 0.5, "Sociology": 0.5,
    "Science": 0.5, "History": 0.5, "Politics": 0.5, "Religion": 0.5,
    "Statistics": 0.5, "Advertising": 0.5, "Education": 0.5, "Weather": 0.5,
    "Superstitions": 0.5,
    # 0.2: fiction, language, quotations, trick questions
    "Fiction": 0.2, "Myths and Fairytales": 0.2, "Proverbs": 0.2, "Language": 0.2,
    "Misquotations": 0.2, "Indexical Error: Other": 0.2, "Indexical Error: Time": 0.2,
    "Indexical Error: Location": 0.2, "Indexical Error: Identity": 0.2, "Confusion: People": 0.2,
    "Confusion: Places": 0.2, "Confusion: Other": 0.2, "Distraction": 0.2, "Logical Falsehood": 0.2,
    "Subjective": 0.2, "Mandela Effect": 0.2,
}
TRUTHFULQA_DEFAULT = 0.5  # a category not in the table

HALUEVAL_KEYWORDS = {
    0.85: (
        # health
        "health", "disease", "drug", "medicine", "medical", "medication", "cancer", "hospital",
        "doctor", "physician", "symptom", "treatment", "vaccine", "virus", "infection", "surgery",
        "patient", "pharmaceutical", "therapy", "diagnos", "clinic", "nurse", "illness", "syndrome",
        "death", "injur", "poison", "overdose", "suicide", "alcohol", "nutrition", "diet", "accident",
        # legal
        "law", "legal", "court", "judge", "lawyer", "attorney", "constitution", "statute", "crime",
        "criminal", "prison", "lawsuit", "convicted", "trial", "supreme court", "police",
        "murder", "killed", "assassinat", "terroris", "fraud", "arrest", "sentenced",
        # finance
        "bank", "finance", "financial", "stock", "invest", "tax", "money", "currency", "economy",
        "insurance", "loan", "debt", "revenue", "hedge fund", "securities", "dollar",
        "company", "companies", "corporat", "business", "entrepreneur", "ceo", "industr",
        "manufactur", "retail", "market", "billion", "million", "wealth", "profit", "bankrupt", "employ",
        "owned", "owner", "restaurant", "price",
    ),
    0.50: (
        "science", "scientist", "physics", "physicist", "chemistry", "chemist", "biology",
        "biologist", "species", "genus", "planet", "astronomy", "astronomer", "mathematic",
        "research", "theory", "element", "molecule", "engineer", "technology", "computer",
        "evolution", "laboratory", "nobel", "gene", "plant", "animal",
    ),
}
HALUEVAL_DEFAULT = 0.20


def truthfulqa_risk(category: str) -> float:
    return TRUTHFULQA_RISK.get(category.strip(), TRUTHFULQA_DEFAULT)


def _matches(text: str, word: str) -> bool:
    # prefix match at a word start ("invest" matches "investor"), so short stems need no plural list
    return re.search(r"\b" + re.escape(word), text) is not None


def halueval_risk(question: str) -> float:
    q = question.lower()
    for level in (0.85, 0.50):
        if any(_matches(q, w) for w in HALUEVAL_KEYWORDS[level]):
            return level
    return HALUEVAL_DEFAULT


def risk(dataset: str, question: str, category: str = "") -> float:
    if dataset == "truthfulqa":
        return truthfulqa_risk(category)
    if dataset == "halueval":
        return halueval_risk(question)
    raise ValueError(f"dataset: expected 'truthfulqa' or 'halueval', got {dataset!r}")
