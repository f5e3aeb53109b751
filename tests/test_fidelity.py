"""Experiment fidelity and fault handling: paired sampling, likelihood-scored CRAG /
Self-RAG decisions, the OpenAI backend under malformed, silent and refused servers, the out-dir lock,
and progress / throughput on a resumed run. Real model and real local servers, except the fault
servers (tiny http.servers that misbehave on purpose)."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mdl_jax import Action
from mdl_jax.prompts import chat
from mdl_repro.pipeline import records as rec_io
from mdl_repro.pipeline import systems as sysm
from mdl_repro.pipeline.data import load
from mdl_repro.pipeline.experiment import OutDirInUse, lock_out_dir
from mdl_repro.pipeline.generation import (
    CachedBackend,
    Generation,
    GenerationCache,
    LocalBackend,
    OpenAIBackend,
    _RowSampler,
    record_seed,
)
from mdl_repro.pipeline.stores import build_stores

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def stores():
    return build_stores(load("truthfulqa", limit=40))[:4]


def _seeds(stores, seed=0):
    return [record_seed("truthfulqa", s.item.qid, seed) for s in stores]


# --- Paired sampling -----------------------------------------------------------------------------

def test_record_seed_depends_on_the_record_only():
    assert record_seed("truthfulqa", 7, 0) == record_seed("truthfulqa", 7, 0)
    assert len({record_seed("truthfulqa", 7, 0), record_seed("truthfulqa", 8, 0),
                record_seed("halueval", 7, 0), record_seed("truthfulqa", 7, 1)}) == 4
    assert 0 <= record_seed("halueval", 123, 2) < 2 ** 31  # what servers take as `seed`


def test_row_sampler_draws_do_not_depend_on_batch_neighbours_or_order():
    """A row's token at every step is a function of its own seed and logits, whatever else is in the
    batch and wherever it sits."""
    import torch

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 500, generator=g) * 3
    seeds = [11, 22, 33]
    alone = [[], [], []]
    for r in range(3):
        s = _RowSampler([seeds[r]], 0.7, 0.9)
        for _ in range(20):
            alone[r].append(int(s(None, logits[r:r + 1]).argmax()))
    for perm in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        s = _RowSampler([seeds[i] for i in perm], 0.7, 0.9)
        got = [[] for _ in perm]
        for _ in range(20):
            out = s(None, logits[perm])
            assert torch.isfinite(out).sum(-1).tolist() == [1] * len(perm)  # one forced token per row
            for r in range(len(perm)):
                got[r].append(int(out[r].argmax()))
        for r, i in enumerate(perm):
            assert got[r] == alone[i]


def test_row_sampler_keeps_to_the_top_p_nucleus():
    import torch

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    picks = set()
    for seed in range(300):
        picks.add(int(_RowSampler([seed], 1.0, 0.75)(None, logits).argmax()))
    assert picks == {0, 1}  # 0.5 + 0.3 reaches 0.75: tokens 2 and 3 are never drawn


@pytest.fixture(scope="module")
def local_fp32():
    # float32: no bf16 rounding, so the property below holds exactly (bf16's rate is measured by
    # experiments/batching_invariance.py; the generation cache makes the experiment exact anyway).
    return LocalBackend(batch_size=8, max_new_tokens=10, dtype="float32")


@pytest.mark.slow
def test_answer_is_a_function_of_prompt_and_record_seed_not_of_batch(local_fp32, stores):
    chats = [chat(s.item.question, s.texts) for s in stores[:3]]
    seeds = _seeds(stores[:3])
    together = [g.text for g in local_fp32.generate(chats, seed=seeds)]
    reversed_ = [g.text for g in local_fp32.generate(chats[::-1], seed=seeds[::-1])][::-1]
    alone = [local_fp32.generate([c], seed=[s])[0].text for c, s in zip(chats[1:2], seeds[1:2])]
    assert together == reversed_ and together[1:2] == alone  # the middle row: a neighbour on each side
    other = [g.text for g in local_fp32.generate(chats, seed=_seeds(stores[:3], 1))]
    assert other != together  # the seed matters: another run seed draws other numbers


@pytest.mark.slow
def test_cache_gives_b3_and_selfrag_exactly_b2s_and_b1s_answers(local_backend, stores, tmp_path):
    """Wherever B3 (Active / Silent) or Self-RAG (draft / regeneration) sends B2's or B1's prompt for
    the same record, it gets that answer back, replayed, without generating again."""
    gen = CachedBackend(local_backend, GenerationCache(tmp_path / "g.sqlite"))
    qs, seeds = [s.item.question for s in stores], _seeds(stores)
    b1 = sysm.run_plain(gen, qs, stores, inject=False, seed=seeds)
    b2 = sysm.run_plain(gen, qs, stores, inject=True, seed=seeds)
    assert not any(r["cached"] for r in b1 + b2)
    n_tokens = local_backend.tokens_generated
    acts = [Action.ACTIVE, Action.SILENT, Action.ACTIVE, Action.OPT_OUT]
    b3 = sysm.run_mdl(gen, qs, stores, acts, seed=seeds)
    assert [r["answer"] for r in b3[:3]] == [b2[0]["answer"], b1[1]["answer"], b2[2]["answer"]]
    assert [r["cached"] for r in b3] == [True, True, True, False]
    assert local_backend.tokens_generated == n_tokens  # nothing generated twice
    srag = sysm.run_selfrag(gen, qs, stores, seed=seeds)
    for r, a1, a2 in zip(srag, b1, b2):
        assert r["cached"] and r["answer"] == (a1["answer"] if r["extra"]["regenerated"] else a2["answer"])
    # another run seed is another record: not replayed
    again = sysm.run_plain(gen, qs[:1], stores[:1], inject=True, seed=_seeds(stores[:1], 5))
    assert not again[0]["cached"]
    # durable: a new process (a resumed run) reopening the file replays the same answers
    gen2 = CachedBackend(local_backend, GenerationCache(tmp_path / "g.sqlite"))
    b2_again = sysm.run_plain(gen2, qs, stores, inject=True, seed=seeds)
    assert [r["answer"] for r in b2_again] == [r["answer"] for r in b2] and all(r["cached"] for r in b2_again)


# --- Likelihood-scored decisions -------------------------------------------------------------------

@pytest.mark.slow
def test_score_is_the_log_likelihood_of_the_option_tokens(local_fp32):
    # float32, so batched + padded scoring must equal the plain one-sequence forward pass tightly (in
    # bf16 the two differ by rounding, up to ~0.07 nats measured).
    import torch

    local_backend = local_fp32
    prompt = [{"role": "user", "content": "Is the sky blue? Reply with exactly one word: Yes or No."}]
    opts = ["Yes", "No", "Partially supported"]
    sc = local_backend.score([prompt, prompt], opts)
    assert sc[0] == sc[1] and all(x < 0 for x in sc[0])
    tok, lm = local_backend._lm()
    text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    p_ids = tok(text, add_special_tokens=False)["input_ids"]
    for o, got in zip(opts, sc[0]):
        ids = p_ids + tok(o, add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            lp = torch.log_softmax(lm(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        want = sum(float(lp[j - 1, ids[j]]) for j in range(len(p_ids), len(ids)))
        assert got == pytest.approx(want, abs=2e-3)


@pytest.mark.slow
def test_packed_options_score_as_if_each_had_its_own_pass(local_fp32):
    """Options are packed after their prompt behind a 4-d mask: prompts of different lengths, option
    lists of different sizes, padding and several batches still give each option exactly the
    log-likelihood of its own prompt + option forward pass (float32)."""
    import torch

    prompts = [[{"role": "user", "content": "Is the sky blue? Reply Yes or No."}],
               [{"role": "user", "content": "Question: Who wrote Hamlet?\nAnswer: Shakespeare wrote it in "
                                           "about 1600.\n\nIs the answer supported? Reply with exactly one"
                                           " of: Fully supported, Partially supported, No support."}],
               [{"role": "user", "content": "Rate it from 1 to 5."}]]
    opts = [["Yes", "No"], ["Fully supported", "Partially supported", "No support"],
            ["1", "2", "3", "4", "5"]]
    old_bs = local_fp32.batch_size
    local_fp32.batch_size = 2  # two batches, the first one padded
    try:
        sc = local_fp32.score(prompts, opts)
    finally:
        local_fp32.batch_size = old_bs
    tok, lm = local_fp32._lm()
    for p, os_, got in zip(prompts, opts, sc):
        assert len(got) == len(os_)
        p_ids = tok(tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True),
                    add_special_tokens=False)["input_ids"]
        for o, g in zip(os_, got):
            ids = p_ids + tok(o, add_special_tokens=False)["input_ids"]
            with torch.inference_mode():
                lp = torch.log_softmax(lm(input_ids=torch.tensor([ids])).logits[0].float(), -1)
            want = sum(float(lp[j - 1, ids[j]]) for j in range(len(p_ids), len(ids)))
            assert g == pytest.approx(want, abs=2e-3), (o, g, want)


@pytest.mark.slow
def test_crag_and_selfrag_decisions_are_scored_deterministic_and_never_unparsed(local_backend, stores):
    # one store, run twice: each run makes 6-7 scored calls (a grade per memory, three reflections)
    qs, seeds = [s.item.question for s in stores[:1]], _seeds(stores[:1])
    crag = [sysm.run_crag(local_backend, qs, stores[:1], seed=seeds) for _ in range(2)]
    assert [r["extra"] for r in crag[0]] == [r["extra"] for r in crag[1]]
    for r, s in zip(crag[0], stores[:1]):
        assert set(r["extra"]["grade_methods"]) == {"scored"} and r["extra"]["method"] == "scored"
        # the calls it counts: one grade per memory, then the answer
        assert r["llm_calls"] == len(s.records) + 1 and len(r["extra"]["grades"]) == len(s.records)
        assert r["extra"]["verdict"] in ("Correct", "Incorrect", "Ambiguous")
        for sc in r["extra"]["grade_scores"]:
            assert set(sc) == set(sysm.GRADES) and all(v <= 0 for v in sc.values())
    srag = [sysm.run_selfrag(local_backend, qs, stores[:1], seed=seeds) for _ in range(2)]
    assert [r["extra"] for r in srag[0]] == [r["extra"] for r in srag[1]]
    for r in srag[0]:
        e = r["extra"]
        assert e["methods"] == {"isrel": "scored", "issup": "scored", "isuse": "scored"}
        assert e["isrel"] in sysm.ISREL and e["issup"] in sysm.ISSUP and 1 <= e["isuse"] <= 5
        assert e["outcome"] in ("kept", "regenerated") and not e["unparsed"]
        assert e["regenerated"] == (e["isrel"] == "Irrelevant" or e["issup"] == "No support")
        # draft + ISREL + ISSUP + ISUSE (+ the parametric regeneration)
        assert r["llm_calls"] == (5 if e["regenerated"] else 4) and r["answer"]


class _TextOnly:
    """A backend without logprobs (fault path): scoring gives None, replies are canned."""

    def __init__(self, reply):
        self.reply = reply

    def score(self, prompts, options):
        return [None] * len(prompts)

    def generate(self, prompts, *, seed, max_new_tokens=None, temperature=0.7, top_p=0.9):
        return [Generation(self.reply) for _ in prompts]


def test_decisions_fall_back_to_parsing_only_without_logprobs():
    d = sysm.classify(_TextOnly("I think it is Incorrect."), [[{"role": "user", "content": "x"}]],
                      sysm.GRADES)
    assert d[0]["label"] == "Incorrect" and d[0]["method"] == "parsed"
    d = sysm.classify(_TextOnly("hmm"), [[{"role": "user", "content": "x"}]], sysm.GRADES)
    assert d[0]["label"] is None and d[0]["method"] == "unparsed"


# --- OpenAI backend under faults -------------------------------------------------------------------

class _Fault(BaseHTTPRequestHandler):
    mode = "ok"

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.mode == "hang":
            time.sleep(30)  # accepts, never answers within the client's budget
            return
        if self.mode == "non-json":
            data, ctype = b"<html>bad gateway</html>", "application/json"
        elif self.mode == "no-choices":
            data, ctype = json.dumps({"id": "x", "object": "chat.completion", "created": 0,
                                      "model": "m", "choices": []}).encode(), "application/json"
        else:  # a well-formed answer without logprobs: the client must parse the text
            data = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                               "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                   "role": "assistant", "content": "Ambiguous, I would say."}}],
                               "usage": {"prompt_tokens": 1, "completion_tokens": 4,
                                         "total_tokens": 5}}).encode()
            ctype = "application/json"
        assert "messages" in body
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def fault_server():
    servers = []

    def start(mode: str) -> str:
        handler = type(f"Fault_{mode}", (_Fault,), {"mode": mode})
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_port}/v1"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.mark.parametrize("mode, reason", [("non-json", "malformed answer"), ("no-choices", "0 choices")])
def test_malformed_200_answer_is_a_failed_call_with_a_reason(fault_server, monkeypatch, mode, reason):
    monkeypatch.setenv("MDL_JAX_OPENAI_BASE_URL", fault_server(mode))
    b = OpenAIBackend("m", max_retries=2, backoff=0.01)
    out = b.generate([chat("Q?"), chat("R?")], seed=[1, 2])
    assert all(g.failed and g.text is None and reason in g.error for g in out), out
    assert b.failed_calls == b.calls == 2


def test_silent_server_costs_at_most_the_call_budget(fault_server, monkeypatch, capsys):
    monkeypatch.setenv("MDL_JAX_OPENAI_BASE_URL", fault_server("hang"))
    b = OpenAIBackend("m", max_retries=5, backoff=0.05, timeout=60, call_timeout=1.5)
    t0 = time.monotonic()
    g = b.generate([chat("Q?")], seed=0)[0]
    assert time.monotonic() - t0 < 4.0  # not 60 s per try, not 5 retries of it
    assert g.failed and "APITimeoutError" in g.error and "budget" in g.error
    assert "a call failed" in capsys.readouterr().err  # visible while it waits


def test_decisions_are_parsed_when_the_server_sends_no_logprobs(fault_server, monkeypatch):
    monkeypatch.setenv("MDL_JAX_OPENAI_BASE_URL", fault_server("ok"))
    b = OpenAIBackend("m", max_retries=0)
    d = sysm.classify(b, [[{"role": "user", "content": "grade"}]], sysm.GRADES)
    assert d[0]["label"] == "Ambiguous" and d[0]["method"] == "parsed"


@pytest.mark.slow
def test_reproduce_says_so_and_exits_nonzero_when_most_calls_fail(fault_server, tmp_path, cache_dir, cli):
    out = tmp_path / "run"
    rc, _, err = cli(["reproduce", "--backend", "openai", "--llm", "m", "--datasets", "halueval",
                      "--n-questions", "2", "--n-calibration", "2", "--systems", "B1", "--no-analyses", "--out", out],
                     MDL_JAX_OPENAI_BASE_URL=fault_server("no-choices"), MDL_JAX_CACHE_DIR=cache_dir)
    assert rc == 3, err[-2000:]
    assert "4 of 4 records of this run failed" in err
    recs = rec_io.load(out / "records.jsonl")
    assert len(recs) == 4 and all(r["failed"] and "0 choices" in r["error"] for r in recs.values())


@pytest.mark.slow
def test_rerun_with_nothing_to_do_exits_zero_after_a_failed_run(fault_server, tmp_path, cache_dir, cli):
    """A rerun that writes no record keeps the last working run's figures in run.json, but its exit
    status is its own: no record of it failed, so 0, even when that last run failed (exit 3)."""
    from mdl_repro.pipeline.experiment import SHIPPED

    out = tmp_path / "run"
    # one model throughout (a rerun onto another model is refused): the served "m", answering well,
    # then failing every call, then answering well again
    served = ["reproduce", "--datasets", "halueval", "--systems", "B1", "--max-new-tokens", "8", "--no-analyses",
              "--backend", "openai", "--llm", "m", "--config", SHIPPED / "smollm2-halueval.json", "--out", out]
    rc, _, err = cli(served + ["--n-questions", "1"], MDL_JAX_CACHE_DIR=cache_dir,
                     MDL_JAX_OPENAI_BASE_URL=fault_server("ok"))
    assert rc == 0, err[-2000:]
    rc, _, err = cli(served + ["--n-questions", "2"], MDL_JAX_OPENAI_BASE_URL=fault_server("no-choices"))
    assert rc == 3 and "1 of 1 records of this run failed" in err
    rc, _, err = cli(served + ["--n-questions", "1"], MDL_JAX_OPENAI_BASE_URL=fault_server("ok"))
    assert rc == 0, err[-2000:]
    run = json.loads((out / "run.json").read_text())
    assert run["report_rewritten"] is True and run["this_run"]["records_failed"] == 1


# --- One run per out dir ---------------------------------------------------------------------------

@pytest.mark.slow
def test_second_run_into_a_locked_out_dir_refuses_and_a_killed_holder_frees_it(tmp_path, cache_dir, cli):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; from pathlib import Path; "
                               "from mdl_repro.pipeline.experiment import lock_out_dir; "
                               f"f = lock_out_dir(Path({str(out)!r})); print('locked', flush=True); "
                               "time.sleep(600)"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(OutDirInUse, match=f"in use by another reproduce run \\(pid {holder.pid}\\)"):
            lock_out_dir(out)
        rc, _, err = cli(["reproduce", "--out", out], MDL_JAX_CACHE_DIR=cache_dir)
        assert rc == 2 and "is in use by another reproduce run" in err
        assert not (out / "records.jsonl").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock_out_dir(out).close()  # the kernel dropped the dead holder's lock: nothing stuck


@pytest.mark.parametrize("when", ["before its opening", "as it locks"])
def test_a_run_whose_out_dir_goes_as_it_takes_the_lock_makes_it_again(when, tmp_path, monkeypatch):
    # a refused reproduce removes the out dir it made (holding its lock) as it ends: a run that had just
    # made (found) the folder then failed with "cannot write .../.lock: No such file or directory", or was
    # refused as "in use by another reproduce run" with none left; it takes the lock of the folder made again
    from tests.races import folder_goes_once

    out = tmp_path / "run"
    left = folder_goes_once(monkeypatch, out, ".lock", when)
    f = lock_out_dir(out)
    try:
        assert not left[0] and os.fstat(f.fileno()).st_ino == os.stat(out / ".lock").st_ino
    finally:
        f.close()


# --- Progress and throughput across a resume -------------------------------------------------------

def _tiny(cli, out: Path, cache_dir, *extra) -> tuple[int, str, str]:
    # --no-analyses: these tests check the run's bookkeeping; the analyses after a run are
    # test_experiment's sigkill test and test_analysis's
    return cli(["reproduce", "--datasets", "halueval", "--n-calibration", "2", "--systems", "B1", "B2", "B3",
                "--max-new-tokens", "8", "--batch-size", "4", "--no-analyses", "--out", out, *extra],
               MDL_JAX_CACHE_DIR=cache_dir)


def _bar(stderr: str) -> tuple[int, int]:
    counts = re.findall(r"reproduce:.*?(\d+)/(\d+)", stderr)
    done, total = counts[-1]
    return int(done), int(total)


@pytest.mark.slow
def test_resumed_run_counts_its_own_plan_and_keeps_the_first_runs_throughput(tmp_path, cache_dir, cli, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # reproduce draws its bar on a terminal only
    out = tmp_path / "run"
    rc, _, err = _tiny(cli, out, cache_dir, "--n-questions", "3")
    assert rc == 0, err[-2000:]
    assert _bar(err) == (3 * 3, 3 * 3)  # the shipped config: no calibration answers
    run1 = json.loads((out / "run.json").read_text())
    assert run1["tokens_generated"] > 0 and run1["this_run"]["tokens_generated"] > 0
    recs = rec_io.load(out / "records.jsonl")
    b3 = [r for r in recs.values() if r["system"] == "B3" and r["action"] in ("ACTIVE", "SILENT")]
    assert all(r["answer_cached"] for r in b3)  # B1 / B2 had answered these prompts already
    # a rerun with a smaller plan: the bar shows this plan (3/3), never 9/3
    rc, _, err = _tiny(cli, out, cache_dir, "--n-questions", "1")
    assert rc == 0, err[-2000:]
    assert _bar(err) == (1 * 3, 1 * 3)
    run2 = json.loads((out / "run.json").read_text())
    assert run2["tokens_generated"] >= run1["tokens_generated"] > 0  # the first run's work is kept
    assert run2["generation_seconds"] >= run1["generation_seconds"] > 0
    # nothing was left to generate: the rerun only rewrote the report, which keeps the figures of the
    # run that did the work (not ~0 s of its own)
    assert run2["this_run"] == run1["this_run"] and run2["wall_seconds"] == run1["wall_seconds"] > 0
    # the primary family is declared by the run before any analysis, and a rerun keeps that declaration
    assert run1["primary"]["family"] and run1["primary"]["declared"] and run2["primary"] == run1["primary"]
    report = (out / "REPORT.md").read_text()
    assert run2["report_rewritten"] is True and "rewritten by a rerun" in report
    # --no-analyses: the report says how to run them later, and none ran
    assert "not run (--no-analyses): `mdl-jax analyze" in report and not (out / "analysis").exists()


def test_shipped_configs_are_the_committed_paper_scale_calibration():
    """The configs quick runs use are exactly what Section 3.4 gave on the calibration split of the
    committed run their note names (its run.json), so their provenance can be checked, not trusted."""
    from mdl_jax import load_config
    from mdl_repro.pipeline.experiment import SHIPPED

    for ds in ("truthfulqa", "halueval"):
        path = SHIPPED / f"smollm2-{ds}.json"
        run = re.search(r"experiments/results/([\w.-]+) ", json.loads(path.read_text())["note"]).group(1)
        want = json.loads((ROOT / "experiments" / "results" / run / "run.json").read_text())["datasets"][ds]
        cfg = load_config(path)
        assert want["n_calibration"] > 0  # the run calibrated (not itself a shipped-config run)
        assert list(cfg.thresholds) == want["thresholds"]
        assert (cfg.n_min, cfg.n_max) == (want["n_min"], want["n_max"])


# --- Command line ----------------------------------------------------------------------------------

def test_help_shows_defaults_and_the_bare_run_cost_and_names_both_seeds_apart():
    for cmd, want in (("reproduce", ["(default: 20)", "(default: 120.0)", "A bare run", "--split-seed",
                                     "generation seeds"]),
                      ("signals", ["(default: out/signals.parquet)", "--split-seed", "A bare run"])):
        out = subprocess.run([sys.executable, "-m", "mdl_jax", cmd, "--help"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120).stdout
        text = " ".join(out.split())  # argparse wraps lines
        for w in want:
            assert w in text, (cmd, w)
        assert "--seed SEED" not in text  # the old, ambiguous name is hidden


def test_old_seed_flag_still_sets_the_split_seed_with_a_warning(capsys):
    import argparse

    from mdl_repro.cli import experiment as commands

    p = argparse.ArgumentParser()
    commands.register(p.add_subparsers())
    assert p.parse_args(["reproduce"]).split_seed == 0
    a = p.parse_args(["reproduce", "--split-seed", "2", "--seeds", "0", "1"])
    assert (a.split_seed, a.seeds) == (2, [0, 1])
    assert p.parse_args(["reproduce", "--seed", "5"]).split_seed == 5
    assert "--seed is deprecated" in capsys.readouterr().err
