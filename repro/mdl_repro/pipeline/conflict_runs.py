"""End to end on conflict data whose answers are short strings: B1 / B2 / B3 with a real reader, scored
by normalised containment of the gold and of the conflicting answer (no LLM judge).

The sets and their conflict condition (one memory set per question, built by ``load_benchmark``):
  rgb_en_fact  ``mixed``: the true snippets' first half, the answer-swapped versions of the rest, + noise;
  ramdocs      the questions whose documents hold both a correct document and misinformation
               (``has_conflict``: condition ``correct+misinfo`` or ``correct+misinfo+noise``);
  conflictnq   ``mixed`` (the real passage among five fabricated ones), only the questions whose real and
               fake short answers are both at most ``SHORT_WORDS`` words: the rest are sentences, which
               containment cannot score.

The systems (the project's prompts, ``mdl_jax.prompts``; greedy decoding):
  B1  the question alone;
  B2  every memory of the set injected;
  B3  ``MemoryGate`` (the paper's Table 2 settings, the constant task risk 0.5 the gate scoring uses for
      benchmarks without a domain risk) decides: Active injects as B2, Supp injects with the caution,
      Silent sends B1's prompt, Opt-Out abstains without a call. Where B3's prompt is B2's or B1's, the
      answer is that one's (greedy decoding gives the same text; the record says ``reused``).

Scoring of one answer (``score_answer``), on SQuAD-normalised text (``normalize_answer``):
  correct        a gold answer is contained in the answer;
  exact          the answer equals a gold answer;
  adopted_wrong  a conflicting (wrong) answer is contained in the answer;
  abstained      an Opt-Out, or an answer that says it does not know.

Records are appended chunk by chunk through ``RecordWriter`` (one JSON line per (dataset, qid, seed,
system), ``records.jsonl``); ``run.json`` holds the fingerprint of every input (the items, the gate's
actions, the prompts, the reader and the settings). A rerun skips the rows already recorded and refuses
to continue a folder whose inputs have changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from mdl_jax.controller.decision import Action
from mdl_jax.evaluation.datasets import BenchmarkItem, load_benchmark, mentions_answer, normalize_answer
from mdl_jax.prompts import ABSTENTION, CAUTION, SYSTEM_PROMPT, chat

SETS = ("rgb_en_fact", "ramdocs", "conflictnq")
SYSTEMS = ("B1", "B2", "B3")
SHORT_WORDS = 4
RISK = 0.5
SEED = 0
RECORDS = "records.jsonl"
RUN = "run.json"
_IDK = ("i dont know", "i do not know", "im not sure", "i am not sure", "cannot be determined")


@dataclasses.dataclass(frozen=True)
class ConflictRunConfig:
    """What a run reads and how it generates.

    Attributes:
        sets: the benchmark names, a subset of ``SETS``.
        per_set: questions per set (the first ones of the file that have the set's conflict condition).
        model: the reader (a ``LlamaCppBackend`` model name or a .gguf path).
        max_new_tokens: the cap on each answer.
        chunk: questions per generation call (their prompts share one continuous batch).
    """

    sets: tuple[str, ...] = SETS
    per_set: int = 40
    model: str = "bundled:qwen2.5-coder-1.5b"
    max_new_tokens: int = 48
    chunk: int = 4

    def __post_init__(self):
        if isinstance(self.sets, str) or not self.sets or any(s not in SETS for s in self.sets):
            raise ValueError(f"sets: expected a non-empty subset of {SETS}, got {self.sets!r}")
        for name in ("per_set", "max_new_tokens", "chunk"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model: expected a model name or .gguf path, got {self.model!r}")


def _short(texts: Sequence[str]) -> bool:
    return bool(texts) and all(0 < len(normalize_answer(t).split()) <= SHORT_WORDS for t in texts)


def conflict_items(name: str, n: int, *, path=None) -> list[BenchmarkItem]:
    """The first ``n`` questions of benchmark ``name`` in its conflict condition (see the module docstring).

    Args:
        name: one of ``SETS``.
        n: how many questions (fewer when the set has fewer).
        path: the benchmark's folder (default: the shared copy, as ``load_benchmark``).

    Returns:
        one item per question, in file order.

    Raises:
        ValueError: ``name`` is not one of ``SETS``.
    """
    if name not in SETS:
        raise ValueError(f"name: expected one of {SETS}, got {name!r}")
    items = load_benchmark(name, path=path)
    if name == "rgb_en_fact":
        keep = [i for i in items if i.condition == "mixed"]
    elif name == "ramdocs":
        keep = [i for i in items if i.has_conflict and i.wrong_answers]
    else:
        keep = [i for i in items if i.condition == "mixed" and _short(i.answers) and _short(i.wrong_answers)]
    return keep[:n]


def says_unknown(answer: str) -> bool:
    """Whether ``answer`` says it does not know (normalised text holds one of the stock phrases)."""
    t = normalize_answer(answer)
    return any(p in t for p in _IDK)


def score_answer(answer: str | None, answers: Sequence[str], wrong: Sequence[str], *,
                 opted_out: bool = False) -> dict:
    """The scores of one answer.

    Args:
        answer: the reader's text (None: the call failed; scored as wrong, not abstained).
        answers: the gold answers.
        wrong: the conflicting answers.
        opted_out: B3 abstained without a call (the answer is the abstention text).

    Returns:
        {"correct", "exact", "adopted_wrong", "abstained"}: booleans as in the module docstring.
    """
    if opted_out:
        return {"correct": False, "exact": False, "adopted_wrong": False, "abstained": True}
    a = answer or ""
    norm = normalize_answer(a)
    return {"correct": mentions_answer(a, answers),
            "exact": bool(norm) and any(norm == normalize_answer(g) for g in answers if g),
            "adopted_wrong": mentions_answer(a, wrong),
            "abstained": says_unknown(a)}


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def fingerprint(config: ConflictRunConfig, items: Sequence[BenchmarkItem], actions: Sequence[int],
                model_id: str) -> dict:
    """The digests a resumed run must match: settings, items, gate actions, prompts, reader."""
    return {
        "config": _sha(dataclasses.asdict(config)),
        "items": _sha([[i.dataset, i.qid, i.question, list(i.memories), list(i.answers), list(i.wrong_answers)]
                       for i in items]),
        "actions": _sha([int(a) for a in actions]),
        "prompts": _sha([SYSTEM_PROMPT, CAUTION, ABSTENTION]),
        "reader": _sha(model_id),
    }


def check_resume(folder: Path, fp: dict) -> None:
    """Refuse a folder whose ``run.json`` was written for other inputs.

    Raises:
        ValueError: the stored fingerprint differs; the message names the inputs that changed.
    """
    p = Path(folder) / RUN
    if not p.is_file():
        return
    try:
        old = json.loads(p.read_text(encoding="utf-8")).get("fingerprint", {})
    except (OSError, ValueError, AttributeError):
        raise ValueError(f"{p}: not a run file this runner wrote; use a new output folder") from None
    changed = sorted(k for k in set(fp) | set(old) if fp.get(k) != old.get(k))
    if changed:
        raise ValueError(f"{folder}: its records were made with other inputs ({', '.join(changed)} changed); "
                         f"use a new output folder")


def gate_actions(items: Sequence[BenchmarkItem], gate=None) -> list[int]:
    """B3's action per item: ``MemoryGate`` (default settings, risk ``RISK``) on (question, memories)."""
    if gate is None:
        from mdl_jax.gate import MemoryGate

        gate = MemoryGate(risk=RISK)
    if not items:
        return []
    cols = gate.columns([i.question for i in items], [list(i.memories) for i in items],
                        risks=[RISK] * len(items))
    return [int(a) for a in cols["action"]]


def _plans(item: BenchmarkItem, action: int) -> dict[str, list | None]:
    """{system: chat or None (Opt-Out)} for one item."""
    b1, b2 = chat(item.question), chat(item.question, item.memories)
    a = Action(action)
    b3 = (None if a == Action.OPT_OUT else b2 if a == Action.ACTIVE
          else chat(item.question, item.memories, caution=True) if a == Action.SUPP else b1)
    return {"B1": b1, "B2": b2, "B3": b3}


def _key(c) -> str:
    return json.dumps(c, sort_keys=True, ensure_ascii=False)


def run_chunk(items: Sequence[BenchmarkItem], actions: Sequence[int], generate: Callable[[list], list],
              done: set) -> list[dict]:
    """The records of one chunk of items, each distinct prompt generated once.

    Args:
        items: the chunk's items.
        actions: B3's action per item.
        generate: ``chats -> texts`` (one text or None per chat).
        done: keys (dataset, qid, seed, system) already recorded: skipped.

    Returns:
        the new records.
    """
    todo: dict[str, list] = {}
    rows = []
    for it, a in zip(items, actions):
        plans = _plans(it, a)
        first_for: dict[str | None, str] = {}
        for system in SYSTEMS:
            if (it.dataset, it.qid, SEED, system) in done:
                continue
            c = plans[system]
            k = None if c is None else _key(c)
            if k is not None and c is not None:
                todo.setdefault(k, c)
            rows.append((it, a, system, k, first_for.get(k)))
            first_for.setdefault(k, system)
    keys = list(todo)
    texts = dict(zip(keys, generate([todo[k] for k in keys]))) if keys else {}
    out = []
    for it, a, system, k, reused in rows:
        answer = ABSTENTION if k is None else texts[k]
        rec = {"dataset": it.dataset, "qid": it.qid, "group": it.group, "seed": SEED, "system": system,
               "condition": it.condition, "action": Action(a).name if system == "B3" else None,
               "answer": answer, "failed": answer is None,
               "prompt_sha": None if k is None else hashlib.sha256(k.encode()).hexdigest()[:16],
               "reused": reused}
        rec.update(score_answer(answer, it.answers, it.wrong_answers, opted_out=k is None))
        out.append(rec)
    return out


def done_keys(folder: Path) -> set:
    """The (dataset, qid, seed, system) keys recorded in ``folder`` with an answer."""
    from mdl_repro.pipeline import records

    return {records.key(r) for _, r in records.read(Path(folder) / RECORDS) if not r.get("failed")}


def run(folder: str | Path, config: ConflictRunConfig, *, backend=None, gate=None, minutes: float | None = None,
        log: Callable[[str], None] = print) -> dict:
    """Run (or resume) the experiment into ``folder``.

    Args:
        folder: the output folder (``records.jsonl``, ``run.json``).
        config: the run's settings.
        backend: an object with ``generate(chats, seed=, max_new_tokens=, temperature=)`` and ``model_id``;
            default a ``LlamaCppBackend`` on ``config.model`` (greedy decoding, one thread; the Qwen file
            as it is, another GGUF with the engine's default weights).
        gate: a ``MemoryGate`` (default: ``MemoryGate(risk=RISK)``).
        minutes: stop after the chunk that passes this much wall time (None: run to the end).
        log: progress lines.

    Returns:
        {"records": rows in the file, "new": rows written by this call, "seconds", "tokens"}.

    Raises:
        ValueError: the folder holds a run of other inputs (``check_resume``).
    """
    from mdl_jax._io import write_text
    from mdl_repro.pipeline.records import RecordWriter

    folder = Path(folder)
    per_set = {s: conflict_items(s, config.per_set) for s in config.sets}
    items = [i for s in config.sets for i in per_set[s]]
    actions = gate_actions(items, gate)
    act = {i.qid: a for i, a in zip(items, actions)}
    if backend is None:
        from mdl_repro.pipeline.generation.llamacpp import LlamaCppBackend
        from mdl_repro.pipeline.generation.qwen import QWEN

        # one thread: on a shared two-core machine a second thread slowed decoding down; the Qwen file
        # runs as pinned (its digest is what was verified), other GGUFs as the engine's default
        backend = LlamaCppBackend(config.model, batch_size=config.chunk, threads=1,
                                  weights="file" if config.model == QWEN else "auto",
                                  max_new_tokens=config.max_new_tokens)
    fp = fingerprint(config, items, actions, backend.model_id)
    check_resume(folder, fp)
    info = {"fingerprint": fp, "config": dataclasses.asdict(config), "model_id": backend.model_id,
            "questions": {s: len(v) for s, v in per_set.items()},
            "actions": {s: _counts([Action(act[i.qid]).name for i in v]) for s, v in per_set.items()}}
    if (folder / RUN).is_file():  # a resumed run keeps the log of its earlier sessions
        info["sessions"] = json.loads((folder / RUN).read_text(encoding="utf-8")).get("sessions", [])
    write_text(folder / RUN, json.dumps(info, indent=1, sort_keys=True) + "\n")
    writer = RecordWriter(folder / RECORDS)
    done = done_keys(folder)

    def generate(chats):
        gens = backend.generate(chats, seed=SEED, max_new_tokens=config.max_new_tokens, temperature=0.0)
        return [None if g.failed else g.text for g in gens]

    # round robin over the sets, a chunk of each in turn, so a run stopped early covers all of them
    queues = {s: [v[j:j + config.chunk] for j in range(0, len(v), config.chunk)] for s, v in per_set.items()}
    t0, new = time.perf_counter(), 0
    tok0 = getattr(backend, "tokens_generated", 0)
    while any(queues.values()):
        for s in config.sets:
            if not queues[s]:
                continue
            chunk = queues[s].pop(0)
            if all((i.dataset, i.qid, SEED, sy) in done for i in chunk for sy in SYSTEMS):
                continue
            recs = run_chunk(chunk, [act[i.qid] for i in chunk], generate, done)
            writer.append(recs)
            done |= {(r["dataset"], r["qid"], r["seed"], r["system"]) for r in recs if not r["failed"]}
            new += len(recs)
            el = time.perf_counter() - t0
            log(f"{s}: +{len(recs)} records ({new} new, {el / 60:.1f} min)")
            if minutes is not None and el > minutes * 60:
                return _summary(folder, new, el, backend, tok0)
    return _summary(folder, new, time.perf_counter() - t0, backend, tok0)


def _counts(xs) -> dict:
    out: dict = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


def _summary(folder, new, seconds, backend, tok0) -> dict:
    return {"records": len(done_keys(folder)), "new": new, "seconds": seconds,
            "tokens": getattr(backend, "tokens_generated", 0) - tok0}


# ------------------------------------------------------------------------------------------------ report

def _mean(x) -> float:
    import numpy as np

    return float(np.mean(x))


def load_table(folder: str | Path) -> dict:
    """{dataset: {system: {qid: record}}} of the answered records in ``folder`` (first per key)."""
    from mdl_repro.pipeline import records

    out: dict = {}
    for _, r in records.read(Path(folder) / RECORDS):
        if r.get("failed"):
            continue
        out.setdefault(r["dataset"], {}).setdefault(r["system"], {}).setdefault(r["qid"], r)
    return out


def summarise(folder: str | Path, *, n_boot: int = 2000) -> dict:
    """Per set, on the questions every system answered: each system's rates with intervals and the
    paired differences B3 − B2 and B3 − B1 (``paired_difference``, a bootstrap over questions).

    Returns:
        {dataset: {"n": questions, "rates": {system: {metric: Estimate}}, "diffs": {(a, b, metric):
        Difference}, "actions": {action: count}}}.
    """
    import numpy as np

    from mdl_jax.evaluation.metrics import bootstrap, paired_difference

    table = load_table(folder)
    out = {}
    for ds, by in table.items():
        qids = sorted(set.intersection(*(set(by.get(s, {})) for s in SYSTEMS)))
        if len(qids) < 2:
            continue
        groups = np.array([by["B1"][q]["group"] for q in qids])
        col = {(s, m): np.array([float(by[s][q][m]) for q in qids])
               for s in SYSTEMS for m in ("correct", "adopted_wrong", "abstained", "exact")}
        rates = {s: {m: bootstrap(_mean, col[(s, m)], groups=groups, n_boot=n_boot)
                     for m in ("correct", "adopted_wrong", "abstained", "exact")} for s in SYSTEMS}
        diffs = {(a, b, m): paired_difference(_mean, col[(a, m)], col[(b, m)], groups, n_boot=n_boot)
                 for a, b in (("B3", "B2"), ("B3", "B1"), ("B2", "B1")) for m in ("correct", "adopted_wrong")}
        out[ds] = {"n": len(qids), "rates": rates, "diffs": diffs,
                   "actions": _counts(by["B3"][q]["action"] for q in qids)}
    return out


def _ci(e) -> str:
    return f"{e.value:.3f} [{e.lo:.3f}, {e.hi:.3f}]"


def resolves(d) -> bool:
    """Whether a difference's interval excludes 0."""
    return bool(d.lo > 0 or d.hi < 0)


def report_markdown(summary: dict, title: str, preamble: Sequence[str] = ()) -> str:
    """The summary as Markdown: ``preamble`` lines, then per set the rates table and the paired differences."""
    lines = [f"# {title}", "", *preamble, ""]
    for ds, s in summary.items():
        acts = ", ".join(f"{k} {v}" for k, v in s["actions"].items())
        lines += [f"## {ds} ({s['n']} questions; B3 actions: {acts})", "",
                  "| system | correct | exact | adopted wrong | abstained |", "|---|---|---|---|---|"]
        for sy in SYSTEMS:
            r = s["rates"][sy]
            lines.append(f"| {sy} | {_ci(r['correct'])} | {_ci(r['exact'])} | {_ci(r['adopted_wrong'])} | "
                         f"{_ci(r['abstained'])} |")
        lines += ["", "| difference | metric | value [95% interval] | MDE | resolves |", "|---|---|---|---|---|"]
        for (a, b, m), d in s["diffs"].items():
            lines.append(f"| {a} − {b} | {m} | {d.value:+.3f} [{d.lo:+.3f}, {d.hi:+.3f}] | {d.mde:.3f} | "
                         f"{'yes' if resolves(d) else 'no'} |")
        lines.append("")
    return "\n".join(lines)
