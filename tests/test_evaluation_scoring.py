"""Reader-free scoring of gates on benchmark memory sets, AdaRAGUE's replay, and the benchmark run:
hand-computed cases on synthetic items, a user's own column in the tables, and one small real run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from mdl_jax.controller.decision import Action
from mdl_jax.evaluation.datasets.adarague import AdaRAGUEItem
from mdl_jax.evaluation.datasets.items import BenchmarkItem
from mdl_jax.evaluation.replay import replay, replay_table
from mdl_jax.evaluation.scoring import calibration_split, fit_threshold, metric_table, score_gates

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks"


def _items(n: int, adopt) -> list[BenchmarkItem]:
    return [BenchmarkItem("toy", f"q{i}:c", f"q{i}", f"question {i}?", (f"memory {i}",), "c",
                          should_adopt=bool(adopt[i])) for i in range(n)]


def _cols(M, R, action, c_final) -> dict[str, np.ndarray]:
    n = len(M)
    return {"M": np.asarray(M, np.float32), "R": np.asarray(R, np.float32), "phi": np.zeros(n, np.float32),
            "C_final": np.asarray(c_final, np.float32), "action": np.asarray(action, np.int32),
            "M_either": np.asarray(M, np.float32), "R_either": np.asarray(R, np.float32),
            "phi_either": np.zeros(n, np.float32), "C_final_either": np.asarray(c_final, np.float32),
            "action_either": np.asarray(action, np.int32)}


def test_fit_threshold_maximises_agreement_by_hand():
    # scores 0.1 .. 0.6, adopt where score ≥ 0.35 except one: the cut at 0.4 gets 5 of 6 right, as does
    # the cut at 0.3 (the 0.3 reject is then wrong); ties go to the median candidate (0.3: lower median).
    s = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    y = np.array([0, 0, 0, 1, 1, 0])
    assert fit_threshold(s, y) == 0.4
    assert fit_threshold(s, np.ones(6)) is None  # one label only: nothing to fit
    assert fit_threshold(s[:3], y[:3]) is None  # too few rows


def test_fit_threshold_reads_its_labels_before_it_checks_its_scores():
    # the order of its checks when both arguments are wrong: labels that cannot be read fail first, as
    # before the finite-score check was shared with score_gates (which moved it ahead of the labels)
    with pytest.raises(ValueError) as e:
        fit_threshold([np.nan, 0.5, 0.6, 0.7], [[1, 0], [1], 0, 1])
    assert "adopt_score" not in str(e.value)
    with pytest.raises(ValueError, match="adopt_score: expected finite scores, got a NaN or infinity at index 0"):
        fit_threshold([np.nan, 0.5, 0.6, 0.7], [1, 0, 0, 1])


def test_the_calibration_split_is_by_question_deterministic_and_near_its_share():
    groups = [f"g{i // 3}" for i in range(3000)]  # three rows per question
    a = calibration_split(groups, salt="x")
    assert (a == calibration_split(groups, salt="x")).all()
    per_q = a.reshape(-1, 3)
    assert (per_q.all(axis=1) | ~per_q.any(axis=1)).all(), "a question's rows must fall on one side"
    assert 0.25 < a.mean() < 0.35
    assert (a != calibration_split(groups, salt="y")).any()
    with pytest.raises(ValueError, match="share"):
        calibration_split(groups, share=1.0)


def test_score_gates_on_known_labels_and_a_users_own_column_in_the_same_table():
    rng = np.random.default_rng(0)
    n = 400
    adopt = rng.uniform(size=n) < 0.5
    M = np.where(adopt, rng.uniform(0.5, 1, n), rng.uniform(0, 0.6, n))
    c_final = M.copy()
    action = np.where(c_final >= 0.6, int(Action.ACTIVE), int(Action.SILENT))
    items = _items(n, adopt)
    mine = np.where(adopt, 0.0, 1.0) + rng.normal(0, 0.1, n)  # a user's "do not adopt" score
    s = score_gates("toy", items, _cols(M, np.full(n, 0.5), action, c_final), extra={"my gate": mine},
                    fit_mdl=False)
    rows = metric_table(s, n_boot=100)
    by = {(r["gate"], r["metric"]): r for r in rows}
    ev = ~s.calibration
    assert by[("oracle", "decision accuracy")]["value"] == 1.0
    assert by[("always adopt", "decision accuracy")]["value"] == pytest.approx(adopt[ev].mean())
    assert by[("never adopt", "withheld")]["value"] == 1.0
    want = np.mean((action[ev] != int(Action.ACTIVE)) == ~adopt[ev])
    assert by[("MDL (paper defaults)", "decision accuracy")]["value"] == pytest.approx(want)
    assert by[("my gate", "AUROC")]["value"] > 0.95  # the user's column, scored beside MDL's
    assert ("my gate", "accuracy − MDL (paper defaults)") in by
    r = by[("similarity (top-1)", "AUROC")]
    assert r["lo"] <= r["value"] <= r["hi"] and r["n"] == ev.sum()
    with pytest.raises(ValueError, match="my gate"):
        score_gates("toy", items, _cols(M, np.full(n, 0.5), action, c_final), extra={"my gate": mine[:3]})


def test_two_readings_of_one_data_set_given_one_split_salt_evaluate_the_same_questions():
    rng = np.random.default_rng(1)
    n = 300
    adopt = rng.uniform(size=n) < 0.5
    M = rng.uniform(size=n)
    cols = _cols(M, np.full(n, 0.5), np.full(n, int(Action.ACTIVE)), M)
    a = score_gates("reading a", _items(n, adopt), cols, fit_mdl=False, split_salt="the data set")
    b = score_gates("reading b", _items(n, adopt), cols, fit_mdl=False, split_salt="the data set")
    assert (a.calibration == b.calibration).all() and a.dataset == "reading a"
    assert (a.calibration == calibration_split([it.group for it in _items(n, adopt)], salt="the data set")).all()
    assert (score_gates("reading a", _items(n, adopt), cols, fit_mdl=False).calibration != a.calibration).any()


def test_a_gate_without_a_fitted_threshold_has_no_decision_rows_not_a_constant_ones():
    # every calibration row says "adopt": no τ can be fitted, so the threshold gates (similarity, R alone,
    # a user's column) keep their ranking metrics and have no decision, instead of "always adopt"'s numbers
    n = 300
    cal = calibration_split(np.array([f"q{i}" for i in range(n)]), salt="toy")
    rng = np.random.default_rng(1)
    adopt = np.where(cal, True, rng.uniform(size=n) < 0.5)
    M = np.where(adopt, rng.uniform(0.5, 1, n), rng.uniform(0, 0.6, n))
    action = np.full(n, int(Action.SILENT))
    s = score_gates("toy", _items(n, adopt), _cols(M, np.full(n, 0.5), action, M), extra={"mine": -M},
                    fit_mdl=False)
    assert {g.name: g.fitted.get("tau", 0) for g in s.gates if "tau" in g.fitted} == {
        "similarity (top-1)": None, "R alone": None, "memory count": None, "mine": None}
    by = {(r["gate"], r["metric"]): r for r in metric_table(s, n_boot=50)}
    for gate in ("similarity (top-1)", "R alone", "mine"):
        assert (gate, "AUROC") in by
        for metric in ("decision accuracy", "withheld", "accuracy − MDL (paper defaults)"):
            assert (gate, metric) not in by, (gate, metric)
    assert ("always adopt", "decision accuracy") in by


def test_the_replay_leaves_out_a_fitted_gate_with_too_few_questions_to_fit():
    items, cols = _toy_replay_inputs()   # four questions: two per half, below the fitting minimum
    names = {p.name for p in replay("toy_test", items, cols).policies}
    assert "MDL (paper defaults)" in names
    assert not names & {"similarity (top-1)", "MDL calibrated", "MDL calibrated, never abstain"}


def _ada(i: int, no: str, with_: str, gold: str = "paris") -> AdaRAGUEItem:
    return AdaRAGUEItem("adarague_llama8b", f"a{i}:passages", f"a{i}", f"q{i}", ("passage",), "passages",
                        (gold,), meta={"csv_rag_one_retrieve": with_}, answer_no_retrieval=no,
                        answer_one_retrieval=with_, answer_multi_retrieval=with_, ircot_steps=3)


def test_replay_maps_mdls_actions_to_the_recorded_answers_by_hand():
    # q0: Active → with-retrieval (right); q1: Silent → no-retrieval (right); q2: Opt-Out → abstains;
    # q3: Supp → with-retrieval (wrong).
    items = [_ada(0, "rome", "paris"), _ada(1, "paris", "rome"), _ada(2, "paris", "paris"),
             _ada(3, "paris", "rome")]
    acts = [Action.ACTIVE, Action.SILENT, Action.OPT_OUT, Action.SUPP]
    cols = _cols([0.9, 0.5, 0.1, 0.7], [0.5] * 4, [int(a) for a in acts], [0.9, 0.5, 0.1, 0.7])
    r = replay("toy_test", items, cols)
    p = {x.name: x for x in r.policies}
    mdl = p["MDL (paper defaults)"]
    assert mdl.correct.tolist() == [1, 1, 0, 0] and mdl.answered.tolist() == [True, True, False, True]
    assert mdl.calls.tolist() == [1, 0, 0, 1]
    assert p["MDL (paper defaults), never abstain"].correct.tolist() == [1, 1, 1, 0]
    assert p["never retrieve"].correct.tolist() == [0, 1, 1, 1]
    assert p["oracle"].correct.tolist() == [1, 1, 1, 1]
    rows = {(x["gate"], x["metric"]): x for x in replay_table(r, n_boot=50)}
    assert rows[("MDL (paper defaults)", "In-Accuracy")]["value"] == 0.5
    assert rows[("MDL (paper defaults)", "coverage")]["value"] == 0.75
    assert rows[("MDL (paper defaults)", "selective accuracy")]["value"] == pytest.approx(2 / 3)
    assert rows[("IRCoT", "retrieval calls")]["value"] == 3.0



def _toy_replay_inputs():
    items = [_ada(0, "rome", "paris"), _ada(1, "paris", "rome"), _ada(2, "paris", "paris"),
             _ada(3, "paris", "rome")]
    acts = [int(a) for a in (Action.ACTIVE, Action.SILENT, Action.OPT_OUT, Action.SUPP)]
    return items, _cols([0.9, 0.5, 0.1, 0.7], [0.5] * 4, acts, [0.9, 0.5, 0.1, 0.7])


# Each field the replay reads, set to None (or holding a None) on the third item: the record is damaged,
# and the error names the item's qid and the field, never a bare TypeError from deep inside.
DAMAGED = [
    ("answer_no_retrieval", {"answer_no_retrieval": None}),
    ("answer_one_retrieval", {"answer_one_retrieval": None}),
    ("answer_multi_retrieval", {"answer_multi_retrieval": None}),
    ("answers", {"answers": None}),
    ("answers", {"answers": ("paris", None)}),
    ("group", {"group": None}),
    ("meta['csv_rag_one_retrieve']", {"meta": {"csv_rag_one_retrieve": None}}),
    ("classifier_probas", {"classifier_option": "A", "classifier_probas": (0.2, None, 0.5)}),
    ("ircot_steps", {"ircot_steps": "three"}),
    ("seakr['final_answer']", {"seakr": {"final_answer": None, "retrieval_times": 1}}),
    ("seakr['retrieval_times']", {"seakr": {"final_answer": "paris", "retrieval_times": None}}),
]


@pytest.mark.parametrize(("field", "change"), DAMAGED, ids=[f"{f}={c}" for f, c in DAMAGED])
def test_a_damaged_record_in_the_replay_is_a_value_error_naming_its_qid_and_field(field, change):
    import dataclasses
    import re

    items, cols = _toy_replay_inputs()
    items[2] = dataclasses.replace(items[2], **change)
    with pytest.raises(ValueError, match=re.escape(f"items[2] (qid 'a2:passages'): {field}: expected")):
        replay("toy_test", items, cols)


def test_what_the_replay_reads_as_absent_is_absent_not_an_error():
    # None where the module docstring gives None a meaning: no passages, a gate not replayed, no score,
    # no IRCoT step count (0 calls)
    import dataclasses

    items, cols = _toy_replay_inputs()
    plain = {p.name: p for p in replay("toy_test", items, cols).policies}
    items = [dataclasses.replace(it, classifier_option=None, classifier_probas=None, wtr_giveup=None, seakr=None)
             for it in items]
    items[1] = dataclasses.replace(items[1], ircot_steps=None)
    got = {p.name: p for p in replay("toy_test", items, cols).policies}
    assert got["IRCoT"].calls.tolist() == [3, 0, 3, 3]
    assert got["MDL (paper defaults)"].correct.tolist() == plain["MDL (paper defaults)"].correct.tolist()
    with_clf = [dataclasses.replace(it, classifier_option="B", classifier_probas=None) for it in items]
    clf = {p.name: p for p in replay("toy_test", with_clf, cols).policies}["Adaptive-RAG classifier"]
    assert clf.retrieve_score is None and clf.calls.tolist() == [1, 1, 1, 1]
    no_passages = [dataclasses.replace(it, memories=None) for it in items]
    r = replay("toy_dev", no_passages, None)
    assert "MDL (paper defaults)" not in {p.name for p in r.policies}
    with pytest.raises(ValueError, match=r"items: a0:passages has no passages"):
        replay("toy_test", no_passages, cols)
    no_meta = [dataclasses.replace(it, meta=None) for it in items]
    with pytest.raises(ValueError, match=r"items: a0:passages has no passages or no 'csv_rag_one_retrieve'"):
        replay("toy_test", no_meta, cols)


def test_the_replay_names_a_missing_or_short_signal_column():
    items, cols = _toy_replay_inputs()
    with pytest.raises(ValueError, match=r"cols: no column 'action_either'"):
        replay("toy_test", items, {k: v for k, v in cols.items() if k != "action_either"})
    with pytest.raises(ValueError, match=r"cols\['M'\]: expected 4 values \(one per item\), got 3"):
        replay("toy_test", items, {**cols, "M": cols["M"][:3]})

@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared benchmark data is not beside the checkout")
def test_the_benchmark_command_scores_a_users_column_resumes_and_refuses_nothing_silently(
        cli, tmp_path, embedder, monkeypatch):
    from mdl_jax.evaluation.datasets import load_benchmark
    from mdl_jax.gate import core

    # the session's MiniLM (loaded once), not a second copy of the model
    monkeypatch.setattr(core, "_make_embedder", lambda *a, **k: embedder)
    items = load_benchmark("rgb_en_fact", limit=4)
    scores = tmp_path / "mine.csv"
    with open(scores, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["qid", "length"])
        w.writerows([it.qid, len(" ".join(it.memories))] for it in items)
    out = tmp_path / "run"
    argv = ["benchmarks", "rgb_en_fact", "adarague:hotpotqa_test", "--limit", "4", "--out", str(out),
            "--gate-scores", str(scores), "--no-fit", "--n-boot", "50"]
    code, stdout, stderr = cli(argv)
    assert code == 0, stderr
    report = (out / "REPORT.md").read_text(encoding="utf-8")
    assert "| length |" in report and "MDL (paper defaults)" in report and "In-Accuracy" in report
    assert (out / "figures" / "rgb_en_fact.png").stat().st_size > 0
    sig = out / "signals" / "rgb_en_fact.npz"
    before = sig.stat().st_mtime_ns
    assert cli(argv)[0] == 0
    assert sig.stat().st_mtime_ns == before, "a rerun on the same inputs must reuse the signals"
    code, _, err = cli(["benchmarks", "no_such_set", "--out", str(out)])
    assert code == 2 and "no_such_set" in err


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared benchmark data is not beside the checkout")
def test_a_damaged_cache_is_recomputed_a_linked_folder_refused_and_a_callable_embedder_never_cached(
        tmp_path, embedder):
    from mdl_jax._io import OutputError
    from mdl_jax.evaluation.run import run_benchmarks
    from mdl_jax.gate.core import MemoryGate

    gate = MemoryGate(embedder, risk=0.5)
    out = tmp_path / "run"
    kw = dict(limit=3, fit_mdl=False, n_boot=20, progress=False, log=lambda s: None)
    run_benchmarks(out, ["rgb_en_fact"], gate=gate, **kw)
    want = (out / "metrics.csv").read_bytes()
    sig = out / "signals" / "rgb_en_fact.npz"
    for damage in (b"", b"not a zip", sig.read_bytes()[: sig.stat().st_size // 2]):
        sig.write_bytes(damage)
        run_benchmarks(out, ["rgb_en_fact"], gate=gate, **kw)  # recomputed, not a crash
        assert (out / "metrics.csv").read_bytes() == want
    # signals whose digest no longer matches (a run of an earlier version, which recorded no threshold in
    # its run.json, then rerun with another) are recomputed, never reused
    (out / "inputs.json").unlink()
    before = sig.stat().st_mtime_ns
    with pytest.warns(RuntimeWarning, match="earlier version"):
        run_benchmarks(out, ["rgb_en_fact"], gate=MemoryGate(embedder, risk=0.5, relevance_threshold=0.9), **kw)
    assert sig.stat().st_mtime_ns != before
    # a callable embedder cannot be named across processes: its signals are never cached
    calls = tmp_path / "calls"
    calls.mkdir()
    run_benchmarks(calls, ["rgb_en_fact"], gate=MemoryGate(lambda t: embedder.embed(t), risk=0.5), **kw)
    assert not (calls / "signals" / "rgb_en_fact.npz").exists()
    # a symbolic link planted at the signals folder is refused, its target untouched
    linked = tmp_path / "linked"
    (linked).mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (linked / "signals").symlink_to(target, target_is_directory=True)
    with pytest.raises(OutputError, match="symbolic link"):
        run_benchmarks(linked, ["rgb_en_fact"], gate=gate, **kw)
    assert not any(target.iterdir())
    with pytest.raises(TypeError, match="names"):
        run_benchmarks(out, "rgb_en_fact", gate=gate, **kw)
    with pytest.raises(ValueError, match="twice"):
        run_benchmarks(out, ["rgb_en_fact", "rgb_en_fact"], gate=gate, **kw)


def _bench(tmp_path, embedder):
    """(run_benchmarks with the session's MiniLM and a small, fast setting, the run folder)."""
    from mdl_jax.evaluation.run import run_benchmarks
    from mdl_jax.gate.core import MemoryGate

    def run(names, gate=None, **kw):
        kw = {"limit": 3, "fit_mdl": False, "n_boot": 20, "progress": False, "log": lambda s: None, **kw}
        return run_benchmarks(tmp_path / "run", names, gate=gate or MemoryGate(embedder, risk=0.5), **kw)

    return run, tmp_path / "run"


def _files(out: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}


def _datasets(out: Path) -> list[str]:
    with open(out / "metrics.csv", newline="") as f:
        return list(dict.fromkeys(r["dataset"] for r in csv.DictReader(f)))


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared benchmark data is not beside the checkout")
def test_a_benchmark_rerun_onto_another_limit_config_or_setting_is_refused_naming_it_and_touching_nothing(
        tmp_path, embedder):
    from mdl_jax import MDLConfig
    from mdl_jax.gate.core import MemoryGate

    run, out = _bench(tmp_path, embedder)
    run(["rgb_en_fact", "ramdocs"])
    want = _files(out)
    with pytest.raises(ValueError, match=r"limit \(3 then, 2 now\) changed; run into a fresh --out") as e:
        run(["rgb_en_fact"], limit=2)
    assert type(e.value).__name__ == "OtherInputs"
    with pytest.raises(ValueError, match=r"limit \(3 then, None now\)"):
        run(["rgb_en_fact"], limit=None)
    with pytest.raises(ValueError, match=r"config sigma \(0\.2 then, 0\.3 now\) changed"):
        run(["rgb_en_fact"], gate=MemoryGate(embedder, risk=0.5, config=MDLConfig(sigma=0.3)))
    with pytest.raises(ValueError, match=r"relevance_threshold \(0\.3 then, 0\.9 now\)"):
        run(["rgb_en_fact"], gate=MemoryGate(embedder, risk=0.5, relevance_threshold=0.9))
    with pytest.raises(ValueError, match=r"fit_mdl \(False then, True now\); n_boot \(20 then, 30 now\)"):
        run(["ramdocs"], n_boot=30, fit_mdl=True)
    from mdl_jax.evaluation.datasets import load_benchmark

    # the run's every data set is scored, ramdocs too: a user's gate must score it
    mine = {"mine": {it.qid: 0.5 for it in load_benchmark("rgb_en_fact", limit=3)}}
    with pytest.raises(ValueError, match=r"extra\['mine'\]: no score for 3 of ramdocs's memory sets"):
        run(["rgb_en_fact"], extra=mine)
    mine["mine"].update({it.qid: 0.5 for it in load_benchmark("ramdocs", limit=3)})
    with pytest.raises(ValueError, match=r"the gate scores of rgb_en_fact; the gate scores of ramdocs changed"):
        run(["rgb_en_fact"], extra=mine)
    assert _files(out) == want, "a refused rerun must leave the run's files as they were"
    # the record of the inputs is the check: one that is not a record refuses, never switches it off
    (out / "inputs.json").write_text("[]")
    with pytest.raises(ValueError, match="inputs.json is not a readable record"):
        run(["rgb_en_fact"])


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared benchmark data is not beside the checkout")
def test_a_benchmark_run_into_a_folder_another_run_is_writing_is_refused_touching_nothing(tmp_path, embedder):
    from mdl_jax._io import lock_file
    from mdl_jax.evaluation.run import RunInUse

    run, out = _bench(tmp_path, embedder)
    run(["rgb_en_fact"])
    want = _files(out)
    held = lock_file(out / ".lock")  # another run's lock: any other open file holding it
    assert held is not None
    try:
        with pytest.raises(RunInUse, match="another mdl-jax benchmarks run is writing .*another --out"):
            run(["rgb_en_fact"])
    finally:
        held.close()
    assert _files(out) == want
    run(["rgb_en_fact"])  # let go: the same run resumes
    assert _files(out) == want


def test_a_fresh_benchmark_run_refused_before_any_work_leaves_no_folder(tmp_path, embedder):
    from mdl_jax.evaluation.datasets import DataError

    run, out = _bench(tmp_path, embedder)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError):
        run(["rgb_en_fact"], data_dir=tmp_path / "empty")
    assert not out.exists()


@pytest.mark.parametrize("when", ["before its opening", "as it locks"])
def test_a_benchmark_run_whose_folder_goes_as_it_takes_the_lock_makes_it_again(when, tmp_path, monkeypatch):
    # a refused fresh run removes the folder it made, holding its lock, as it ends: a run that had just
    # made (found) the folder then failed with "cannot write .../.lock: No such file or directory", or
    # was refused as "another run is writing" with none left; it goes on as one begun after (and here is
    # refused for its own reason, its folder removed as a fresh run's)
    from mdl_jax.evaluation import run as run_module
    from mdl_jax.evaluation.datasets import DataError
    from mdl_jax.gate.core import MemoryGate
    from tests.gate_embedders import hashed
    from tests.races import folder_goes_once

    out = tmp_path / "run"
    (tmp_path / "empty").mkdir()

    left = folder_goes_once(monkeypatch, out, ".lock", when)
    with pytest.raises(DataError):
        run_module.run_benchmarks(out, ["rgb_en_fact"], gate=MemoryGate(hashed, risk=0.5), limit=3, fit_mdl=False,
                                  n_boot=20, progress=False, log=lambda s: None, data_dir=tmp_path / "empty")
    assert not out.exists() and not left[0]


def test_a_fresh_benchmark_run_refused_before_any_work_leaves_no_parent_folder_it_made(tmp_path, embedder):
    from mdl_jax.evaluation.datasets import DataError
    from mdl_jax.evaluation.run import run_benchmarks
    from mdl_jax.gate.core import MemoryGate

    (tmp_path / "empty").mkdir()
    (tmp_path / "kept").mkdir()
    for out in (tmp_path / "new" / "deeper" / "run", tmp_path / "kept" / "new" / "run"):
        with pytest.raises(DataError):
            run_benchmarks(out, ["rgb_en_fact"], gate=MemoryGate(embedder, risk=0.5), limit=3, fit_mdl=False,
                           n_boot=20, progress=False, log=lambda s: None, data_dir=tmp_path / "empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "kept"]
    assert not any((tmp_path / "kept").iterdir())


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared benchmark data is not beside the checkout")
def test_both_readings_of_rgb_in_a_run_evaluate_the_same_questions(tmp_path, embedder):
    """RGB's two readings take their calibration split from the folder they read: of the first three
    questions none falls in the calibration share by that salt (one would by the reading's own name)."""
    run, out = _bench(tmp_path, embedder)
    run(["rgb_en_fact", "rgb_en_fact_equal"])
    with open(out / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["gate"] == "always adopt" and r["metric"] == "decision accuracy"]
    assert {r["dataset"]: r["n_groups"] for r in rows} == {"rgb_en_fact": "3", "rgb_en_fact_equal": "3"}


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared benchmark data is not beside the checkout")
def test_a_run_with_a_data_dir_reads_rgbs_equal_reading_from_rgbs_folder(tmp_path, embedder):
    """``data_dir`` (``--data-dir``) is a benchmarks folder: ``rgb_en_fact_equal`` reads ``rgb_en_fact/`` in
    it, as it does in the shared copy (there is no ``rgb_en_fact_equal/``), and gives what the shared copy gives."""
    run, out = _bench(tmp_path, embedder)
    run(["rgb_en_fact_equal"], data_dir=SHARED)
    with open(out / "metrics.csv", newline="") as f:
        given = [r for r in csv.DictReader(f)]
    assert {r["dataset"] for r in given} == {"rgb_en_fact_equal"}
    run2 = _bench(tmp_path / "shared", embedder)[0]
    run2(["rgb_en_fact_equal"])
    with open(tmp_path / "shared" / "run" / "metrics.csv", newline="") as f:
        assert [r for r in csv.DictReader(f)] == given


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared benchmark data is not beside the checkout")
def test_a_benchmark_rerun_on_the_same_inputs_resumes_and_reports_every_data_set_of_the_run(
        tmp_path, embedder):
    run, out = _bench(tmp_path, embedder)
    run(["rgb_en_fact", "ramdocs"])
    want = (out / "metrics.csv").read_bytes()
    sig = out / "signals" / "rgb_en_fact.npz"
    before = sig.stat().st_mtime_ns
    (out / "metrics.csv").unlink()  # as if stopped before the tables were written
    run(["rgb_en_fact", "ramdocs"])
    assert sig.stat().st_mtime_ns == before, "a rerun on the same inputs must reuse the signals"
    assert (out / "metrics.csv").read_bytes() == want
    # naming fewer data sets keeps the others: the report still covers the whole run
    run(["ramdocs"])
    assert (out / "metrics.csv").read_bytes() == want
    assert json.loads((out / "run.json").read_text())["names"] == ["rgb_en_fact", "ramdocs"]
    assert "### rgb_en_fact" in (out / "REPORT.md").read_text(encoding="utf-8")


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared benchmark data is not beside the checkout")
def test_a_data_set_added_to_a_benchmark_run_is_reported_beside_the_earlier_ones_unchanged(tmp_path, embedder):
    run, out = _bench(tmp_path, embedder)
    run(["rgb_en_fact"])
    with open(out / "metrics.csv", newline="") as f:
        first = list(csv.DictReader(f))
    sig = out / "signals" / "rgb_en_fact.npz"
    before = sig.stat().st_mtime_ns
    run(["selfaware"])
    assert _datasets(out) == ["rgb_en_fact", "selfaware"]
    with open(out / "metrics.csv", newline="") as f:
        rgb = [{k: v for k, v in r.items() if k in first[0]} for r in csv.DictReader(f)
               if r["dataset"] == "rgb_en_fact"]
    assert rgb == first, "the earlier data set's results must be kept as they were"
    assert sig.stat().st_mtime_ns == before
    report = (out / "REPORT.md").read_text(encoding="utf-8")
    assert "### rgb_en_fact" in report and "### selfaware" in report
    meta = json.loads((out / "run.json").read_text())
    assert meta["names"] == ["rgb_en_fact", "selfaware"] and meta["limit"] == 3
    assert list(json.loads((out / "inputs.json").read_text())["data"]) == ["rgb_en_fact", "selfaware"]


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared benchmark data is not beside the checkout")
def test_a_benchmark_run_of_an_earlier_version_is_checked_against_its_run_json(tmp_path, embedder):

    run, out = _bench(tmp_path, embedder)
    run(["rgb_en_fact"])
    (out / "inputs.json").unlink()  # what an earlier version left: run.json, no inputs.json
    with pytest.raises(ValueError, match=r"limit \(3 then, 4 now\) changed"):
        run(["ramdocs"], limit=4)
    with pytest.warns(RuntimeWarning, match="earlier version"):
        run(["ramdocs"])
    assert _datasets(out) == ["rgb_en_fact", "ramdocs"]
    (out / "inputs.json").unlink()
    (out / "run.json").write_text("{")
    with pytest.raises(ValueError, match="no inputs.json and a run.json that is no benchmark run's record"):
        run(["ramdocs"])


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared benchmark data is not beside the checkout")
def test_the_benchmark_command_refuses_a_changed_limit_in_one_line_with_exit_2(cli, tmp_path, embedder,
                                                                                monkeypatch):
    from mdl_jax.gate import core

    monkeypatch.setattr(core, "_make_embedder", lambda *a, **k: embedder)
    out = tmp_path / "run"
    argv = ["benchmarks", "--out", str(out), "--no-fit", "--n-boot", "20"]
    code, _, err = cli([*argv, "rgb_en_fact", "ramdocs", "--limit", "3"])
    assert code == 0, err
    want = _files(out)
    code, stdout, err = cli([*argv, "rgb_en_fact", "--limit", "2"])
    assert code == 2 and stdout == ""
    assert err.startswith("mdl-jax: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert "limit (3 then, 2 now) changed" in err and "fresh --out" in err
    assert _files(out) == want


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared benchmark data is not beside the checkout")
def test_the_benchmark_command_refuses_a_folder_in_use_in_one_line_with_exit_2(cli, tmp_path, embedder,
                                                                               monkeypatch):
    from mdl_jax._io import lock_file
    from mdl_jax.gate import core

    monkeypatch.setattr(core, "_make_embedder", lambda *a, **k: embedder)
    out = tmp_path / "run"
    out.mkdir()
    held = lock_file(out / ".lock")
    try:
        code, stdout, err = cli(["benchmarks", "--out", str(out), "--no-fit", "--n-boot", "20", "rgb_en_fact",
                                 "--limit", "2"])
    finally:
        held.close()
    assert code == 2 and stdout == ""
    assert err.startswith("mdl-jax: error: out: another mdl-jax benchmarks run is writing")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert [p.name for p in out.iterdir()] == [".lock"]


@pytest.mark.parametrize("name", ["MDL (paper defaults)", "oracle", "similarity (top-1)", 3, " oracle", "R alone\t"])
def test_a_users_column_named_as_a_built_in_gate_is_refused_not_mixed_into_its_rows(name):
    n = 40
    adopt = np.arange(n) % 2 == 0
    M = np.where(adopt, 0.8, 0.2)
    cols = _cols(M, np.full(n, 0.5), np.full(n, int(Action.ACTIVE)), M)
    with pytest.raises(ValueError, match=r"extra: .* cannot name a gate"):
        score_gates("toy", _items(n, adopt), cols, extra={name: -M}, fit_mdl=False)
    with pytest.raises(TypeError, match="extra: expected a mapping"):
        score_gates("toy", _items(n, adopt), cols, extra=[-M], fit_mdl=False)


def _bad_inputs(items, cols):
    """(inputs, the error's words) for each damage score_gates and the replay refuse, naming it."""
    import dataclasses

    n = len(items)
    return [
        ((items, {**cols, "M": np.where(np.arange(n) == 1, np.nan, cols["M"])}), r"cols\['M'\]: expected finite"),
        ((items, {**cols, "C_final": np.full(n, np.inf)}), r"cols\['C_final'\]: expected finite"),
        ((items, {**cols, "action": np.full(n, 9)}), r"cols\['action'\]: expected MDL's actions"),
        ((items, {**cols, "M": cols["M"][:, None]}), r"cols\['M'\]: expected \d+ values \(one per item\), got shape"),
        ((items, {k: v for k, v in cols.items() if k != "C_final_either"}), r"cols: no column 'C_final_either'"),
        ((items + [dataclasses.replace(items[0])], {k: np.r_[v, v[:1]] for k, v in cols.items()}),
         r"items\[\d+\]: qid .* is items\[0\]'s too"),
        (([], {k: v[:0] for k, v in cols.items()}), "items: expected at least one item"),
    ]


def test_score_gates_refuses_damaged_signal_columns_and_items_naming_them():
    n = 40
    adopt = np.arange(n) % 2 == 0
    M = np.where(adopt, 0.8, 0.2)
    items, cols = _items(n, adopt), _cols(M, np.full(n, 0.5), np.full(n, int(Action.ACTIVE)), M)
    for (its, cs), words in _bad_inputs(items, cols):
        with pytest.raises(ValueError, match=words):
            score_gates("toy", its, cs, fit_mdl=False)
    with pytest.raises(TypeError, match=r"items\[0\]: expected BenchmarkItem"):
        score_gates("toy", [{"qid": "q"}] * n, cols, fit_mdl=False)


def test_the_replay_refuses_damaged_signal_columns_and_items_naming_them():
    items, cols = _toy_replay_inputs()
    for (its, cs), words in _bad_inputs(items, cols):
        with pytest.raises(ValueError, match=words):
            replay("toy_test", its, cs)
    with pytest.raises(TypeError, match=r"items\[0\]: expected AdaRAGUEItem, got BenchmarkItem"):
        replay("toy_test", _items(4, [True] * 4), cols)


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared benchmark data is not beside the checkout")
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "high", None])
def test_a_users_gate_score_that_is_no_finite_number_is_refused_before_any_work_and_the_fix_runs(
        tmp_path, embedder, bad):
    from mdl_jax.evaluation.datasets import load_benchmark

    run, out = _bench(tmp_path, embedder)
    scores = {it.qid: float(i) for i, it in enumerate(load_benchmark("rgb_en_fact", limit=3))}
    first = next(iter(scores))
    with pytest.raises(ValueError, match=rf"extra\['mine'\]\[{first!r}\]: expected a finite number"):
        run(["rgb_en_fact"], extra={"mine": {**scores, first: bad}})
    assert not out.exists()
    run(["rgb_en_fact"], extra={"mine": scores})  # the corrected scores are not refused as a change
    with pytest.raises(TypeError, match=r"extra\['mine'\]: expected a mapping"):
        run(["rgb_en_fact"], extra={"mine": list(scores.values())})


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared benchmark data is not beside the checkout")
def test_a_users_gate_scores_given_as_0d_arrays_are_their_values(tmp_path, embedder):
    import jax.numpy as jnp

    from mdl_jax.evaluation.datasets import load_benchmark

    run, out = _bench(tmp_path, embedder)
    qids = [it.qid for it in load_benchmark("rgb_en_fact", limit=3)]
    arrays = {q: (np.asarray(0.25 * i) if i % 2 else jnp.float32(0.25 * i)) for i, q in enumerate(qids)}
    run(["rgb_en_fact"], extra={"mine": arrays})
    run(["rgb_en_fact"], extra={"mine": {q: 0.25 * i for i, q in enumerate(qids)}})  # the same inputs: resumed


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared benchmark data is not beside the checkout")
def test_a_users_gate_scores_given_as_jax_narrow_floats_are_their_values(tmp_path, embedder):
    """JAX's bfloat16 and float8 numbers have NumPy's dtype kind "V": a 0-d one was refused as no number,
    while a float32 one was taken; they are their values too, and a resumed run reads them as the
    Python floats they hold."""
    import jax.numpy as jnp

    from mdl_jax.evaluation.datasets import load_benchmark

    run, out = _bench(tmp_path, embedder)
    qids = [it.qid for it in load_benchmark("rgb_en_fact", limit=3)]
    arrays = {q: (jnp.bfloat16(0.25 * i) if i % 2 else jnp.asarray(0.25 * i, jnp.float8_e4m3fn))
              for i, q in enumerate(qids)}
    run(["rgb_en_fact"], extra={"mine": arrays})
    run(["rgb_en_fact"], extra={"mine": {q: 0.25 * i for i, q in enumerate(qids)}})  # the same inputs: resumed


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared benchmark data is not beside the checkout")
@pytest.mark.parametrize("name", ["REPORT.md", "metrics.csv", "conditions.csv"])
def test_a_benchmark_run_into_a_folder_of_the_users_own_files_is_refused_leaving_them(tmp_path, embedder, name):
    from mdl_jax.evaluation.run import OtherInputs

    run, out = _bench(tmp_path, embedder)
    out.mkdir()
    (out / name).write_text("the user's own\n")
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(OtherInputs, match=rf"holds {name} but no record of a benchmark run"):
        run(["rgb_en_fact"])
    assert (out / name).read_text() == "the user's own\n"
    assert sorted(p.name for p in out.iterdir() if p.name != ".lock") == sorted([name, "notes.txt"])
