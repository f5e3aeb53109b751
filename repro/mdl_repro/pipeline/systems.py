"""The compared systems (paper Table 3, Section 5.2): prompts and per-question call logic.

All systems see the same question, memory store, model and sampling.
  B1   no memory.
  B2   every memory of the store injected (standard RAG).
  B3   MDL: Active → inject; Supp → inject with a caution instruction; Silent → answer without
       memories; Opt-Out → an explicit abstention, no model call.
  CRAG a prompt-based evaluator grades each memory Correct / Incorrect / Ambiguous (one call per
       memory). ≥ 1 Correct → refine (keep the Correct memories) and generate; all Incorrect →
       parametric fallback (no memories; replaces CRAG's web search, as in the paper); otherwise
       Ambiguous → cautious generation with the memories not graded Incorrect.
  SelfRAG draft with memories, then reflection as three questions: ISREL (Relevant / Irrelevant),
       ISSUP (Fully supported / Partially supported / No support) and ISUSE (1-5); an Irrelevant or
       unsupported ("No support") draft is regenerated from parametric knowledge. A reflection whose
       ISREL and ISSUP are both undecided keeps the draft and is counted as "unparsed".

Grades and reflections are decisions among a few allowed labels, so they are made by the model's
likelihood of each label (``backend.score``: one forward pass over the label tokens locally, the
``top_logprobs`` of a 1-token completion on a server): deterministic, and never lost to free text the
parser cannot read. Only where a server sends no logprobs is a short greedy reply parsed. Each
record's ``extra`` says how every decision was made (scored / parsed / unparsed) and its label scores.

Sampling is paired: ``seed`` is each question's record seed (``generation.record_seed``), the same
for every system, so the same prompt for the same record gets the same answer whichever system
sends it (exactly so behind ``CachedBackend``).

Each function takes a chunk of questions and returns, per question, the answer, the number of LLM
calls, every prompt sent (for the record's prompt hash), whether the answer was replayed from the
generation cache, and extras.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from mdl_jax.controller.decision import Action
from mdl_jax.prompts import ABSTENTION, chat

SYSTEMS = ("B1", "B2", "B3", "CRAG", "SelfRAG")


def _per_question(seed, n: int) -> list[int]:
    if isinstance(seed, int) or hasattr(seed, "__index__"):
        return [int(seed)] * n
    seeds = [int(x) for x in seed]
    if len(seeds) != n:
        raise ValueError(f"seed: expected one int or {n} ints (one per question), got {len(seeds)}")
    return seeds


def _generate(backend, chats, seeds, **kw):
    return backend.generate(chats, seed=list(seeds), **kw) if chats else []


def _res(g, prompts, llm_calls, extra, tokens=None, failed=None, error=None) -> dict:
    return dict(answer=g.text, failed=g.failed if failed is None else failed,
                error=g.error if error is None else error, llm_calls=llm_calls, prompts=prompts,
                tokens=g.n_tokens if tokens is None else tokens, cached=bool(g.cached), extra=extra)


def run_plain(backend, questions, stores, *, inject: bool, seed):
    seeds = _per_question(seed, len(questions))
    chats = [chat(q, s.texts if inject else ()) for q, s in zip(questions, stores)]
    gens = _generate(backend, chats, seeds)
    return [_res(g, [c], 1, {}) for g, c in zip(gens, chats)]


def run_mdl(backend, questions, stores, actions: Sequence[int], *, seed):
    seeds = _per_question(seed, len(questions))
    todo, chats = [], []
    for i, (q, s, a) in enumerate(zip(questions, stores, actions)):
        a = Action(int(a))
        if a == Action.OPT_OUT:
            continue
        todo.append(i)
        # Active sends exactly B2's prompt and Silent exactly B1's: with paired sampling they get
        # B2's / B1's answer for the same record, so B3 differs from them only where it acts.
        chats.append(chat(q, s.texts if a in (Action.ACTIVE, Action.SUPP) else (),
                          caution=a == Action.SUPP))
    gens = dict(zip(todo, _generate(backend, chats, [seeds[i] for i in todo])))
    prompts = dict(zip(todo, chats))
    out = []
    for i in range(len(questions)):
        if i not in gens:
            out.append(dict(answer=ABSTENTION, failed=False, error="", llm_calls=0, prompts=[],
                            tokens=0, cached=False, extra={}))
        else:
            out.append(_res(gens[i], [prompts[i]], 1, {}))
    return out


# --- Label decisions by likelihood -----------------------------------------------------------------

def _parse_label(text: str | None, options: Sequence[str]) -> str | None:
    """The allowed label that occurs first in ``text`` (longest first at one position, whole words,
    any case), else None."""
    best = None
    for o in sorted(options, key=len, reverse=True):
        m = re.search(rf"(?<!\w){re.escape(o)}(?!\w)", text or "", re.IGNORECASE)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), o)
    return best[1] if best else None


def classify(backend, prompts: Sequence[list], options: Sequence[str]) -> list[dict]:
    """One decision among ``options`` per prompt: {"label", "method", "scores", "failed", "error"}.

    method "scored": the label of highest log-likelihood under ``backend.score`` (ties go to the
    earlier option); "parsed": the server sent no logprobs, so a short greedy reply was parsed;
    "unparsed": neither gave a label (label None).
    """
    n = len(prompts)
    if not n:
        return []
    scored = backend.score(prompts, list(options)) if hasattr(backend, "score") else [None] * n
    out: list[dict] = [None] * n  # type: ignore[list-item]  # placeholders: every slot is set below
    fallback = []
    for i, sc in enumerate(scored):
        if isinstance(sc, str):  # the call itself failed (server down ...): nothing to parse either
            out[i] = dict(label=None, method="unparsed", scores=None, failed=True, error=sc)
        elif sc is not None and any(math.isfinite(x) for x in sc):
            j = max(range(len(sc)), key=lambda k: (sc[k], -k))
            out[i] = dict(label=options[j], method="scored", failed=False, error="",
                          scores={o: round(float(x), 4) if math.isfinite(x) else None
                                  for o, x in zip(options, sc)})
        else:
            fallback.append(i)
    if fallback:
        gens = backend.generate([prompts[i] for i in fallback], seed=0, max_new_tokens=8,
                                temperature=0.0)
        for i, g in zip(fallback, gens):
            lab = _parse_label(g.text, options)
            out[i] = dict(label=lab, method="parsed" if lab else "unparsed", scores=None,
                          failed=g.failed, error=g.error, text=g.text)
    return out


CRAG_EVAL = ("Question: {q}\nRetrieved document: {m}\n\nIs this document correct and relevant for "
             "answering the question? Reply with exactly one word: Correct, Incorrect, or Ambiguous.")
GRADES = ("Correct", "Incorrect", "Ambiguous")
_GRADE = re.compile(r"\b(correct|incorrect|ambiguous)\b", re.IGNORECASE)


def parse_grade(text: str | None) -> str:
    """First grade word in the evaluator's reply; anything else counts as Ambiguous."""
    m = _GRADE.search(text or "")
    return m.group(1).capitalize() if m else "Ambiguous"


def _worst(methods: Sequence[str]) -> str:
    for m in ("unparsed", "parsed", "scored"):
        if m in methods:
            return m
    return "scored"


def run_crag(backend, questions, stores, *, seed):
    seeds = _per_question(seed, len(questions))
    evals, owner = [], []
    for i, (q, s) in enumerate(zip(questions, stores)):
        for m in s.texts:
            evals.append([{"role": "user", "content": CRAG_EVAL.format(q=q, m=m)}])
            owner.append(i)
    decided = classify(backend, evals, GRADES)
    grades: list[list[str]] = [[] for _ in questions]
    info: list[list[dict]] = [[] for _ in questions]
    eval_prompts: list[list] = [[] for _ in questions]
    failed, errors = [False] * len(questions), [""] * len(questions)
    for i, d, p in zip(owner, decided, evals):
        # An undecided grade counts as Ambiguous, CRAG's own "not sure" (and is counted as unparsed).
        grades[i].append(d["label"] or "Ambiguous")
        info[i].append(d)
        eval_prompts[i].append(p)
        failed[i] |= d["failed"]
        errors[i] = errors[i] or d["error"]
    chats, verdicts = [], []
    for q, s, gs in zip(questions, stores, grades):
        if "Correct" in gs:
            verdict, mems, caution = "Correct", [m for m, g in zip(s.texts, gs) if g == "Correct"], False
        elif all(g == "Incorrect" for g in gs):
            verdict, mems, caution = "Incorrect", [], False
        else:
            verdict, mems, caution = "Ambiguous", [m for m, g in zip(s.texts, gs) if g != "Incorrect"], True
        verdicts.append(verdict)
        chats.append(chat(q, mems, caution))
    gens = _generate(backend, chats, seeds)
    out = []
    for g, f, e, gs, ds, ep, c, v in zip(gens, failed, errors, grades, info, eval_prompts, chats, verdicts):
        methods = [d["method"] for d in ds]
        extra = {"verdict": v, "grades": gs, "grade_methods": methods, "method": _worst(methods),
                 "grade_scores": [d["scores"] for d in ds]}
        out.append(_res(g, ep + [c], len(gs) + 1, extra, failed=g.failed or f, error=g.error or e))
    return out


ISREL_Q = ("Question: {q}\nMemories:\n{mem}\n\nAre these memories relevant to the question? Reply with "
           "exactly one word: Relevant or Irrelevant.")
ISSUP_Q = ("Question: {q}\nMemories:\n{mem}\nAnswer: {d}\n\nIs the answer supported by the memories? "
           "Reply with exactly one of: Fully supported, Partially supported, No support.")
ISUSE_Q = ("Question: {q}\nAnswer: {d}\n\nHow useful is this answer to the question, from 1 (useless) "
           "to 5 (very useful)? Reply with one number.")
ISREL = ("Relevant", "Irrelevant")
ISSUP = ("Fully supported", "Partially supported", "No support")
ISUSE = ("1", "2", "3", "4", "5")
# The old single free-text reflection (kept for parsing replies of that form).
SELFRAG_REFLECT = (
    "Question: {q}\nMemories:\n{mem}\nDraft answer: {d}\n\nCritique the draft. Reply in exactly this "
    "format:\nISREL: Relevant or Irrelevant\nISSUP: Fully supported, Partially supported, or No support"
    "\nISUSE: a number from 1 to 5")
_ISREL = re.compile(r"ISREL\W*(relevant|irrelevant)", re.IGNORECASE)
_ISSUP = re.compile(r"ISSUP\W*(fully supported|partially supported|no support)", re.IGNORECASE)
_ISUSE = re.compile(r"ISUSE\W*([1-5])", re.IGNORECASE)


def parse_reflection(text: str | None) -> dict:
    t = text or ""
    rel, sup, use = _ISREL.search(t), _ISSUP.search(t), _ISUSE.search(t)
    return {"isrel": rel.group(1).capitalize() if rel else None,
            "issup": sup.group(1).capitalize() if sup else None,
            "isuse": int(use.group(1)) if use else None}


def run_selfrag(backend, questions, stores, *, seed):
    seeds = _per_question(seed, len(questions))
    drafts_c = [chat(q, s.texts) for q, s in zip(questions, stores)]
    drafts = _generate(backend, drafts_c, seeds)  # exactly B2's prompt: B2's answer for the record
    mems = ["\n".join(f"- {m}" for m in s.texts) for s in stores]
    rel_c = [[{"role": "user", "content": ISREL_Q.format(q=q, mem=m)}] for q, m in zip(questions, mems)]
    sup_c = [[{"role": "user", "content": ISSUP_Q.format(q=q, mem=m, d=d.text or "")}]
             for q, m, d in zip(questions, mems, drafts)]
    use_c = [[{"role": "user", "content": ISUSE_Q.format(q=q, d=d.text or "")}]
             for q, d in zip(questions, drafts)]
    # One batched decision pass for all three tokens of every question.
    n = len(questions)
    dec = classify(backend, rel_c, ISREL) + classify(backend, sup_c, ISSUP) + \
        classify(backend, use_c, ISUSE)
    rel, sup, use = dec[:n], dec[n:2 * n], dec[2 * n:]
    regen = [i for i in range(n) if rel[i]["label"] == "Irrelevant" or sup[i]["label"] == "No support"]
    regen_c = [chat(questions[i]) for i in regen]  # exactly B1's prompt: B1's answer for the record
    regen_g = dict(zip(regen, _generate(backend, regen_c, [seeds[i] for i in regen])))
    regen_p = dict(zip(regen, regen_c))
    out = []
    for i, d in enumerate(drafts):
        final = regen_g.get(i, d)
        prompts = [drafts_c[i], rel_c[i], sup_c[i], use_c[i]] + ([regen_p[i]] if i in regen_g else [])
        undecided = rel[i]["label"] is None and sup[i]["label"] is None
        outcome = "regenerated" if i in regen_g else "unparsed" if undecided else "kept"
        use_lab = use[i]["label"]
        extra = {"isrel": rel[i]["label"], "issup": sup[i]["label"],
                 "isuse": int(use_lab) if use_lab else None,
                 "regenerated": i in regen_g, "unparsed": undecided, "outcome": outcome,
                 "methods": {"isrel": rel[i]["method"], "issup": sup[i]["method"],
                             "isuse": use[i]["method"]},
                 "method": _worst([rel[i]["method"], sup[i]["method"], use[i]["method"]]),
                 "scores": {"isrel": rel[i]["scores"], "issup": sup[i]["scores"],
                            "isuse": use[i]["scores"]}}
        failed = d.failed or final.failed or any(x[i]["failed"] for x in (rel, sup, use))
        error = final.error or d.error or next((x[i]["error"] for x in (rel, sup, use) if x[i]["error"]), "")
        out.append(_res(final, prompts, len(prompts), extra, failed=failed, error=error,
                        tokens=d.n_tokens + (final.n_tokens if i in regen_g else 0)))
    return out
