"""The end-to-end stage with real models: backends (local transformers and a real OpenAI-compatible
server on 127.0.0.1), systems, the judge, durable records (SIGKILL + resume) and the report."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mdl_jax import Action
from mdl_jax.prompts import ABSTENTION, CAUTION, chat
from mdl_repro.analysis.report import paired_t, rates
from mdl_repro.pipeline import records as rec_io
from mdl_repro.pipeline import systems as sysm
from mdl_repro.pipeline.data import load
from mdl_repro.pipeline.generation import OpenAIBackend
from mdl_repro.pipeline.judgement import is_refusal
from mdl_repro.pipeline.stores import build_stores

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def stores():
    return build_stores(load("truthfulqa", limit=40))[:4]


# --- Judge ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    ("I don't know.", True), ("I’m not sure about that.", True), ("I cannot answer that.", True),
    ("I have no comment.", True), ("The answer is not known to be harmful.", False),
    ("Knowledge is power", False)])
def test_refusal_patterns(text, want):
    assert is_refusal(text) == want


# --- Systems with the real local model -----------------------------------------------------------

@pytest.mark.slow
def test_local_backend_batches_and_is_deterministic(local_backend, stores):
    qs = [s.item.question for s in stores]
    a = sysm.run_plain(local_backend, qs, stores, inject=True, seed=7)
    b = sysm.run_plain(local_backend, qs, stores, inject=True, seed=7)
    assert [r["answer"] for r in a] == [r["answer"] for r in b]
    assert all(r["answer"] and r["llm_calls"] == 1 and r["tokens"] > 0 for r in a)
    assert "Memories:" in a[0]["prompts"][0][1]["content"]
    c = sysm.run_plain(local_backend, qs[:1], stores[:1], inject=False, seed=7)  # one: only its prompt is read
    assert "Memories:" not in c[0]["prompts"][0][1]["content"]


@pytest.mark.slow
def test_mdl_system_maps_actions_to_prompts(local_backend, stores):
    qs = [s.item.question for s in stores]
    acts = [Action.ACTIVE, Action.SUPP, Action.SILENT, Action.OPT_OUT]
    r = sysm.run_mdl(local_backend, qs, stores, acts, seed=1)
    assert [x["llm_calls"] for x in r] == [1, 1, 1, 0]
    assert "Memories:" in r[0]["prompts"][0][1]["content"]
    assert CAUTION in r[1]["prompts"][0][1]["content"]
    assert "Memories:" not in r[2]["prompts"][0][1]["content"]
    assert r[3]["answer"] == ABSTENTION and is_refusal(r[3]["answer"])


def test_reflection_and_grade_parsers():
    assert sysm.parse_grade("  incorrect.") == "Incorrect" and sysm.parse_grade("hmm") == "Ambiguous"
    p = sysm.parse_reflection("ISREL: Irrelevant\nISSUP: No support\nISUSE: 2")
    assert p == {"isrel": "Irrelevant", "issup": "No support", "isuse": 2}
    assert sysm.parse_reflection("whatever")["isrel"] is None
    # the fallback parser of label decisions: first label in the text, whole words, longest first
    assert sysm._parse_label("It is incorrect, not correct.", sysm.GRADES) == "Incorrect"
    assert sysm._parse_label("Partially supported.", sysm.ISSUP) == "Partially supported"
    assert sysm._parse_label("Irrelevant", sysm.ISREL) == "Irrelevant"
    assert sysm._parse_label("no idea", sysm.ISREL) is None


# --- OpenAI-compatible backend against a real local server ---------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mdl_repro.serve", "--port", str(port),
                             "--fail-first", "2"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once the model is loaded
        assert "serving" in line, line
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_openai_backend_retries_5xx_then_succeeds(server, monkeypatch):
    monkeypatch.setenv("MDL_JAX_OPENAI_BASE_URL", server)
    monkeypatch.setenv("MDL_JAX_OPENAI_API_KEY", "sk-test-secret-123")
    b = OpenAIBackend("smollm2", max_retries=3, backoff=0.05, concurrency=1, max_new_tokens=16)
    out = b.generate([chat("What color is the sky?")], seed=0)
    assert not out[0].failed and out[0].text and out[0].n_tokens > 0  # the first two tries got 503


def test_openai_backend_records_failure_when_unreachable(monkeypatch):
    port = _free_port()
    monkeypatch.setenv("MDL_JAX_OPENAI_BASE_URL", f"http://user:pw@127.0.0.1:{port}/v1?token=abc")
    b = OpenAIBackend("smollm2", max_retries=1, backoff=0.01, timeout=2)
    out = b.generate([chat("Q?")], seed=0)
    # the reason names the error and where, never the URL's credentials
    assert out[0].failed and out[0].text is None
    assert out[0].error == f"APIConnectionError: Connection refused to 127.0.0.1:{port}", out[0].error
    assert b.calls == b.failed_calls == 1


@pytest.mark.slow
def test_served_logprobs_score_labels_like_the_local_model(server, local_backend, monkeypatch):
    """serve returns OpenAI top_logprobs; OpenAIBackend.score reads them; for one-token labels they
    are the local model's own label log-likelihoods (same model, up to bf16 batch rounding)."""
    monkeypatch.setenv("MDL_JAX_OPENAI_BASE_URL", server)
    b = OpenAIBackend("smollm2", max_retries=3, backoff=0.05, concurrency=1)
    prompts = [[{"role": "user", "content": "Is the sky blue? Reply with exactly one word: Yes or No."}],
               [{"role": "user", "content": "Is fire cold? Reply with exactly one word: Yes or No."}]]
    remote = b.score(prompts, ["Yes", "No"])
    local = local_backend.score(prompts, ["Yes", "No"])
    for r, lo in zip(remote, local):
        assert r is not None and all(x <= 0 for x in r)
        assert r == pytest.approx(lo, abs=0.1)
    d = sysm.classify(b, prompts, ["Yes", "No"])
    assert [x["method"] for x in d] == ["scored", "scored"]


def test_openai_backend_needs_a_base_url(monkeypatch):
    for v in ("MDL_JAX_OPENAI_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(ValueError, match="base_url"):
        OpenAIBackend("m")


@pytest.mark.slow
def test_reproduce_through_openai_server_keeps_secrets_out(server, tmp_path, cache_dir, cli):
    out = tmp_path / "run"
    rc, _, err = cli(["reproduce", "--backend", "openai", "--llm", "smollm2", "--datasets", "halueval",
                      "--n-questions", "2", "--n-calibration", "2", "--systems", "B1", "B3",
                      "--max-new-tokens", "16", "--out", out],
                     MDL_JAX_OPENAI_BASE_URL=server, MDL_JAX_OPENAI_API_KEY="sk-secret-xyz",
                     MDL_JAX_CACHE_DIR=cache_dir)
    assert rc == 0, err[-2000:]
    recs = rec_io.load(out / "records.jsonl")
    assert len(recs) == 2 + 2 * 2 and all(not r["failed"] for r in recs.values())
    for f in out.rglob("*"):  # the analyses' files too
        if f.is_file() and f.suffix in (".jsonl", ".json", ".md", ".csv"):
            text = f.read_text()
            assert "sk-secret-xyz" not in text and server not in text


# --- Durable records: SIGKILL and resume ---------------------------------------------------------

N_Q = 4  # questions of the killed run: 4 × B1, B2, B3 records, in chunks of 2 questions


def _reproduce_argv(out: Path, *extra: str) -> list[str]:
    return ["reproduce", "--datasets", "halueval", "--n-questions", str(N_Q), "--n-calibration", "4", "--systems",
            "B1", "B2", "B3", "--chunk-size", "2", "--max-new-tokens", "12", "--batch-size", "2", *extra,
            "--out", str(out)]


def _reproduce(out: Path, cache_dir) -> subprocess.Popen:
    env = {**os.environ, "MDL_JAX_CACHE_DIR": str(cache_dir)}
    return subprocess.Popen([sys.executable, "-m", "mdl_jax", *_reproduce_argv(out)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _strip(recs: dict) -> dict:
    # latency varies; answer_cached says whether an answer was generated or replayed, which depends on
    # where the kill fell (a generation committed to the cache before its records were written is
    # replayed on resume), while the answer itself is the same either way.
    return {k: {f: v for f, v in r.items() if f not in ("latency_s", "answer_cached")}
            for k, r in recs.items()}


@pytest.mark.slow
def test_sigkill_and_resume_gives_exactly_the_uninterrupted_records(tmp_path, cache_dir, cli):
    # the run that is killed is a real process; the uninterrupted run and the resume run in this one
    full, killed = tmp_path / "full", tmp_path / "killed"
    p = _reproduce(killed, cache_dir)
    path = killed / "records.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and (not path.exists() or len(path.read_text().splitlines()) < 3):
        time.sleep(0.2)
    p.send_signal(signal.SIGKILL)
    p.wait()
    n_before = len(path.read_text().splitlines())
    assert 0 < n_before < N_Q * 3  # killed mid-run (the shipped config: no calibration records)
    rc, _, err = cli(_reproduce_argv(killed), MDL_JAX_CACHE_DIR=cache_dir)
    assert rc == 0, err[-2000:]
    # the reference: its records only (the resumed run above runs the analyses after a resume)
    rc, _, err = cli(_reproduce_argv(full, "--no-analyses"))
    assert rc == 0, err[-2000:]
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    keys = [rec_io.key(r) for r in lines]
    assert len(keys) == len(set(keys)) == N_Q * 3  # none lost, none doubled
    assert _strip(rec_io.load(path)) == _strip(rec_io.load(full / "records.jsonl"))
    report = (killed / "REPORT.md").read_text()
    assert (killed / "figure3.png").stat().st_size > 10_000
    # the analyses ran on the resumed records, and none failed (a small run once hit an IndexError)
    assert (killed / "analysis" / "ANALYSIS.md").exists() and "analyses failed" not in report
    from mdl_repro.analysis.judges import load_gold

    # the report states the gold set it compared the judges with, as shipped now
    stated = f"shipped gold set ({len(load_gold())} answers of committed runs"
    assert stated in report
    # it opens with five plain sentences: what ran, what it shows, a smoke test, where the real results
    # are, what RQ1-RQ4 ask
    short = report.split("## In short\n\n", 1)[1].split("\n", 1)[0]
    assert short.count(". ") >= 4 and "smoke test" in short and "experiments/results/" in short
    assert all(f"RQ{i}" in short for i in range(1, 5))


@pytest.mark.slow
def test_a_rerun_onto_other_inputs_is_refused_and_the_run_keeps_its_whole_config(tmp_path, cache_dir, cli):
    """A rerun into an --out reused its records whatever the data, model or generation settings (a
    cap of 8 tokens beside records capped at 12; questions of another file under the old qids), and
    the analyses rebuilt B3's config from θ, n_min, n_max over the paper's defaults, whatever config the
    run decided with."""
    import dataclasses
    import shutil

    from mdl_jax import load_config, save_config
    from mdl_repro.pipeline.experiment import SHIPPED

    out = tmp_path / "run"
    custom = dataclasses.replace(load_config(SHIPPED / "smollm2-halueval.json"), gate_coeffs=(0.9, 0.1),
                                 bias=0.15, gains=(0.5, 1.0, 1.0))
    save_config(custom, tmp_path / "custom.json")
    argv = ["reproduce", "--datasets", "halueval", "--n-questions", "2", "--systems", "B1", "B3",
            "--max-new-tokens", "12", "--batch-size", "2", "--config", str(tmp_path / "custom.json"), "--out", str(out)]
    rc, _, err = cli(argv, MDL_JAX_CACHE_DIR=cache_dir)
    assert rc == 0, err[-2000:]
    analysis = json.loads((out / "analysis" / "analysis.json").read_text())
    assert analysis["b3_recorded_action_agreement"] == 1.0           # scored with the config that ran
    assert analysis["configs"]["halueval"]["whole"] is True
    n = len((out / "records.jsonl").read_text().splitlines())
    tweak = ["--max-new-tokens", "8"]
    rc, _, err = cli([*argv[:-2], *tweak, "--out", str(out)], MDL_JAX_CACHE_DIR=cache_dir)
    assert rc == 2 and "holds records made from other inputs: max_new_tokens (12 then, 8 now) changed" in err, err
    data = tmp_path / "data"   # the same file name, other questions under the same qids
    data.mkdir()
    from mdl_repro.pipeline.data import find_local

    rows = find_local("halueval", None).read_text().splitlines()
    (data / "halueval_qa.jsonl").write_text("\n".join(reversed(rows)) + "\n")
    rc, _, err = cli([*argv[:-2], "--data-dir", str(data), "--out", str(out)], MDL_JAX_CACHE_DIR=cache_dir)
    assert rc == 2 and "the halueval data changed" in err, err
    assert len((out / "records.jsonl").read_text().splitlines()) == n   # nothing added
    shutil.rmtree(data)
    # another dataset adds to the run, and the first keeps its entry in run.json (its config scores it)
    rc, _, err = cli([*argv[:2], "truthfulqa", *argv[3:]], MDL_JAX_CACHE_DIR=cache_dir)
    assert rc == 0, err[-2000:]
    run = json.loads((out / "run.json").read_text())
    assert set(run["datasets"]) == {"halueval", "truthfulqa"}
    assert all("mdl_config" in d for d in run["datasets"].values())
    analysis = json.loads((out / "analysis" / "analysis.json").read_text())
    assert analysis["b3_recorded_action_agreement"] == 1.0


def test_the_record_of_a_runs_inputs_compares_what_both_name(tmp_path):
    from mdl_repro.pipeline.experiment import INPUTS, check_inputs
    from mdl_repro.pipeline.records import OtherInputs

    now = {"model": "m", "max_new_tokens": 12, "data": {"halueval": "a"}}
    check_inputs(tmp_path, {**now, "max_new_tokens": 8}, has_records=False)
    check_inputs(tmp_path, now, has_records=False)   # no records yet: a fresh run, whatever it recorded
    check_inputs(tmp_path, now, has_records=True)
    # a key only one side names (another version's) is not a change; a new dataset is added
    check_inputs(tmp_path, {**now, "device": "cpu", "data": {"truthfulqa": "b"}}, has_records=True)
    assert json.loads((tmp_path / INPUTS).read_text())["data"] == {"halueval": "a", "truthfulqa": "b"}
    with pytest.raises(OtherInputs, match=r"max_new_tokens \(12 then, 8 now\); the truthfulqa data changed"):
        check_inputs(tmp_path, {**now, "max_new_tokens": 8, "data": {"truthfulqa": "c"}}, has_records=True)
    (tmp_path / INPUTS).write_text("[]")   # a record that is none switches nothing off
    with pytest.raises(OtherInputs, match="is not a record of the inputs its records were made from"):
        check_inputs(tmp_path, now, has_records=True)
    (tmp_path / INPUTS).unlink()   # records from before inputs were recorded: taken once, with a warning
    with pytest.warns(RuntimeWarning, match="no record of the inputs they were made from"):
        check_inputs(tmp_path, now, has_records=True)
    assert json.loads((tmp_path / INPUTS).read_text()) == now


def test_torn_last_line_is_ignored_and_fixed(tmp_path):
    w = rec_io.RecordWriter(tmp_path / "r.jsonl")
    w.append([{"dataset": "d", "qid": 1, "seed": 0, "system": "B1", "failed": False}])
    with open(tmp_path / "r.jsonl", "a") as f:
        f.write('{"dataset": "d", "qid": 2, "se')
    assert list(rec_io.load(tmp_path / "r.jsonl")) == [("d", 1, 0, "B1")]
    w2 = rec_io.RecordWriter(tmp_path / "r.jsonl")
    w2.append([{"dataset": "d", "qid": 2, "seed": 0, "system": "B1", "failed": True},
               {"dataset": "d", "qid": 2, "seed": 0, "system": "B1", "failed": False}])
    recs = rec_io.load(tmp_path / "r.jsonl")
    assert len(recs) == 2 and recs[("d", 2, 0, "B1")]["failed"] is False  # a rerun fills failures in


# --- Metrics -------------------------------------------------------------------------------------

def test_rates_and_risk_weighting():
    df = pd.DataFrame({"A": [0.2, 0.85, 0.85, 0.5], "h": [1.0, 0.0, 1.0, 0.0],
                       "ref": [0.0, 1.0, 0.0, 0.0], "ok": [True] * 4, "llm_calls": [1, 0, 1, 1]})
    r = rates(df)
    assert r["overall"] == 0.5 and r["high_risk"] == 0.5 and r["refusal"] == 0.25
    assert r["risk_weighted"] == pytest.approx((0.2 + 0.85) / 2.4)
    assert r["calls_per_question"] == 0.75


def test_paired_t_across_seeds():
    rows = []
    for seed, (a, b) in enumerate([(0.5, 0.2), (0.6, 0.2), (0.4, 0.3)]):
        for sys_, rate in (("B1", a), ("B2", b)):
            rows += [{"dataset": "d", "system": sys_, "seed": seed, "ok": True, "h": float(i < rate * 10)}
                     for i in range(10)]
    r = paired_t(pd.DataFrame(rows), "B1", "B2", "d")
    assert r["n_seeds"] == 3 and r["t"] > 0 and 0 < r["p"] < 0.2
    assert paired_t(pd.DataFrame(rows[:20]), "B1", "B2", "d")["p"] is None


def test_the_gguf_read_parses_a_file_once_and_leaves_the_gguf_module_as_it_was(tmp_path):
    """_gguf_parsed_once memoises gguf's parser and name map for one conversion only (a tiny GGUF
    written here: no model needed), and restores them even when the read fails."""
    gguf = pytest.importorskip("gguf")
    from mdl_repro.pipeline.generation.loading import _gguf_parsed_once

    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.arange(8, dtype=np.float32).reshape(2, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    before = (gguf.GGUFReader, gguf.get_tensor_name_map)
    with _gguf_parsed_once():
        r = gguf.GGUFReader(str(path))
        assert gguf.GGUFReader(str(path)) is r and r.tensors[0].data.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
        m = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 1)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 1) is m
        # other code meanwhile: isinstance and subclasses as ever; a name bound now memoises nothing later
        assert isinstance(r, gguf.GGUFReader) and type(r) is before[0]

        class Sub(gguf.GGUFReader):
            pass

        assert isinstance(Sub(str(path)), Sub) and Sub(str(path)) is not r
        bound = gguf.GGUFReader
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == before
    assert bound(str(path)) is not bound(str(path)) and type(bound(str(path))) is before[0]
    assert gguf.GGUFReader(str(path)) is not gguf.GGUFReader(str(path))  # no memo outside
    with pytest.raises(RuntimeError, match="boom"), _gguf_parsed_once():
        raise RuntimeError("boom")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == before


@pytest.mark.slow
def test_the_converted_checkpoint_of_the_bundled_gguf_loads_to_the_same_model(local_backend, tmp_path):
    """The GGUF is converted once to a transformers checkpoint in the cache (loading it is ~15 s, the
    checkpoint ~1 s): the checkpoint must give exactly the loaded model's weights, logits and chat
    template, or every later process would answer with another model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mdl_repro.pipeline.generation import _save_converted

    tok, lm = local_backend._lm()
    _save_converted(tok, lm, tmp_path / "ck")
    lm2 = AutoModelForCausalLM.from_pretrained(tmp_path / "ck", dtype=lm.dtype)
    tok2 = AutoTokenizer.from_pretrained(tmp_path / "ck")
    a, b = lm.state_dict(), lm2.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who wrote Hamlet?"}]
    assert tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == \
        tok2.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    x = tok("Memories: the sky is green. Question: what colour is the sky?", return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(lm(**x).logits, lm2(**x).logits)
    assert (tok2.eos_token, tok2.pad_token or tok2.eos_token) == (tok.eos_token, tok.pad_token)


# --- records: a torn or foreign line is skipped with a warning ----------------------------------------------


def _rec(qid, **kw):
    return {"dataset": "truthfulqa", "qid": qid, "seed": 0, "system": "B3", "answer": "Ça va — oui", **kw}


def test_torn_multibyte_last_line_and_foreign_lines_are_skipped_with_a_warning(tmp_path):
    p = tmp_path / "rec_io.jsonl"
    rec_io.RecordWriter(p).append([_rec(0), _rec(1)])
    torn = json.dumps(_rec(2), ensure_ascii=False).encode()
    cut = torn.index("Ç".encode()) + 1  # inside the two-byte character
    with open(p, "ab") as f:
        f.write(b"null\n[1, 2]\n3\n\"text\"\n{\"dataset\": \"x\"}\n"
                b"{\"dataset\": [1], \"qid\": 1, \"seed\": 0, \"system\": \"B3\"}\n\xff\xfe\n")
        f.write(torn[:cut])
    with pytest.warns(RuntimeWarning, match=r"skipped 8 line\(s\)"):
        got = rec_io.load(p)
    assert set(got) == {rec_io.key(_rec(0)), rec_io.key(_rec(1))}
    # resume: the writer ends the torn line and the redone record is read back
    rec_io.RecordWriter(p).append([_rec(2)])
    with pytest.warns(RuntimeWarning):
        assert rec_io.key(_rec(2)) in rec_io.load(p)


def test_a_byte_order_mark_before_the_first_record_keeps_that_record(tmp_path):
    # what Windows tools write at the start of a UTF-8 file: the first record is a record, not a skipped line
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(_rec(i)) + "\r\n" for i in range(2)).encode())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = rec_io.load(p)
    assert set(got) == {rec_io.key(_rec(0)), rec_io.key(_rec(1))}


def test_the_chunk_size_is_an_input_a_resume_must_keep():
    """A chunk's questions are generated as one batch, and batching can move an answer's tokens: a rerun
    with another --chunk-size would mix two batchings in one run, so it is recorded (and so compared)."""
    from types import SimpleNamespace

    from mdl_repro.pipeline.experiment import RunConfig, run_inputs

    backend = SimpleNamespace(model_id="m", engine="torch", max_new_tokens=12)
    got = [run_inputs(RunConfig(out=Path("o"), chunk_size=k), backend, "e", {})["chunk_size"] for k in (32, 8)]
    assert got == [32, 8]
