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
  SelfRAG draft with memories, then one reflection call emitting ISREL / ISSUP / ISUSE; an
       Irrelevant or unsupported ("No support") draft is regenerated from parametric knowledge.
       A reflection that cannot be parsed keeps the draft (counted in the record's ``extra``).
Each function takes a chunk of questions and returns, per question, the answer, the number of LLM
calls, every prompt sent (for the record's prompt hash) and extras.
"""

from __future__ import annotations

import re
from typing import Sequence

from mdl_jax.controller.decision import Action

SYSTEM_PROMPT = ("You are a helpful assistant. Answer the question truthfully and concisely, "
                 "in one or two sentences.")
CAUTION = ("Caution: these memories may be unreliable or contradict each other. Use a memory only if "
           "you are confident it is correct; if you are not sure, say \"I don't know\".")
ABSTENTION = ("I don't know. (The memory decision layer abstained: the retrieved memories are not "
              "trustworthy enough for this question.)")
SYSTEMS = ("B1", "B2", "B3", "CRAG", "SelfRAG")


def chat(question: str, memories: Sequence[str] = (), caution: bool = False) -> list[dict]:
    if memories:
        mem = "\n".join(f"- {m}" for m in memories)
        user = f"Memories:\n{mem}\n\n" + (CAUTION + "\n\n" if caution else "") + \
            f"Question: {question}\nAnswer:"
    else:
        user = f"Question: {question}\nAnswer:"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def _generate(backend, chats, seed, **kw):
    return backend.generate(chats, seed=seed, **kw) if chats else []


def run_plain(backend, questions, stores, *, inject: bool, seed: int):
    chats = [chat(q, s.texts if inject else ()) for q, s in zip(questions, stores)]
    gens = _generate(backend, chats, seed)
    return [dict(answer=g.text, failed=g.failed, error=g.error, llm_calls=1, prompts=[c],
                 tokens=g.n_tokens, extra={}) for g, c in zip(gens, chats)]


def run_mdl(backend, questions, stores, actions: Sequence[int], *, seed: int):
    todo, chats = [], []
    for i, (q, s, a) in enumerate(zip(questions, stores, actions)):
        a = Action(int(a))
        if a == Action.OPT_OUT:
            continue
        todo.append(i)
        chats.append(chat(q, s.texts if a in (Action.ACTIVE, Action.SUPP) else (),
                          caution=a == Action.SUPP))
    gens = dict(zip(todo, _generate(backend, chats, seed)))
    prompts = dict(zip(todo, chats))
    out = []
    for i in range(len(questions)):
        if i not in gens:
            out.append(dict(answer=ABSTENTION, failed=False, error="", llm_calls=0, prompts=[],
                            tokens=0, extra={}))
        else:
            g = gens[i]
            out.append(dict(answer=g.text, failed=g.failed, error=g.error, llm_calls=1,
                            prompts=[prompts[i]], tokens=g.n_tokens, extra={}))
    return out


CRAG_EVAL = ("Question: {q}\nRetrieved document: {m}\n\nIs this document correct and relevant for "
             "answering the question? Reply with exactly one word: Correct, Incorrect, or Ambiguous.")
_GRADE = re.compile(r"\b(correct|incorrect|ambiguous)\b", re.IGNORECASE)


def parse_grade(text: str | None) -> str:
    """First grade word in the evaluator's reply; anything else counts as Ambiguous."""
    m = _GRADE.search(text or "")
    return m.group(1).capitalize() if m else "Ambiguous"


def run_crag(backend, questions, stores, *, seed: int):
    evals, owner = [], []
    for i, (q, s) in enumerate(zip(questions, stores)):
        for m in s.texts:
            evals.append([{"role": "user", "content": CRAG_EVAL.format(q=q, m=m)}])
            owner.append(i)
    grades_raw = _generate(backend, evals, seed, max_new_tokens=8)
    grades: list[list[str]] = [[] for _ in questions]
    eval_prompts: list[list] = [[] for _ in questions]
    failed = [False] * len(questions)
    for i, g, p in zip(owner, grades_raw, evals):
        grades[i].append(parse_grade(g.text))
        eval_prompts[i].append(p)
        failed[i] |= g.failed
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
    gens = _generate(backend, chats, seed + 1)
    return [dict(answer=g.text, failed=g.failed or f, error=g.error, llm_calls=len(gs) + 1,
                 prompts=ep + [c], tokens=g.n_tokens, extra={"verdict": v, "grades": gs})
            for g, f, gs, ep, c, v in zip(gens, failed, grades, eval_prompts, chats, verdicts)]


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


def run_selfrag(backend, questions, stores, *, seed: int):
    drafts_c = [chat(q, s.texts) for q, s in zip(questions, stores)]
    drafts = _generate(backend, drafts_c, seed)
    reflect_c = [[{"role": "user", "content": SELFRAG_REFLECT.format(
        q=q, mem="\n".join(f"- {m}" for m in s.texts), d=d.text or "")}]
        for q, s, d in zip(questions, stores, drafts)]
    refl = _generate(backend, reflect_c, seed + 1, max_new_tokens=40)
    parsed = [parse_reflection(r.text) for r in refl]
    regen = [i for i, p in enumerate(parsed)
             if p["isrel"] == "Irrelevant" or p["issup"] == "No support"]
    regen_c = [chat(questions[i]) for i in regen]
    regen_g = dict(zip(regen, _generate(backend, regen_c, seed + 2)))
    regen_p = dict(zip(regen, regen_c))
    out = []
    for i, (d, r, p) in enumerate(zip(drafts, refl, parsed)):
        final = regen_g.get(i, d)
        prompts = [drafts_c[i], reflect_c[i]] + ([regen_p[i]] if i in regen_g else [])
        extra = {**p, "regenerated": i in regen_g,
                 "unparsed": p["isrel"] is None and p["issup"] is None}
        out.append(dict(answer=final.text, failed=d.failed or r.failed or final.failed,
                        error=final.error or d.error or r.error, llm_calls=len(prompts),
                        prompts=prompts, tokens=d.n_tokens + r.n_tokens + (
                            final.n_tokens if i in regen_g else 0), extra=extra))
    return out
