"""AdaRAGUE's adaptive-retrieval protocol with a field-sized reader's answers, replayed offline.

AdaRAGUE (Moskvoretskii et al., ACL 2025) scores retrieval gates by the answers a reader gives with and
without retrieval. Its files hold Llama-3.1-8B-Instruct's answers to the same questions with no
retrieval, one retrieval and IRCoT, and for HotpotQA and 2Wiki test the passages retrieved for them; a
gate that decides from (question, passages) can therefore be scored without running the reader.

MDL's actions become answers: Active and Supp take the with-retrieval answer, Silent the no-retrieval
answer, Opt-Out abstains (no answer: wrong for In-Accuracy, outside the coverage). "MDL, never abstain"
answers Opt-Out's questions without retrieval, for a comparison on AdaRAGUE's own terms (every question
answered).

Which answers go with the passages. The retrieved passages were recovered from the authors' static-RAG
prompts, and they go with the data set's CSV ``rag_one_retrieve`` answers, not with the ``oner`` run's
(whose own passages are lost): the with-retrieval answer here is ``meta["csv_rag_one_retrieve"]``
(``WITH_PASSAGES``), and the ``oner`` answers are reported as their own row. Correctness is the report's
Acc (``datasets.acc``: a normalised gold answer occurs in the answer).

The gates, on the same questions and the same answers (paired):

  never / always retrieve     the no-retrieval / with-retrieval answer, 0 / 1 retrieval calls
  IRCoT                       its own answer, its number of steps as calls
  one retrieval (oner)        the oner run's answer, 1 call (its passages are not these)
  oracle                      retrieve iff the no-retrieval answer is wrong and the with-retrieval right
  Adaptive-RAG classifier     its choice: A no retrieval, B one (the with-retrieval answer), C IRCoT
  When-to-Retrieve            retrieve iff its verbalised flag says "uncertain"
  SeaKR                       its own final answer and retrieval calls (multi-hop run)
  similarity (top-1)          retrieve iff the best passage's cosine M ≥ τ
  MDL (paper defaults), MDL + answer detector, MDL calibrated, and each never abstaining

τ and the calibrated config are fitted by two-fold cross-fitting over questions (each half's fit is
applied to the other half), so no question is decided by a fit that saw it. The fitting label is
"retrieval does not hurt": the with-retrieval answer is right or the no-retrieval answer is wrong.
Where a half has fewer than ``MIN_CALIBRATION`` questions or one label, there is nothing to fit: the
fitted gate is left out (it is not replaced by a constant rule or the defaults under its name).

Missing fields. What the loader leaves None has one meaning here: no ``memories`` is no passages; a
gate whose inputs are None on some question (the classifier's option, When-to-Retrieve's flag, SeaKR's
scores: they exist on the test split only) is not replayed on that data set; no classifier
probabilities means that gate has no score (no ROC-AUC); no IRCoT step count is 0 calls. A recorded
answer, the gold answers, the question's group, or a field inside SeaKR's scores being None is a
damaged record, not an absent gate: a ValueError names the item (its qid) and the field.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mdl_jax.controller.api import decide
from mdl_jax.controller.calibration import calibrate
from mdl_jax.controller.config import MDLConfig
from mdl_jax.evaluation import metrics
from mdl_jax.evaluation.datasets.adarague import AdaRAGUEItem, acc
from mdl_jax.evaluation.scoring import (
    ACTIVE,
    MIN_CALIBRATION,
    OPT_OUT,
    calibration_split,
    check_inputs,
    fit_threshold,
)

WITH_PASSAGES = "csv_rag_one_retrieve"
SUPP = 1  # Action.SUPP


@dataclass(frozen=True)
class Policy:
    """One gate's answers: ``correct`` (N,) 0/1 of the answer it gives (0 where it abstains),
    ``answered`` (N,) bool, ``calls`` (N,) retrieval calls, ``retrieve_score`` (N,) higher = retrieve
    (None where the gate has no score)."""

    name: str
    correct: np.ndarray
    answered: np.ndarray
    calls: np.ndarray
    retrieve_score: np.ndarray | None


@dataclass(frozen=True)
class Replay:
    """One data set's questions: the answers' correctness, the oracle label, every gate."""

    dataset: str
    group: np.ndarray
    correct_without: np.ndarray
    correct_with: np.ndarray
    policies: tuple[Policy, ...]


def _policy_from_actions(name: str, action: np.ndarray, c_final: np.ndarray, cw: np.ndarray,
                         cwo: np.ndarray, abstain: bool = True) -> Policy:
    retrieve = (action == ACTIVE) | (action == SUPP)
    out = action == OPT_OUT
    answered = ~out if abstain else np.ones_like(out)
    correct = np.where(retrieve, cw, cwo) * answered
    return Policy(name, correct.astype(float), answered, retrieve.astype(float), np.asarray(c_final, float))


def _damaged(i: int, it: AdaRAGUEItem, field: str, expected: str, v: object) -> ValueError:
    return ValueError(f"items[{i}] (qid {it.qid!r}): {field}: expected {expected}, got {v!r}"[:300])


def _number(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _check_item(i: int, it: AdaRAGUEItem, with_passages: bool) -> None:
    """A ValueError naming the item and the field for every field the replay reads that is damaged."""
    if not isinstance(it.group, str):
        raise _damaged(i, it, "group", "the question's id (a string)", it.group)
    if not isinstance(it.answers, (tuple, list)) or not all(isinstance(g, str) for g in it.answers):
        raise _damaged(i, it, "answers", "the gold answers (a sequence of strings)", it.answers)
    for field in ("answer_no_retrieval", "answer_one_retrieval", "answer_multi_retrieval"):
        if not isinstance(getattr(it, field), str):
            raise _damaged(i, it, field, "the reader's recorded answer (a string)", getattr(it, field))
    if with_passages and not isinstance(it.meta[WITH_PASSAGES], str):
        raise _damaged(i, it, f"meta[{WITH_PASSAGES!r}]", "the with-passages answer (a string)",
                       it.meta[WITH_PASSAGES])
    probas = it.classifier_probas
    if probas is not None and not (isinstance(probas, (tuple, list)) and len(probas) == 3
                                   and all(_number(x) for x in probas)):
        raise _damaged(i, it, "classifier_probas", "three probabilities, or None", probas)
    if it.ircot_steps is not None and not _number(it.ircot_steps):
        raise _damaged(i, it, "ircot_steps", "a number of steps, or None", it.ircot_steps)
    if it.seakr is not None and "final_answer" in it.seakr:
        if not isinstance(it.seakr["final_answer"], str):
            raise _damaged(i, it, "seakr['final_answer']", "SeaKR's answer (a string)", it.seakr["final_answer"])
        calls = it.seakr.get("retrieval_times", 0)
        if not _number(calls):
            raise _damaged(i, it, "seakr['retrieval_times']", "a number of retrieval calls", calls)


def replay(dataset: str, items: Sequence[AdaRAGUEItem], cols: Mapping[str, np.ndarray] | None, *,
           config: MDLConfig | None = None) -> Replay:
    """Every gate of the module docstring on one AdaRAGUE data set.

    Where the questions carry no passages (NQ, SQuAD, TriviaQA, MuSiQue), MDL and the similarity rule
    have nothing to decide from: only the reader-side gates are replayed, and "always retrieve" is the
    ``oner`` run.

    Args:
      dataset: the data set's name (``"hotpotqa_test"``, ...).
      items: its questions (``load_benchmark("adarague_llama8b", split=dataset)``).
      cols: ``scoring.signal_columns`` of the same items (MDL's signals from question and passages), or
        None where they carry no passages.
      config: the MDL config the signals were decided with (paper defaults when None).

    Raises:
      TypeError: ``items`` not a sequence of ``AdaRAGUEItem``, ``cols`` not a mapping.
      ValueError: no items, a qid twice; ``cols`` given for items without passages or without the with-passages answer (naming
        the first), or missing for items with them; ``cols`` without a column the replay reads, one not of
        one value per item, not finite, or an action that is none of MDL's; an item with a damaged field
        (module docstring: Missing fields), naming its qid and the field.
    """
    check_inputs(items, None, (), AdaRAGUEItem)
    cfg = config or MDLConfig()
    with_passages = cols is not None
    for i, it in enumerate(items):
        if with_passages and (not it.memories or WITH_PASSAGES not in (it.meta or {})):
            raise ValueError(f"items: {it.qid} has no passages or no {WITH_PASSAGES!r} answer; MDL's replay "
                             "needs both (HotpotQA and 2Wiki test)")
        if not with_passages and it.memories:
            raise ValueError(f"cols: expected the signal columns of {dataset}'s passages, got None")
        _check_item(i, it, with_passages)
    n = len(items)
    check_inputs(items, cols, ("M", "R", "action", "action_either", "C_final", "C_final_either"), AdaRAGUEItem)
    golds = [it.answers for it in items]
    cwo = np.array([acc(it.answer_no_retrieval, g) for it, g in zip(items, golds)], float)
    with_key = (lambda it: str(it.meta[WITH_PASSAGES])) if with_passages else (lambda it: it.answer_one_retrieval)
    cw = np.array([acc(with_key(it), g) for it, g in zip(items, golds)], float)
    cmulti = np.array([acc(it.answer_multi_retrieval, g) for it, g in zip(items, golds)], float)
    cone = np.array([acc(it.answer_one_retrieval, g) for it, g in zip(items, golds)], float)
    steps = np.array([float(it.ircot_steps or 0) for it in items])
    ones, zeros, yes = np.ones(n), np.zeros(n), np.ones(n, bool)
    pol = [
        Policy("never retrieve", cwo, yes, zeros, None),
        Policy("always retrieve", cw, yes, ones, None),
        Policy("IRCoT", cmulti, yes, steps, None),
    ]
    if with_passages:
        pol.insert(2, Policy("one retrieval (oner run)", cone, yes, ones, None))
    helps = (cwo == 0) & (cw == 1)
    pol.append(Policy("oracle", np.maximum(cw, cwo), yes, helps.astype(float), helps.astype(float)))
    opt = [it.classifier_option for it in items]
    if all(o in ("A", "B", "C") for o in opt):
        o = np.array(opt)
        p_a = np.array([it.classifier_probas[0] if it.classifier_probas else np.nan for it in items])
        pol.append(Policy("Adaptive-RAG classifier", np.select([o == "A", o == "B"], [cwo, cw], cmulti), yes,
                          np.select([o == "A", o == "B"], [zeros, ones], steps),
                          None if np.isnan(p_a).any() else 1.0 - p_a))
    giveup = [it.wtr_giveup for it in items]
    if all(isinstance(g, bool) for g in giveup):
        r = np.array(giveup, bool)
        pol.append(Policy("When-to-Retrieve flag", np.where(r, cw, cwo), yes, r.astype(float), r.astype(float)))
    seakr = [it.seakr for it in items if it.seakr is not None and "final_answer" in it.seakr]
    if len(seakr) == len(items):
        pol.append(Policy("SeaKR (own answers)",
                          np.array([acc(str(s["final_answer"]), g) for s, g in zip(seakr, golds)], float), yes,
                          np.array([float(s.get("retrieval_times", 0)) for s in seakr]), None))

    groups = np.array([it.group for it in items])
    if cols is None:  # no passages: the reader-side gates only
        return Replay(dataset, groups, cwo, cw, tuple(pol))
    fold = calibration_split(groups, share=0.5, salt=dataset)
    fit_label = (cw == 1) | (cwo == 0)  # retrieval does not hurt
    M = np.asarray(cols["M"], np.float32)
    R = np.asarray(cols["R"], np.float32)
    A = np.full(n, 0.5, np.float32)

    def cross_fit_threshold(score: np.ndarray) -> np.ndarray | None:
        retrieve = np.zeros(n, bool)
        for train in (fold, ~fold):
            tau = fit_threshold(score[train], fit_label[train])
            if tau is None:  # too few rows or one label: no τ, so no policy (not "always retrieve")
                return None
            retrieve[~train] = score[~train] >= tau
        return retrieve

    r_sim = cross_fit_threshold(M.astype(float))
    if r_sim is not None:
        pol.append(Policy("similarity (top-1)", np.where(r_sim, cw, cwo), yes, r_sim.astype(float),
                          M.astype(float)))
    act, act_e = np.asarray(cols["action"]), np.asarray(cols["action_either"])
    mdl = [("MDL (paper defaults)", act, cols["C_final"]),
           ("MDL + answer detector", act_e, cols["C_final_either"])]
    cal_action = np.empty(n, np.int32)
    cal_c = np.empty(n, np.float32)
    for train in (fold, ~fold):
        y = fit_label[train]
        if not (~train).any():
            continue
        if len(y) < MIN_CALIBRATION or y.all() or not y.any():
            break  # a half too small or with one label: nothing to fit, so no calibrated policy
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fitted = calibrate(M[train], R[train], A[train], y, cfg).config
        d = decide(M[~train], R[~train], A[~train], fitted)
        cal_action[~train] = np.asarray(d.action)
        cal_c[~train] = np.asarray(d.C_final)
    else:
        mdl.append(("MDL calibrated", cal_action, cal_c))
    for name, a, c in mdl:
        pol.append(_policy_from_actions(name, a, c, cw, cwo))
        pol.append(_policy_from_actions(f"{name}, never abstain", a, c, cw, cwo, abstain=False))
    return Replay(dataset, groups, cwo, cw, tuple(pol))


REFERENCES = ("always retrieve", "MDL (paper defaults)")


def replay_table(r: Replay, *, n_boot: int = 1000, seed: int = 0) -> list[dict]:
    """AdaRAGUE's metrics for every gate with question-bootstrap 95% intervals, and each gate's paired
    In-Accuracy difference from always retrieving and from MDL with the paper's defaults.

    Returns:
      A list of {"dataset", "gate", "metric", "value", "lo", "hi", "n", "n_groups"[, "mde"]} rows.
    """
    rows: list[dict] = []
    g = r.group
    n, ng = len(g), len(set(g))

    def put(gate: str, metric: str, est, mde: float | None = None) -> None:
        row = {"dataset": r.dataset, "gate": gate, "metric": metric, "value": est.value, "lo": est.lo,
               "hi": est.hi, "n": n, "n_groups": ng}
        if mde is not None:
            row["mde"] = mde
        rows.append(row)

    def mean(column) -> float:
        return float(np.mean(column))

    by_name = {p.name: p for p in r.policies}
    for p in r.policies:
        put(p.name, "In-Accuracy", metrics.bootstrap(mean, p.correct, groups=g, n_boot=n_boot, seed=seed))
        put(p.name, "coverage", metrics.bootstrap(mean, p.answered.astype(float), groups=g, n_boot=n_boot,
                                                   seed=seed))
        put(p.name, "selective accuracy",
            metrics.bootstrap(metrics.selective_accuracy, p.correct, ~p.answered, groups=g, n_boot=n_boot,
                              seed=seed))
        put(p.name, "retrieval calls", metrics.bootstrap(metrics.retrieval_calls, p.calls, groups=g,
                                                          n_boot=n_boot, seed=seed))
        if p.retrieve_score is not None:
            put(p.name, "ROC-AUC (oracle: no-retrieval answer wrong)",
                metrics.bootstrap(lambda s, c: metrics.retrieval_auroc(s, c), p.retrieve_score, r.correct_without,
                                  groups=g, n_boot=n_boot, seed=seed))
        for ref in REFERENCES:
            if p.name != ref and ref in by_name:
                d = metrics.paired_difference(mean, (p.correct,), (by_name[ref].correct,), g,
                                              n_boot=n_boot, seed=seed)
                put(p.name, f"In-Accuracy − {ref}", d, d.mde)
    return rows
