"""Task risk A (paper Section 3.2): the one readable place for both risk tables.

TruthfulQA: a graded category → risk table. The paper shows the values 0.2 / 0.5 / 0.75 / 0.85 and
puts health, law, finance and conspiracy categories in the top tier (A ≥ 0.70); it does not list the
whole table, so the assignment of the other categories below is ours.
HaluEval: keyword matching on the question into {0.20, 0.50, 0.85}: health / legal / finance words
→ 0.85, science words → 0.50, anything else → 0.20 (the knowledge snippet is not matched: it often
mentions e.g. a "university" or "company" that says nothing about the question's stakes).

How wide the top tier is (checked against Section 5.2). The paper's high-risk rates
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
  - HaluEval keywords match whole words (they matched word prefixes: "tax" fired on
    "Thurn and Taxis"), and genre phrases ("death metal", "crime thriller") are cut before matching:
    A changes for 171 of the 10,000 questions (103 from 0.85 and 65 from 0.50 to 0.20, 3 from 0.85 to
    0.50; 8 of the 280 HaluEval questions of the committed ``paper-scale-200x3-paired`` run), and the
    top tier holds 10.55%. Committed runs keep the A values they were computed with (records.jsonl).
``tests/test_risk.py`` pins both shares, so a later edit of the tables shows up as a test change.
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

# Reviewed for whole-word matching. The first lists matched word PREFIXES, so "tax" fired on
# "Thurn and Taxis" / "taxi" / "taxonomic", "invest" on "investigative", "gene" on "general" / "Geneva",
# "diet" on "Dietrich", "nurse" on "nursery", "law" on "Lawrence", "stock" on "Stockholm". Every entry is
# now a whole word or phrase, with its inflections spelled out; GENRE_PHRASES (below) are cut from the
# question first, so "death metal", "crime thriller" or "court show" say nothing about the stakes.
HALUEVAL_KEYWORDS = {
    0.85: (
        # health: a wrong answer about illness, treatment or bodily harm can hurt someone
        "health", "healthcare", "healthy", "disease", "diseases", "drug", "drugs", "medicine",
        "medicines", "medical", "medication", "medications", "cancer", "hospital", "hospitals",
        "doctor", "doctors", "physician", "physicians", "symptom", "symptoms", "treatment",
        "treatments", "vaccine", "vaccines", "virus", "viruses", "infection", "infections", "surgery",
        "patient", "patients", "pharmaceutical", "pharmaceuticals", "therapy", "diagnosis",
        "diagnosed", "clinic", "clinics", "clinical", "nurse", "nurses", "nursing", "illness",
        "syndrome",
        # death and injury (the widened health tier): questions about how people died or were hurt
        "death", "deaths", "injury", "injuries", "injured", "poison", "poisoned", "poisoning",
        "overdose", "suicide", "accident", "accidents",
        # alcohol and diet (the widened health tier): consumption advice
        "alcohol", "alcoholic", "nutrition", "diet", "diets",
        # legal: law, courts and crime, where an error misstates someone's legal standing or guilt
        "law", "laws", "legal", "legally", "legalized", "court", "courts", "courtroom", "judge",
        "judges", "courthouse", "lawyer", "lawyers", "attorney", "attorneys", "constitution", "constitutional",
        "constitutionality", "statute", "statutes", "crime", "crimes", "criminal", "criminals",
        "prison", "prisons", "prisoner", "prisoners", "lawsuit", "lawsuits", "convicted", "trial",
        "trials", "police", "murder", "murders", "murdered", "murderer", "murderers", "murdering",
        "killed", "assassinated", "assassination", "assassinate", "terrorist", "terrorists",
        "terrorism", "fraud", "fraudulent", "arrest", "arrests", "arrested", "sentenced",
        # finance: money, markets and investment advice
        "bank", "banks", "banker", "bankers", "banking", "finance", "financed", "financial",
        "financially", "stock", "stocks", "stockbroker", "invest", "invested", "investing",
        "investment", "investments", "investor", "investors", "tax", "taxes", "taxation", "money",
        "currency", "economy", "insurance", "loan", "loans", "debt", "debts", "revenue", "revenues",
        "hedge fund", "hedge funds", "securities", "dollar", "dollars",
        # companies and business (the widened finance tier): who owns, runs or sells what
        "company", "companies", "corporation", "corporations", "corporate", "business",
        "businesses", "businessman", "businessmen", "businesswoman", "entrepreneur", "entrepreneurs",
        "ceo", "industry", "industries", "industrial", "industrialist", "manufacturer",
        "manufacturers", "manufactured", "manufactures", "manufacturing", "retail", "retailer",
        "retailers", "retailing", "market", "markets", "marketed", "marketing", "marketplace", "billion",
        "billionaire", "million", "millionaire", "wealth", "wealthy", "wealthiest", "profit",
        "profits", "profitable", "bankrupt", "bankruptcy", "bankroll", "bankrolled", "employ", "employs", "employed",
        "employing", "employee", "employees", "employer", "employers", "employment", "owned", "owner", "owners",
        "ownership", "restaurant", "restaurants", "price", "prices",
    ),
    0.50: (
        # science: a factual error misleads but rarely harms
        "science", "sciences", "scientist", "scientists", "physics", "physicist", "physicists",
        "chemistry", "chemist", "chemists", "biology", "biologist", "biologists", "species", "genus",
        "genera", "genuses", "planet", "planets", "astronomy", "astronomer", "astronomers", "mathematics",
        "mathematician", "mathematicians", "mathematical", "research", "researching", "researcher", "researchers",
        "theory", "element", "elements", "molecule", "molecules", "engineer", "engineers",
        "engineering", "engineered", "technology", "computer", "computers", "evolution",
        "evolutionary", "laboratory", "nobel", "gene", "genes", "genetic", "genetics", "plant",
        "plants", "animal", "animals",
    ),
}
# Phrases cut from the question before matching: a keyword inside them names a genre, a title or a
# family relation, not the stakes of the question.
GENRE_PHRASES = (
    r"death metal", r"crime (?:drama|thriller|film|action|comedy|fiction|novel|series|story|writer|"
    r"novelist|caper|procedural|show)s?", r"court shows?", r"courtroom drama", r"doctor who",
    r"doctor (?:doom|dolittle|strange)", r"judge dredd", r"stock car", r"diet (?:pepsi|coke)",
    r"banks of", r"\w+-in-laws?",
)
HALUEVAL_DEFAULT = 0.20
_GENRE = re.compile(r"\b(?:" + "|".join(GENRE_PHRASES) + r")\b")
_LEVELS = {level: re.compile(r"\b(?:" + "|".join(re.escape(w) for w in sorted(ws, key=len, reverse=True))
                             + r")\b") for level, ws in HALUEVAL_KEYWORDS.items()}


def _check_text(name: str, value) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a string, got {type(value).__name__}")


def truthfulqa_risk(category: str) -> float:
    """A for a TruthfulQA category (the table above; ``TRUTHFULQA_DEFAULT`` for an unknown one); a
    TypeError naming ``category`` when it is not a string."""
    _check_text("category", category)
    return TRUTHFULQA_RISK.get(category.strip(), TRUTHFULQA_DEFAULT)


def halueval_risk(question: str) -> float:
    """A for a question by whole-word keywords: 0.85 (health / legal / finance), 0.50 (science), else 0.20;
    a TypeError naming ``question`` when it is not a string."""
    _check_text("question", question)
    q = _GENRE.sub(" ", question.lower().replace("’", "'"))
    for level in (0.85, 0.50):
        if _LEVELS[level].search(q):
            return level
    return HALUEVAL_DEFAULT


def risk(dataset: str, question: str, category: str = "") -> float:
    if dataset == "truthfulqa":
        return truthfulqa_risk(category)
    if dataset == "halueval":
        return halueval_risk(question)
    raise ValueError(f"dataset: expected 'truthfulqa' or 'halueval', got {dataset!r}")
