"""``mdl-jax gate``: every input format gives the gate's decisions beside the input's columns; a run
killed with SIGKILL resumes without losing or doubling a row; bad rows stop the run with one line
naming file, row and field, or are skipped and counted; hostile input (planted symbolic links, rows
over MAX_MEMORIES, lone surrogates, huge CSV cells, broken Parquet, the gate's own columns) is refused
in one line with nothing left behind, and a part is on disk before the manifest names it."""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mdl_jax.cli import main
from mdl_jax.gate import MemoryGate, files, reading
from mdl_jax.signals.aggregation import MAX_MEMORIES
from mdl_repro.pipeline import data
from tests import gate_embedders, gate_rows
from tests.gate_embedders import hashed

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ["--query-field", "question", "--memories-field", "mems"]


@pytest.fixture(scope="module")
def rows():
    items = data.load("truthfulqa", limit=20)
    return [{"id": it.qid, "question": it.question, "cat": it.category,
             "mems": list(it.correct[:2]) + list(it.incorrect[:2])} for it in items]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _env(cache_dir):
    return {**os.environ, "PYTHONPATH": str(ROOT), "MDL_JAX_CACHE_DIR": str(cache_dir)}


@pytest.mark.slow
def test_every_input_format_gives_the_gates_decisions_beside_the_input(rows, tmp_path, embedder,
                                                                      cache_dir, capsys):
    """JSONL, CSV, Parquet and a saved Hugging Face dataset folder, to Parquet and JSONL, with the real
    MiniLM (vectors from the session's cache): the columns are MemoryGate.decide_batch's."""
    import datasets

    want = MemoryGate(embedder=embedder, risk="truthfulqa").decide_batch(
        [r["question"] for r in rows], [r["mems"] for r in rows], [r["cat"] for r in rows])
    df = pd.DataFrame(rows)
    ins = {"jsonl": _jsonl(tmp_path / "in.jsonl", rows), "parquet": tmp_path / "in.parquet",
           "csv": tmp_path / "in.csv", "hf": tmp_path / "hf"}
    df.to_parquet(ins["parquet"])
    df.assign(mems=df.mems.map(json.dumps)).to_csv(ins["csv"], index=False)
    datasets.Dataset.from_pandas(df).save_to_disk(str(ins["hf"]))
    for (kind, src), suffix in zip(ins.items(), (".parquet", ".jsonl", ".parquet", ".jsonl")):
        out = tmp_path / f"out-{kind}{suffix}"
        assert main(["gate", str(src), "--out", str(out), *FIELDS, "--category-field", "cat",
                     "--risk", "truthfulqa", "--cache-dir", str(cache_dir), "--chunk-size", "7",
                     "--embed-backend", "torch", "--no-progress"]) == 0, kind  # the reference's backend
        got = pd.read_parquet(out) if suffix == ".parquet" else pd.read_json(out, lines=True)
        ids = got["id"].astype(int).tolist()  # a CSV cell is text
        assert ids == df["id"].tolist() and got["mdl_row"].tolist() == list(range(20))
        assert got["question"].tolist() == df["question"].tolist()
        assert got["mdl_action"].tolist() == [d.action_name for d in want], kind
        for k in ("M", "R", "A", "phi", "C_final", "E_r"):
            np.testing.assert_allclose(got[f"mdl_{k}"], [d.scalars[k] for d in want], atol=1e-6)
        assert not out.with_name(out.name + ".parts").exists()
    assert "20 rows decided" in capsys.readouterr().err


def _run(src, out, cache_dir, *extra):
    return subprocess.Popen([sys.executable, "-m", "mdl_jax", "gate", str(src), "--out", str(out),
                             *FIELDS, "--embedder", "tests.gate_embedders:slow", "--chunk-size", "3",
                             "--no-progress", *extra], env=_env(cache_dir), cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_sigkill_and_resume_gives_exactly_the_uninterrupted_output(rows, tmp_path, cache_dir):
    src = _jsonl(tmp_path / "in.jsonl", rows + rows[:10])  # 30 rows, 10 parts of 3
    ref = tmp_path / "ref.jsonl"
    assert main(["gate", str(src), "--out", str(ref), *FIELDS, "--embedder",
                 "tests.gate_embedders:hashed", "--chunk-size", "3", "--no-progress"]) == 0
    out = tmp_path / "out.jsonl"
    manifest = tmp_path / "out.jsonl.parts" / "manifest.json"
    p = _run(src, out, cache_dir)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        try:
            if len(json.loads(manifest.read_text())["parts"]) >= 2:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    done = len(json.loads(manifest.read_text())["parts"])
    assert 2 <= done < 10 and not out.exists()  # killed mid-run
    p = _run(src, out, cache_dir)
    assert p.wait(timeout=120) == 0, p.stderr.read()
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["mdl_row"] for r in got] == list(range(30))  # none lost, none doubled, in order
    assert got == [json.loads(x) for x in ref.read_text().splitlines()]
    assert not manifest.parent.exists()


def test_a_bad_row_is_one_line_naming_file_row_and_field_or_is_skipped(rows, tmp_path, capsys):
    bad = [dict(r) for r in rows[:6]]
    bad[2]["mems"] = "not a list"
    del bad[4]["question"]
    src = tmp_path / "bad.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in bad[:5]) + "{torn\n" + json.dumps(bad[5]) + "\n")
    out = tmp_path / "out.parquet"
    args = ["gate", str(src), "--out", str(out), *FIELDS, "--embedder", "tests.gate_embedders:hashed",
            "--chunk-size", "2", "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"mdl-jax: error: {src}, line 3: field 'mems': expected a list of memory texts or "
                   "dicts with a 'text' field, got str"]
    assert not out.exists() and not (tmp_path / "out.parquet.parts").exists()  # nothing left behind
    assert main(args + ["--on-bad-row", "skip"]) == 0
    err = capsys.readouterr().err
    assert "4 rows decided" in err and "3 bad rows skipped" in err
    assert f"{src}, line 5: field 'question': missing" in err and f"{src}, line 6: not a JSON" in err
    assert pd.read_parquet(out)["mdl_row"].tolist() == [0, 1, 3, 6]
    np.testing.assert_allclose(pd.read_parquet(out)["mdl_M"][0], MemoryGate(embedder=hashed).decide(
        bad[0]["question"], bad[0]["mems"]).scalars["M"], atol=1e-6)


@pytest.mark.parametrize("argv, match", [
    (["gate", "{tmp}/missing.jsonl", "--out", "{tmp}/o.parquet"], r"IN: .*missing\.jsonl: no such file"),
    (["gate", "{src}", "--out", "{tmp}/o.csv"], r"--out: .*o\.csv: expected a \.parquet or \.jsonl"),
    (["gate", "{src}", "--out", "{tmp}/o.jsonl", "--risk", "medical"], r"--risk: expected a number"),
    (["gate", "{src}", "--out", "{tmp}/o.jsonl", "--config", "{tmp}/none.json"], r"config: .*none\.json"),
    (["gate", "{src}", "--out", "{tmp}/o.jsonl", "--risk-field", "r"], r"line 1: field 'r': missing"),
    (["gate", "{src}", "--out", "{tmp}/o.jsonl", "--risk", "{tmp}/table.json", "--category-field", "cat"],
     r"in\.jsonl, line 1: field 'cat': category: 'Misconceptions' is not in the risk table"),
    (["gate", "{src}", "--out", "{tmp}/o.jsonl", "--embed-backend", "torch"],
     r"--embed-backend: applies to a model name or path, not to a module:function embedder"),
])
def test_bad_arguments_are_one_line_and_exit_2(rows, tmp_path, capsys, argv, match):
    src = _jsonl(tmp_path / "in.jsonl", rows[:2])
    (tmp_path / "table.json").write_text(json.dumps({"Health": 0.85}))
    argv = [a.format(tmp=tmp_path, src=src) for a in argv] + [
        *FIELDS, "--embedder", "tests.gate_embedders:hashed", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mdl-jax: error: ")
    import re
    assert re.search(match, err[0]), err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "table.json"]


@pytest.mark.parametrize("chunk_size", [1, 2, 10])
def test_memories_mixing_texts_and_dicts_reach_parquet_as_json_text(tmp_path, capsys, chunk_size):
    """Texts and {"text": ...} dicts are both valid memories, mixed across rows or inside one; Parquet
    needs one type per column, so that column becomes JSON text in every part (chunk sizes put the
    mix inside a part and across parts), is named in the file's metadata, and decodes to the input."""
    import pyarrow.parquet as pq

    from mdl_jax.gate.files import ACTION_NAMES, JSON_COLUMNS_KEY

    rows = [{"q": "Who wrote Hamlet?", "mems": ["Shakespeare wrote Hamlet.", "It is a tragedy."], "n": 1},
            {"q": "Is the sun a star?", "mems": [{"text": "The sun is a star.", "source": "wiki", "trust": 0.9}],
             "n": 2},
            {"q": "Capital of France?", "mems": ["Paris is the capital.", {"text": "France is in Europe."}],
             "n": 3}]
    src = _jsonl(tmp_path / "mixed.jsonl", rows)
    out = tmp_path / "out.parquet"
    assert main(["gate", str(src), "--out", str(out), "--query-field", "q", "--memories-field", "mems",
                 "--embedder", "tests.gate_embedders:hashed", "--chunk-size", str(chunk_size),
                 "--no-progress"]) == 0
    assert "'mems' written as JSON text" in capsys.readouterr().err
    t = pq.read_table(out)
    assert json.loads(t.schema.metadata[JSON_COLUMNS_KEY]) == ["mems"]
    got = t.to_pandas()
    assert [json.loads(m) for m in got["mems"]] == [r["mems"] for r in rows]
    assert got["n"].tolist() == [1, 2, 3] and got["mdl_row"].tolist() == [0, 1, 2]   # typed columns stay typed
    want = MemoryGate(embedder=hashed).decide_batch([r["q"] for r in rows], [r["mems"] for r in rows])
    assert got["mdl_action"].tolist() == [ACTION_NAMES[int(d.action)] for d in want]


def test_uniform_memories_stay_a_typed_parquet_list(rows, tmp_path, capsys):
    out = tmp_path / "out.parquet"
    assert main(["gate", str(_jsonl(tmp_path / "in.jsonl", rows[:5])), "--out", str(out), *FIELDS,
                 "--embedder", "tests.gate_embedders:hashed", "--chunk-size", "2", "--no-progress"]) == 0
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert "JSON text" not in capsys.readouterr().err
    assert pq.read_schema(out).field("mems").type == pa.list_(pa.string())


def test_the_truthfulqa_preset_without_categories_warns_that_every_row_gets_its_default(rows, tmp_path):
    import warnings

    out = tmp_path / "out.jsonl"
    with pytest.warns(UserWarning, match=r"^--risk truthfulqa reads each row's category, but no --category-field"):
        assert main(["gate", str(_jsonl(tmp_path / "in.jsonl", rows[:3])), "--out", str(out), *FIELDS,
                     "--risk", "truthfulqa", "--embedder", "tests.gate_embedders:hashed", "--no-progress"]) == 0
    assert {json.loads(x)["mdl_A"] for x in out.read_text().splitlines()} == {0.5}
    out.unlink()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main(["gate", str(tmp_path / "in.jsonl"), "--out", str(out), *FIELDS, "--category-field", "cat",
                     "--risk", "truthfulqa", "--embedder", "tests.gate_embedders:hashed", "--no-progress"]) == 0
    assert not [w for w in seen if "--risk truthfulqa" in str(w.message)]


@pytest.mark.parametrize("chunk_size", [1, 3])
def test_every_input_column_reaches_parquet_whatever_its_values(tmp_path, capsys, chunk_size):
    """A key missing from a chunk's first row (pa.Table.from_pylist dropped it), ints past int64 and
    empty dicts (a struct Parquet cannot hold) were lost or a traceback; each column is kept, typed
    where Parquet can hold it, else JSON text that decodes to the input."""
    import pyarrow.parquet as pq

    rows = [{"q": "q0", "m": ["a"]},
            {"q": "q1", "m": ["b"], "late": {"deep": [1, 2]}, "big": 2 ** 63, "e": {}},
            {"q": "q2", "m": ["c"], "big": 1, "e": "s"}]
    out = tmp_path / "out.parquet"
    assert main(["gate", str(_jsonl(tmp_path / "in.jsonl", rows)), "--out", str(out), "--query-field", "q",
                 "--memories-field", "m", "--embedder", "tests.gate_embedders:hashed",
                 "--chunk-size", str(chunk_size), "--no-progress"]) == 0
    t = pq.read_table(out)
    got = t.to_pylist()
    assert [r["mdl_row"] for r in got] == [0, 1, 2] and [r["m"] for r in got] == [["a"], ["b"], ["c"]]
    as_json = set(json.loads(t.schema.metadata[b"mdl_json_columns"]))
    assert {"big", "e"} <= as_json
    for key in ("late", "big", "e"):
        want = [r.get(key) for r in rows]
        vals = [r[key] for r in got]
        if key in as_json:
            vals = [None if v is None else json.loads(v) for v in vals]
        assert vals == want, key


def _resume_setup(tmp_path):
    """(the arguments of a one-row gate run, its empty parts folder) for the manifest tests."""
    from mdl_jax.gate.job import GateJob

    src = _jsonl(tmp_path / "in.jsonl", [{"question": "q", "mems": ["m"]}])
    args = GateJob(input=str(src), out=str(tmp_path / "out.jsonl"), query_field="question", memories_field="mems",
                   chunk_size=3)
    work = tmp_path / "out.jsonl.parts"
    work.mkdir()
    return args, work


def test_a_run_is_resumed_only_with_the_embedder_backend_it_started_with(tmp_path):
    """A resumed run must not mix two backends' vectors; a manifest written before the setting existed
    ran torch."""
    from mdl_jax.gate import files, manifest

    args, work = _resume_setup(tmp_path)
    old = {k: v for k, v in manifest.fingerprint(args, "torch").items() if k != "embed_backend"}
    (work / "manifest.json").write_text(json.dumps({"version": files.MANIFEST_VERSION, "args": old,
                                                    "parts": [], "done": False}))
    resumed = manifest.read_manifest(work, manifest.fingerprint(args, "torch"))  # read as torch, and recorded
    assert resumed["args"] == {**old, "embed_backend": "torch"}
    with pytest.raises(files.GateInputError, match="embed_backend: 'torch' then, 'onnx' now.*"
                                                   "to resume it, run with --embed-backend torch"):
        manifest.read_manifest(work, manifest.fingerprint(args, "onnx"))


def test_a_bfloat16_run_is_resumed_only_on_a_cpu_of_its_bfloat16_kind(tmp_path):
    """OpenVINO's bfloat16 vectors differ between AMX and AVX512-BF16 CPUs: the manifest records the kind
    (``Embedder.backend_id``), and a resume on the other kind is refused, naming it. A manifest from
    before the kind was recorded is taken as this CPU's, and records it from then on."""
    from mdl_jax.gate import files, manifest

    args, work = _resume_setup(tmp_path)
    amx, avx = manifest.fingerprint(args, "openvino-bf16@amx_bf16"), manifest.fingerprint(args, "openvino-bf16@avx512_bf16")
    (work / "manifest.json").write_text(json.dumps({"version": files.MANIFEST_VERSION, "args": amx,
                                                    "parts": [], "done": False}))
    assert manifest.read_manifest(work, amx)["args"] == amx
    with pytest.raises(files.GateInputError, match="embed_backend: 'openvino-bf16@amx_bf16' then, "
                                                   "'openvino-bf16@avx512_bf16' now.*resume it on a CPU with amx_bf16"):
        manifest.read_manifest(work, avx)
    with pytest.raises(files.GateInputError, match="resume it on a CPU with amx_bf16, with --embed-backend openvino-bf16"):
        manifest.read_manifest(work, manifest.fingerprint(args, "onnx"))
    (work / "manifest.json").write_text(json.dumps({"version": files.MANIFEST_VERSION, "parts": [], "done": False,
                                                    "args": {**amx, "embed_backend": "openvino-bf16"}}))
    assert manifest.read_manifest(work, avx)["args"] == avx


def test_the_manifest_names_the_cpus_bfloat16_kind_of_an_openvino_embedder(tmp_path, monkeypatch):
    """What the gate records: the backend, and for bfloat16 the CPU's kind (the cache key's suffix)."""
    from mdl_jax.signals import embeddings, onnx_encoder

    monkeypatch.setattr(onnx_encoder, "cpu_bf16_kind", lambda: "amx_bf16")
    assert embeddings.Embedder(cache_dir=tmp_path, backend="openvino-bf16").backend_id == "openvino-bf16@amx_bf16"
    assert embeddings.Embedder(cache_dir=tmp_path, backend="onnx").backend_id == "onnx"
    assert embeddings.Embedder(cache_dir=tmp_path, backend="torch").backend_id == "torch"


class _StandIn:
    """An encoder that loaded (the failure path: OpenVINO, failing at inference after ``good`` calls;
    or its fallback): unit stand-in vectors, so the test needs no export."""

    def __init__(self, good: int | None = None):
        self.good = good

    def encode(self, texts, **kw):
        if self.good is not None:
            if self.good <= 0:
                raise RuntimeError("openvino: Exception from src/inference: cannot infer this shape")
            self.good -= 1
        return np.tile(np.eye(384, dtype=np.float32)[:1], (len(texts), 1))


def _auto_on_a_bf16_cpu(monkeypatch, openvino_good: int) -> None:
    """"auto" on a CPU declared to have bfloat16, openvino declared installed (so this runs where it is
    not): OpenVINO a ``_StandIn`` failing after ``openvino_good`` calls, ONNX Runtime one that never fails."""
    import importlib.util

    from mdl_jax.signals import embeddings, onnx_encoder

    monkeypatch.setattr(onnx_encoder, "load", lambda path, cache, backend, model_id=None: _StandIn(
        openvino_good if backend == "openvino-bf16" else None))
    monkeypatch.setattr(onnx_encoder, "cpu_bf16_kind", lambda: "avx512_bf16")
    monkeypatch.setattr(embeddings, "_AUTO_FAILED", set())
    real_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "openvino" else real_spec(name, *a))


def test_a_backend_that_fails_mid_run_stops_the_run_before_a_part_mixes_two_backends(rows, tmp_path,
                                                                                      monkeypatch, capsys):
    """OpenVINO that fails at inference in the second part: "auto" goes on with ONNX Runtime, and the run
    stops with one error naming both instead of writing a part (or a run) of two backends' vectors; the
    first part stays on disk for the rerun."""
    from mdl_jax.signals import embeddings, onnx_encoder

    _auto_on_a_bf16_cpu(monkeypatch, openvino_good=1)
    out = tmp_path / "out.jsonl"
    with pytest.warns(RuntimeWarning, match="runs it with onnx instead"):
        assert main(["gate", str(_jsonl(tmp_path / "in.jsonl", rows[:6])), "--out", str(out), *FIELDS,
                     "--cache-dir", str(tmp_path / "cache"), "--chunk-size", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert ("failed with openvino-bf16@avx512_bf16 during this run and 'auto' went on with onnx" in err
            and "The parts written so far (1)" in err and "--embed-backend onnx" in err), err
    man = json.loads((tmp_path / "out.jsonl.parts" / "manifest.json").read_text())
    assert len(man["parts"]) == 1 and man["args"]["embed_backend"] == "openvino-bf16@avx512_bf16"
    assert not out.exists()
    # the same command again (a new process: nothing marked failed), OpenVINO well this time: it resumes
    monkeypatch.setattr(embeddings, "_AUTO_FAILED", set())
    monkeypatch.setattr(onnx_encoder, "load", lambda path, cache, backend, model_id=None: _StandIn())
    assert main(["gate", str(tmp_path / "in.jsonl"), "--out", str(out), *FIELDS,
                 "--cache-dir", str(tmp_path / "cache"), "--chunk-size", "3", "--no-progress"]) == 0
    assert len(out.read_text().splitlines()) == 6
    assert "embedder backend openvino-bf16@avx512_bf16" in capsys.readouterr().err


def test_a_backend_that_fails_in_the_first_part_leaves_the_run_on_the_next_backend(rows, tmp_path, monkeypatch,
                                                                                   capsys):
    """Before any part is written nothing can mix: the run takes the backend "auto" went on with, decides
    the part again under it, records it, and finishes."""
    _auto_on_a_bf16_cpu(monkeypatch, openvino_good=0)
    out = tmp_path / "out.jsonl"
    with pytest.warns(RuntimeWarning, match="runs it with onnx instead"):
        assert main(["gate", str(_jsonl(tmp_path / "in.jsonl", rows[:6])), "--out", str(out), *FIELDS,
                     "--cache-dir", str(tmp_path / "cache"), "--chunk-size", "3", "--no-progress"]) == 0
    assert len(out.read_text().splitlines()) == 6
    assert "embedder backend onnx" in capsys.readouterr().err


@pytest.mark.slow
def test_the_manifest_records_the_backend_that_runs_after_an_auto_fallback(rows, tmp_path, cache_dir, capsys,
                                                                         monkeypatch):
    """An ONNX load that fails (faked: the failure path) falls back to torch before the run is fingerprinted:
    its parts and its record say torch, so a resume cannot mix the two."""
    pytest.importorskip("onnxruntime")
    from mdl_jax.signals import onnx_encoder

    def broken(*a, **k):
        raise RuntimeError("exporter: an operator it cannot convert")

    monkeypatch.setattr(onnx_encoder, "load", broken)
    out = tmp_path / "out.parquet"
    with pytest.warns(RuntimeWarning, match="backend 'auto' runs it with torch instead"):
        assert main(["gate", str(_jsonl(tmp_path / "in.jsonl", rows[:4])), "--out", str(out), *FIELDS,
                     "--cache-dir", str(cache_dir), "--no-progress"]) == 0
    assert "embedder backend torch" in capsys.readouterr().err


@pytest.mark.slow
def test_the_embed_backend_flag_reaches_the_gate_and_the_summary(rows, tmp_path, embedder, cache_dir, capsys):
    """``--embed-backend torch`` pins sentence-transformers: the session embedder's decisions, to the bit."""
    want = MemoryGate(embedder=embedder).decide_batch([r["question"] for r in rows], [r["mems"] for r in rows])
    out = tmp_path / "out.parquet"
    assert main(["gate", str(_jsonl(tmp_path / "in.jsonl", rows)), "--out", str(out), *FIELDS,
                 "--cache-dir", str(cache_dir), "--embed-backend", "torch", "--no-progress"]) == 0
    got = pd.read_parquet(out)
    assert got["mdl_action"].tolist() == [d.action_name for d in want]
    np.testing.assert_array_equal(got["mdl_C_final"], np.float32([d.scalars["C_final"] for d in want]))
    assert "embedder backend torch" in capsys.readouterr().err


@pytest.mark.slow
def test_a_damaged_embedding_cache_is_set_aside_and_the_run_goes_on(rows, tmp_path, embedder, capsys):
    """An embeddings.sqlite overwritten with other bytes: the run warns naming it, rebuilds it and
    decides every row as the gate does (no sqlite3 traceback, exit 0)."""
    rows = rows[:5]
    (tmp_path / "cache").mkdir()
    damaged = tmp_path / "cache" / "embeddings.sqlite"
    damaged.write_bytes(np.random.default_rng(0).bytes(1 << 16))
    out = tmp_path / "out.parquet"
    with pytest.warns(RuntimeWarning, match=rf"embedding cache {damaged} is damaged .* set aside as"):
        rc = main(["gate", str(_jsonl(tmp_path / "in.jsonl", rows)), "--out", str(out), *FIELDS,
                   "--cache-dir", str(tmp_path / "cache"), "--embed-backend", "torch", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    want = MemoryGate(embedder=embedder).decide_batch([r["question"] for r in rows], [r["mems"] for r in rows])
    assert pd.read_parquet(out)["mdl_action"].tolist() == [d.action_name for d in want]
    assert any(p.name.startswith("embeddings.sqlite.corrupt-") for p in damaged.parent.iterdir())


# --- a resume onto changed inputs; strict JSON in and out; the error on a line of its own -------------

HASHED = ["--embedder", "tests.gate_embedders:hashed", "--no-progress"]


def _my_rows(n, tag="a"):
    return [{"question": f"is thing {i} {tag} safe?", "cat": "x",
             "mems": [f"thing {i} is safe", f"thing {i} is not safe", f"thing {i} is {tag}"]} for i in range(n)]


def _interrupted(monkeypatch, argv, after_parts=2):
    """Run ``argv`` and stop it (a Ctrl-C) as part ``after_parts`` + 1 is decided: the parts before stay."""
    from mdl_jax.gate import files

    decide, calls = files._decide_chunk, []

    def stops(*a):
        calls.append(1)
        if len(calls) > after_parts:
            raise KeyboardInterrupt
        return decide(*a)

    with monkeypatch.context() as m:
        m.setattr(files, "_decide_chunk", stops)
        with pytest.raises(KeyboardInterrupt):
            main(argv)


def _rewrite_keeping_size_and_mtime(path, write):
    st = path.stat()
    write(path)
    assert path.stat().st_size == st.st_size  # what the earlier fingerprint compared
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _write_input(kind, path, rows):
    if kind == "jsonl":
        _jsonl(path, rows)
    elif kind == "csv":
        pd.DataFrame(rows).assign(mems=lambda d: d.mems.map(json.dumps)).to_csv(path, index=False)
    else:
        pd.DataFrame(rows).to_parquet(path, compression=None)


def _one_error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mdl-jax: error: "), err
    return err[0]


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
def test_a_resume_onto_an_input_rewritten_with_the_same_size_and_mtime_is_refused(kind, tmp_path, monkeypatch,
                                                                                capsys):
    """The parts on disk came from the old rows: resuming onto the new ones would join both in one output.
    Refused with one line saying IN changed; --restart starts over and gives a fresh run's output."""
    src, out, ref = tmp_path / f"in.{kind}", tmp_path / "out.jsonl", tmp_path / "ref.jsonl"
    _write_input(kind, src, _my_rows(12, "a"))
    argv = ["gate", str(src), "--out", str(out), *FIELDS, "--chunk-size", "3", *HASHED]
    _interrupted(monkeypatch, argv)
    _rewrite_keeping_size_and_mtime(src, lambda p: _write_input(kind, p, _my_rows(12, "b")))
    capsys.readouterr()
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert "holds an unfinished run, and IN (" in line and "changed since it began" in line and "--restart" in line
    assert not out.exists() and (tmp_path / "out.jsonl.parts" / "manifest.json").exists()  # left as it was
    assert main(argv + ["--restart"]) == 0
    assert main(["gate", str(src), "--out", str(ref), *FIELDS, "--chunk-size", "3", *HASHED]) == 0
    assert out.read_text() == ref.read_text() and " b safe" in out.read_text() and " a safe" not in out.read_text()


def test_a_resume_onto_an_input_that_only_grew_continues_and_one_touched_resumes(tmp_path, monkeypatch):
    """What the parts came from is unchanged: an appended file resumes into its new rows, a touched one
    resumes too; the output is a fresh run's over the file as it is."""
    src, out, ref = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "ref.jsonl"
    _jsonl(src, _my_rows(9))
    argv = ["gate", str(src), "--out", str(out), *FIELDS, "--chunk-size", "3", *HASHED]
    _interrupted(monkeypatch, argv)
    _jsonl(src, _my_rows(14))
    os.utime(src, ns=(1, 1))
    assert main(argv) == 0
    assert main(["gate", str(src), "--out", str(ref), *FIELDS, "--chunk-size", "3", *HASHED]) == 0
    assert out.read_text() == ref.read_text() and len(out.read_text().splitlines()) == 14


def test_a_resume_onto_a_dataset_folder_saved_again_is_refused(tmp_path, monkeypatch, capsys):
    datasets = pytest.importorskip("datasets")
    src, out = tmp_path / "hf", tmp_path / "out.parquet"
    datasets.Dataset.from_list(_my_rows(12, "a")).save_to_disk(str(src))
    argv = ["gate", str(src), "--out", str(out), *FIELDS, "--chunk-size", "3", *HASHED]
    _interrupted(monkeypatch, argv)
    datasets.Dataset.from_list(_my_rows(12, "b")).save_to_disk(str(src))
    capsys.readouterr()
    assert main(argv) == 2
    assert "IN (" in _one_error_line(capsys)
    assert main(argv + ["--restart"]) == 0
    assert all(" b safe" in q for q in pd.read_parquet(out)["question"])


@pytest.mark.parametrize("what", ["config", "risk table", "embedder"])
def test_a_resume_after_the_config_risk_table_or_embedder_changed_is_refused(what, tmp_path, monkeypatch, capsys):
    """Each is named by the same argument as before, its content edited: the parts on disk were decided
    under the old one. The refusal names what changed."""
    import dataclasses

    from mdl_jax.controller.config import MDLConfig
    from mdl_jax.controller.config_file import save_config

    src, out = _jsonl(tmp_path / "in.jsonl", _my_rows(12)), tmp_path / "out.jsonl"
    config, table = tmp_path / "cfg.json", tmp_path / "table.json"
    save_config(MDLConfig(), config)
    table.write_text(json.dumps({"x": 0.2}))
    module = tmp_path / f"emb_{abs(hash(str(tmp_path)))}.py"
    module.write_text("from tests.gate_embedders import hashed as embed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["gate", str(src), "--out", str(out), *FIELDS, "--chunk-size", "3", "--no-progress",
            "--config", str(config), "--risk", str(table), "--category-field", "cat",
            "--embedder", f"{module.stem}:embed"]
    _interrupted(monkeypatch, argv)
    if what == "config":
        save_config(dataclasses.replace(MDLConfig(), sigma=0.3), config)
    elif what == "risk table":
        table.write_text(json.dumps({"x": 0.9}))
    else:  # the module's file edited (this process keeps the module it imported; a new one would not)
        module.write_text("from tests.gate_embedders import slow as embed\n")
    capsys.readouterr()
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert f"and the {what} (" in line and "changed since it began" in line and "--restart" in line, line
    assert main(argv + ["--restart"]) == 0


def test_an_unfinished_run_of_an_older_manifest_is_refused_as_unverifiable(tmp_path, capsys):
    """A version-3 manifest recorded the input's size and mtime only: nothing proves the input unchanged."""
    src, out = _jsonl(tmp_path / "in.jsonl", _my_rows(6)), tmp_path / "out.jsonl"
    work = tmp_path / "out.jsonl.parts"
    work.mkdir(mode=0o700)
    old_args = {"input": str(src.resolve()), "size": src.stat().st_size, "mtime_ns": src.stat().st_mtime_ns,
                "query_field": "question", "memories_field": "mems", "risk_field": None, "category_field": None,
                "risk": "0.5", "config": None, "embedder": "tests.gate_embedders:hashed", "split": "train",
                "chunk_size": 3, "on_bad_row": "error", "embed_backend": None}
    (work / "manifest.json").write_text(json.dumps({"version": 3, "args": old_args, "parts": [], "done": False}))
    argv = ["gate", str(src), "--out", str(out), *FIELDS, "--chunk-size", "3", *HASHED]
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert "an older mdl-jax gate" in line and "cannot verify" in line and "--restart" in line
    assert main(argv + ["--restart"]) == 0 and len(out.read_text().splitlines()) == 6


def test_a_part_missing_or_changed_on_disk_is_refused_not_joined(tmp_path, monkeypatch, capsys):
    src, out = _jsonl(tmp_path / "in.jsonl", _my_rows(12)), tmp_path / "out.jsonl"
    argv = ["gate", str(src), "--out", str(out), *FIELDS, "--chunk-size", "3", *HASHED]
    _interrupted(monkeypatch, argv)
    part = tmp_path / "out.jsonl.parts" / "part-000001.jsonl"
    part.write_text(part.read_text()[:-10])
    capsys.readouterr()
    assert main(argv) == 2
    assert "part-000001.jsonl is missing or not as it was written" in _one_error_line(capsys)


def test_a_line_nested_100000_deep_is_a_bad_row_named_or_skipped(tmp_path, capsys):
    rows = _my_rows(4)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(rows[0]) + "\n" + '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
                   + json.dumps(rows[1]) + "\n" + json.dumps({**rows[2], "d": [[[[1]]]] * 3}) + "\n")
    out = tmp_path / "out.parquet"
    argv = ["gate", str(src), "--out", str(out), *FIELDS, "--chunk-size", "2", *HASHED]
    assert main(argv) == 2
    assert f"{src}, line 2: not a JSON object (nested deeper than MAX_JSON_DEPTH" in _one_error_line(capsys)
    assert main(argv + ["--on-bad-row", "skip"]) == 0
    assert "1 bad rows skipped" in capsys.readouterr().err
    assert pd.read_parquet(out)["mdl_row"].tolist() == [0, 2, 3]


def test_a_line_nested_at_the_bound_reaches_both_outputs(tmp_path):
    """MAX_JSON_DEPTH levels are a row: the checks and both writers walk it."""
    from mdl_jax.gate import files

    deep: list = []
    for _ in range(files.MAX_JSON_DEPTH - 3):  # [] is 1 level; the row's object and "d"'s list 2 more
        deep = [deep]
    src = _jsonl(tmp_path / "in.jsonl", [{**_my_rows(1)[0], "d": [deep]}])
    for out in (tmp_path / "out.jsonl", tmp_path / "out.parquet"):
        assert main(["gate", str(src), "--out", str(out), *FIELDS, *HASHED]) == 0
    # Parquet holds a column that deep as JSON text (its own readers stop far sooner)
    assert json.loads(pd.read_parquet(tmp_path / "out.parquet")["d"][0]) == [deep]


def test_a_line_past_max_line_bytes_is_a_bad_row_the_next_lines_read_as_ever(tmp_path, monkeypatch, capsys):
    from mdl_jax.gate import reading

    monkeypatch.setattr(reading, "MAX_LINE_BYTES", 200)
    rows = _my_rows(5)
    long_row = json.dumps({**rows[1], "pad": "x" * 1000})
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows[:1]) + long_row + "\n"
                   + "".join(json.dumps(r) + "\n" for r in rows[2:]) + long_row)  # the last one unterminated
    out = tmp_path / "out.jsonl"
    assert main(["gate", str(src), "--out", str(out), *FIELDS, "--chunk-size", "2", "--on-bad-row", "skip",
                 *HASHED]) == 0
    assert "line 2: line longer than MAX_LINE_BYTES = 200 bytes" in capsys.readouterr().err
    assert [json.loads(x)["mdl_row"] for x in out.read_text().splitlines()] == [0, 2, 3, 4]


def _strict(text):
    def refuse(name):
        raise ValueError(name)
    return [json.loads(x, parse_constant=refuse) for x in text.splitlines()]


def test_nan_or_infinity_in_a_jsonl_row_is_a_bad_row_and_the_output_is_strict_json(tmp_path, capsys):
    rows = _my_rows(4)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(rows[0]) + "\n" + json.dumps({**rows[1], "score": float("nan")}) + "\n"
                   + json.dumps({**rows[2], "n": [1e999]}).replace("Infinity", "1e999") + "\n"
                   + json.dumps({**rows[3], "score": 0.5}) + "\n")
    out = tmp_path / "out.jsonl"
    argv = ["gate", str(src), "--out", str(out), *FIELDS, *HASHED]
    assert main(argv) == 2
    assert f"{src}, line 2: not a JSON object (NaN is not JSON" in _one_error_line(capsys)
    assert main(argv + ["--on-bad-row", "skip"]) == 0
    assert "line 3: not a JSON object (the number 1e999 is past a double's range)" in capsys.readouterr().err
    assert [r["mdl_row"] for r in _strict(out.read_text())] == [0, 3]


def test_nan_from_a_parquet_float_is_written_to_jsonl_as_null_and_said(tmp_path, capsys):
    src, out = tmp_path / "in.parquet", tmp_path / "out.jsonl"
    pd.DataFrame(_my_rows(3)).assign(score=[0.5, float("nan"), float("-inf")]).to_parquet(src)
    assert main(["gate", str(src), "--out", str(out), *FIELDS, *HASHED]) == 0
    assert "'score' held NaN or infinite numbers, written as null" in capsys.readouterr().err
    assert [r["score"] for r in _strict(out.read_text())] == [0.5, None, None]


@pytest.mark.parametrize("content, match", [
    (b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", r"is not a JSON object \(nested deeper than"),
    (b'{"x": 0.5, "caf\xe9": 0.1}', r"is not a JSON object \('utf-8' codec can't decode"),
    (b'{"x": ' + b"1" * 5000 + b"}", r"is not a JSON object \(Exceeds the limit"),
    (b'{"x": NaN}', r"is not a JSON object \(NaN is not JSON"),
    (b'{"x": [0.5]}', r"'x' maps to a JSON list; expected a number in \[0, 1\]"),
    (b'[0.5]', r"is a JSON list; expected an object"),
    (b'{"medical": 0.9, "x": 0.5, "medical": 0.1}', r"table\.json: medical: stated twice in one object"),
], ids=["nested-100000-deep", "not-utf8", "5000-digits", "nan", "a-list-value", "not-an-object",
        "a-category-twice"])
def test_a_bad_risk_table_is_one_line_and_exit_2(content, match, tmp_path, capsys):
    import re

    table = tmp_path / "table.json"
    table.write_bytes(content)
    src = _jsonl(tmp_path / "in.jsonl", _my_rows(2))
    assert main(["gate", str(src), "--out", str(tmp_path / "o.jsonl"), *FIELDS, "--risk", str(table),
                 "--category-field", "cat", *HASHED]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"mdl-jax: error: --risk: the risk table {table}") and re.search(match, line), line


def test_a_risk_table_that_is_a_fifo_is_refused_without_blocking(tmp_path, capsys):
    table = tmp_path / "table.json"
    os.mkfifo(table)
    src = _jsonl(tmp_path / "in.jsonl", _my_rows(2))
    assert main(["gate", str(src), "--out", str(tmp_path / "o.jsonl"), *FIELDS, "--risk", str(table),
                 "--category-field", "cat", *HASHED]) == 2
    assert "is not a regular file" in _one_error_line(capsys)


def test_the_error_line_starts_a_line_of_its_own_after_the_progress_bar(tmp_path, capsys):
    rows = _my_rows(6)
    del rows[4]["question"]
    src = _jsonl(tmp_path / "in.jsonl", rows)
    assert main(["gate", str(src), "--out", str(tmp_path / "o.jsonl"), *FIELDS, "--chunk-size", "2",
                 "--embedder", "tests.gate_embedders:hashed"]) == 2
    err = capsys.readouterr().err
    assert "mdl-jax gate" in err and "\nmdl-jax: error: " in err, err  # the bar was drawn, then ended


def test_a_missing_query_field_names_the_flag_that_picks_it(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl", _my_rows(2))
    assert main(["gate", str(src), "--out", str(tmp_path / "o.jsonl"), "--memories-field", "mems", *HASHED]) == 2
    line = _one_error_line(capsys)
    assert "field 'query': missing (fields: ['cat', 'mems', 'question']); name the row's field with " \
           "--query-field" in line, line


def test_a_hub_dataset_resumes_only_onto_the_rows_its_parts_came_from(tmp_path, monkeypatch, capsys):
    """A Hub dataset's rows are digested as they stream; a resume streams its first rows again and checks
    them. The Hub cannot be reached here: ``load_dataset`` hands out a local streaming dataset instead."""
    datasets = pytest.importorskip("datasets")
    served = {"rows": _my_rows(12, "a")}
    monkeypatch.setattr(datasets, "load_dataset", lambda name, split, streaming: datasets.IterableDataset.from_generator(
        lambda: iter(list(served["rows"]))))
    out, ref = tmp_path / "out.jsonl", tmp_path / "ref.jsonl"
    argv = ["gate", "owner/name", "--out", str(out), *FIELDS, "--chunk-size", "3", *HASHED]
    _interrupted(monkeypatch, argv)
    assert main(argv) == 0  # unchanged: resumed
    assert main(["gate", "owner/name", "--out", str(ref), *FIELDS, "--chunk-size", "3", *HASHED]) == 0
    assert out.read_text() == ref.read_text() and len(ref.read_text().splitlines()) == 12
    out.unlink()
    _interrupted(monkeypatch, argv)
    served["rows"] = _my_rows(5, "a") + _my_rows(12, "b")[5:]  # a row of the parts' changed
    capsys.readouterr()
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert "IN: owner/name's rows changed since it began (its first 7 rows" in line and "--restart" in line, line
    assert main(argv + ["--restart"]) == 0


def test_a_csv_memories_cell_nested_100000_deep_is_a_bad_row(tmp_path, capsys):
    rows = _my_rows(3)
    df = pd.DataFrame(rows).assign(mems=lambda d: d.mems.map(json.dumps))
    df.loc[1, "mems"] = "[" * 100_000 + "]" * 100_000
    src, out = tmp_path / "in.csv", tmp_path / "out.jsonl"
    df.to_csv(src, index=False)
    assert main(["gate", str(src), "--out", str(out), *FIELDS, "--on-bad-row", "skip", *HASHED]) == 0
    assert "row 2: field 'mems': expected a JSON list of memories in the CSV cell" in capsys.readouterr().err
    assert [r["mdl_row"] for r in _strict(out.read_text())] == [0, 2]


# --- hostile input: planted symlinks, wide rows, bad text, broken files, the gate's own columns, durability ---


def _gate(src, out, *extra):
    return main(["gate", str(src), "--out", str(out), *HASHED, *extra])


def _err_line(capsys):
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("mdl-jax: error:")]
    assert len(err) == 1, err
    return err[0]


def _parts(out):
    return out.with_name(out.name + ".parts")


@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim.txt"
    v.write_text("the user's precious file\n")
    return v


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_symlink_planted_at_OUT_tmp_is_never_followed(tmp_path, victim, suffix):
    src = _jsonl(tmp_path / "in.jsonl", gate_rows.rows(5))
    out = tmp_path / f"out{suffix}"
    (tmp_path / f"out{suffix}.tmp").symlink_to(victim)
    assert _gate(src, out) == 0
    assert victim.read_text() == "the user's precious file\n"
    assert out.is_file() and not out.is_symlink() and len(out.read_bytes()) > 0


def test_a_symlink_planted_at_the_manifests_temp_name_is_never_followed(tmp_path, victim):
    src = _jsonl(tmp_path / "in.jsonl", gate_rows.rows(5))
    out = tmp_path / "out.jsonl"
    _parts(out).mkdir()
    (_parts(out) / "manifest.json.tmp").symlink_to(victim)
    (_parts(out) / "part-000000.jsonl.tmp").symlink_to(victim)
    assert _gate(src, out, "--chunk-size", "2") == 0
    assert victim.read_text() == "the user's precious file\n"
    assert [json.loads(ln)["id"] for ln in out.read_text().splitlines()] == list(range(5))
    assert not _parts(out).exists()


def test_a_symlink_planted_at_the_lock_is_refused_not_truncated(tmp_path, victim, capsys):
    src = _jsonl(tmp_path / "in.jsonl", gate_rows.rows(5))
    out = tmp_path / "out.jsonl"
    _parts(out).mkdir()
    (_parts(out) / "lock").symlink_to(victim)
    assert _gate(src, out) == 2
    assert "parts/lock: it is a symbolic link" in _err_line(capsys)
    assert victim.read_text() == "the user's precious file\n"
    assert not out.exists()


def test_a_parts_folder_that_is_a_symlink_is_refused(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl", gate_rows.rows(5))
    out = tmp_path / "out.jsonl"
    theirs = tmp_path / "someone_elses_folder"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("keep")
    _parts(out).symlink_to(theirs, target_is_directory=True)
    assert _gate(src, out) == 2
    assert "symbolic link or not a folder" in _err_line(capsys)
    assert sorted(p.name for p in theirs.iterdir()) == ["keep.txt"]
    assert not out.exists()


def test_a_parts_folder_others_can_write_is_refused(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl", gate_rows.rows(5))
    out = tmp_path / "out.jsonl"
    _parts(out).mkdir()
    _parts(out).chmod(0o777)
    assert _gate(src, out) == 2
    assert "is writable by other users" in _err_line(capsys)
    assert _parts(out).is_dir() and not out.exists()


def test_a_manifest_that_is_not_ours_is_one_line_and_left_alone(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl", gate_rows.rows(5))
    out = tmp_path / "out.jsonl"
    _parts(out).mkdir()
    (_parts(out) / "manifest.json").write_text("{not json")
    assert _gate(src, out) == 2
    assert "is not a manifest" in _err_line(capsys)
    assert (_parts(out) / "manifest.json").read_text() == "{not json"


def test_a_row_over_MAX_MEMORIES_is_one_line_naming_the_row_or_skipped(tmp_path, capsys):
    rows = gate_rows.rows(3) + [gate_rows.wide(MAX_MEMORIES + 1)] + gate_rows.rows(2, 3)
    src = _jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    assert _gate(src, out) == 2
    line = _err_line(capsys)
    assert f"{src}, line 4: field 'memories': expected at most {MAX_MEMORIES:,} memories" in line
    assert f"got {MAX_MEMORIES + 1:,}" in line and not _parts(out).exists() and not out.exists()
    assert _gate(src, out, "--on-bad-row", "skip") == 0
    got = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [r["id"] for r in got] == [0, 1, 2, 3, 4] and [r["mdl_row"] for r in got] == [0, 1, 2, 4, 5]
    assert "1 bad rows skipped" in capsys.readouterr().err


@pytest.mark.parametrize("field", ["query", "memory", "passed-through"])
def test_a_lone_surrogate_is_one_line_naming_the_row_or_a_skipped_row(tmp_path, capsys, field):
    bad = {"query": '"is \\ud800 safe?"', "memory": '["fine", "a \\udfff memory"]',
           "passed-through": '"x"'}
    query = bad["query"] if field == "query" else '"q?"'
    mems = bad["memory"] if field == "memory" else '["m"]'
    note = '{"k": ["ok", "\\ud83d"]}' if field == "passed-through" else '"n"'
    line = f'{{"id": 1, "query": {query}, "memories": {mems}, "note": {note}}}'
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(gate_rows.rows(1)[0]) + "\n" + line + "\n" + json.dumps(gate_rows.rows(1, 2)[0]) + "\n")
    for suffix in (".jsonl", ".parquet"):
        out = tmp_path / f"out{suffix}"
        assert _gate(src, out) == 2
        msg = _err_line(capsys)
        want = {"query": "field 'query'", "memory": "field 'memories'[1]", "passed-through": "field 'note'['k'][1]"}
        assert f"{src}, line 2: {want[field]}: holds a lone surrogate" in msg
        assert not _parts(out).exists() and not out.exists()
        assert _gate(src, out, "--on-bad-row", "skip") == 0
        assert "1 bad rows skipped" in capsys.readouterr().err
        got = (pq.read_table(out).to_pylist() if suffix == ".parquet"
               else [json.loads(ln) for ln in out.read_text().splitlines()])
        assert [r["mdl_row"] for r in got] == [0, 2]


def test_a_csv_cell_over_128_kB_is_read(tmp_path):
    import csv

    src = tmp_path / "in.csv"
    big = json.dumps(["a memory that is long " * 10_000, "a short one"])  # ~220 kB in one cell
    with open(src, "w", newline="") as f:
        csv.writer(f).writerows([["query", "memories"], ["is it safe?", big], ["another?", '["x"]']])
    out = tmp_path / "out.jsonl"
    assert _gate(src, out) == 0
    got = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [r["mdl_row"] for r in got] == [0, 1] and json.loads(got[0]["memories"])[1] == "a short one"


def test_a_csv_cell_over_the_limit_is_one_line_naming_the_row(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(reading, "CSV_FIELD_LIMIT", 1000)
    src = tmp_path / "in.csv"
    src.write_text('query,memories\n"ok?","[""x""]"\n"big?","[""' + "y" * 2000 + '""]"\n')
    out = tmp_path / "out.jsonl"
    assert _gate(src, out, "--on-bad-row", "skip") == 2
    msg = _err_line(capsys)
    assert f"{src}, row 2: not readable as CSV" in msg and "CSV_FIELD_LIMIT = 1,000" in msg
    assert not _parts(out).exists() and not out.exists()
    import csv
    assert csv.field_size_limit() == 131072  # the process-wide limit is put back


def _parquet(path, n=40, group=10):
    pq.write_table(pa.Table.from_pylist(gate_rows.rows(n)), path, row_group_size=group, compression="snappy")
    return path


def test_a_truncated_parquet_input_is_one_line_naming_the_file(tmp_path, capsys):
    src = _parquet(tmp_path / "in.parquet")
    data = src.read_bytes()
    src.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out.jsonl"
    assert _gate(src, out) == 2
    assert f"IN: {src}: not a readable Parquet file" in _err_line(capsys)
    assert not _parts(out).exists() and not out.exists()


def test_a_parquet_input_corrupt_mid_file_is_one_line_naming_the_rows(tmp_path, capsys):
    """The footer reads, the third row group's pages do not: two parts were written; the error names
    rows 21-30 and nothing is left behind."""
    src = _parquet(tmp_path / "in.parquet")
    col = pq.ParquetFile(src).metadata.row_group(2).column(0)
    data = bytearray(src.read_bytes())
    data[col.data_page_offset: col.data_page_offset + col.total_compressed_size] = \
        b"\xab" * col.total_compressed_size
    src.write_bytes(bytes(data))
    out = tmp_path / "out.parquet"
    assert _gate(src, out, "--chunk-size", "10") == 2
    msg = _err_line(capsys)
    assert f"IN: {src}, rows 21-30: not readable as Parquet" in msg and "truncated or overwritten" in msg
    assert not _parts(out).exists() and not out.exists()


def test_a_crash_before_any_part_leaves_nothing_behind(tmp_path, monkeypatch):
    def crash(*a, **k):
        raise RuntimeError("a bug in the part writer")

    monkeypatch.setattr(files, "write_part", crash)
    src = _jsonl(tmp_path / "in.jsonl", gate_rows.rows(3))
    out = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError, match="a bug in the part writer"):
        _gate(src, out)
    assert not _parts(out).exists() and not out.exists()


@pytest.mark.parametrize("name, raised", [("broken", "RuntimeError: embedder down"),
                                          ("bad_argument", "ValueError: texts must be lower-case")])
def test_a_users_embedder_that_raises_is_one_line_naming_it_exit_2(tmp_path, capsys, name, raised):
    """A --embedder module:function whose code raises ended in its traceback, exit 1 (or, a ValueError,
    as the rows' error and "the callable's result is not an array"): it is the user's to fix, one line
    naming the flag, the exception's type and message, exit 2, and nothing left behind."""
    src = _jsonl(tmp_path / "in.jsonl", gate_rows.rows(3))
    out = tmp_path / "out.jsonl"
    assert main(["gate", str(src), "--out", str(out), "--embedder", f"tests.gate_embedders:{name}",
                 "--no-progress"]) == 2
    assert _err_line(capsys) == f"mdl-jax: error: --embedder tests.gate_embedders:{name}: the function raised {raised}"
    assert not _parts(out).exists() and not out.exists()


@pytest.mark.parametrize("body, raised", [("raise RuntimeError('no credentials for the service')",
                                          "RuntimeError: no credentials for the service"),
                                         ("def embed(texts) return texts", "SyntaxError: ")])
def test_a_users_embedder_module_that_fails_to_import_is_one_line_naming_it_exit_2(tmp_path, capsys, monkeypatch,
                                                                                   body, raised):
    """A --embedder module:function whose module raises as it is imported (its own code run at import,
    or a syntax error) ended in the traceback of the import: one line naming the flag, exit 2, as for
    a module that cannot be found."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "users_embedder_at_fault.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    src = _jsonl(tmp_path / "in.jsonl", gate_rows.rows(3))
    out = tmp_path / "out.jsonl"
    assert main(["gate", str(src), "--out", str(out), "--embedder", "users_embedder_at_fault:embed",
                 "--no-progress"]) == 2
    assert _err_line(capsys).startswith("mdl-jax: error: --embedder users_embedder_at_fault:embed: importing it "
                                        f"raised {raised}")
    assert not _parts(out).exists() and not out.exists()


def test_a_users_embedder_that_fails_mid_run_keeps_the_parts_written(tmp_path, capsys):
    """Its rows were decided: the parts on disk stay for a rerun to resume, as after a crash."""
    gate_embedders.CALLS[0] = 0
    src = _jsonl(tmp_path / "in.jsonl", gate_rows.rows(6))
    out = tmp_path / "out.jsonl"
    assert main(["gate", str(src), "--out", str(out), "--embedder", "tests.gate_embedders:fails_after_one",
                 "--chunk-size", "3", "--no-progress"]) == 2
    assert "the function raised ConnectionError: the embedding service went away" in _err_line(capsys)
    assert [p.name for p in sorted(_parts(out).glob("part-*"))] == ["part-000000.jsonl"] and not out.exists()


def test_a_users_embedder_object_that_raises_is_one_line_naming_it_and_keeps_the_parts(tmp_path, capsys):
    """--embedder module:NAME naming an object with embed(texts): a ValueError its embed raised was
    named as the rows' error ("rows 4-6: ..."), and as bad input in a fresh run it removed the part
    already decided; it is one line naming the embedder, and the part stays for a rerun to resume."""
    gate_embedders.SERVICE.calls = 0
    src = _jsonl(tmp_path / "in.jsonl", gate_rows.rows(6))
    out = tmp_path / "out.jsonl"
    assert main(["gate", str(src), "--out", str(out), "--embedder", "tests.gate_embedders:SERVICE",
                 "--chunk-size", "3", "--no-progress"]) == 2
    assert _err_line(capsys) == ("mdl-jax: error: --embedder tests.gate_embedders:SERVICE: its embed raised "
                                 "ValueError: the service says the texts are too long")
    assert [p.name for p in sorted(_parts(out).glob("part-*"))] == ["part-000000.jsonl"] and not out.exists()
    gate_embedders.SERVICE.calls = -5   # the service is back: the rerun resumes and ends
    assert main(["gate", str(src), "--out", str(out), "--embedder", "tests.gate_embedders:SERVICE",
                 "--chunk-size", "3", "--no-progress"]) == 0
    assert len(out.read_text().splitlines()) == 6


@pytest.mark.parametrize("column", ["mdl_action", "mdl_row", "mdl_C_final", "mdl_n_relevant"])
def test_an_input_with_the_gates_output_columns_is_refused(tmp_path, capsys, column):
    rows = [{**r, column: "Active"} for r in gate_rows.rows(4)]
    src = _jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    assert _gate(src, out, "--on-bad-row", "skip") == 2
    msg = _err_line(capsys)
    assert f"{src}, line 1: field {column!r} is one of the gate's output columns" in msg
    assert not _parts(out).exists() and not out.exists()


def test_re_gating_a_gated_file_is_refused(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl", gate_rows.rows(4))
    once = tmp_path / "once.jsonl"
    assert _gate(src, once) == 0
    assert _gate(once, tmp_path / "twice.jsonl") == 2
    assert "field 'mdl_row' is one of the gate's output columns" in _err_line(capsys)
    written = json.loads(once.read_text().splitlines()[0])
    assert set(files.OUT_COLUMNS) == {k for k in written if k.startswith("mdl_")}  # the list is complete


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_part_and_its_folder_are_fsynced_before_the_manifest_names_it(tmp_path, monkeypatch, suffix):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        st = os.fstat(fd)
        events.append(("fsync-dir" if stat.S_ISDIR(st.st_mode) else "fsync",
                       os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(a, b):
        a, b = str(a), str(b)
        named = ([p["file"] for p in json.loads(Path(a).read_text())["parts"] if p["n_rows"]]
                 if b.endswith("manifest.json") else None)
        events.append(("replace", a, b, named))
        return real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    src = _jsonl(tmp_path / "in.jsonl", gate_rows.rows(7))
    out = tmp_path / f"out{suffix}"
    assert _gate(src, out, "--chunk-size", "2") == 0
    work = str(_parts(out))
    manifests = [i for i, e in enumerate(events) if e[0] == "replace" and e[2].endswith("manifest.json")]
    assert len(manifests) == 5  # four parts and the final "done"
    for i in manifests:
        tmp = events[i][1]
        assert os.path.dirname(tmp) == work and ("fsync", tmp) in events[:i]  # a fresh temp, fsynced
        assert events[i + 1] == ("fsync-dir", work)
        for name in events[i][3]:
            part = os.path.join(work, name)
            j = next(j for j, e in enumerate(events) if e[0] == "replace" and e[2] == part)
            assert j < i and ("fsync", events[j][1]) in events[:j]   # the part's bytes, on disk
            assert ("fsync-dir", work) in events[j + 1:i]             # and its name, before the manifest
    final = next(j for j, e in enumerate(events) if e[0] == "replace" and e[2] == str(out))
    assert ("fsync", events[final][1]) in events[:final] and events[final + 1] == ("fsync-dir", str(tmp_path))


def test_the_manifest_keeps_at_most_MAX_BAD_MESSAGES_and_counts_the_rest(tmp_path, monkeypatch, capsys):
    rows = gate_rows.rows(3) + [{"id": i, "query": "", "memories": ["m"]} for i in range(250)]
    src = _jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    seen = {}
    real = files._summary
    monkeypatch.setattr(files, "_summary", lambda man, o: (seen.update(man=man), real(man, o)))
    assert _gate(src, out, "--on-bad-row", "skip", "--chunk-size", "10") == 0
    man = seen["man"]
    assert sum(len(p["bad"]) for p in man["parts"]) <= 100
    assert sum(len(p["bad"]) for p in man["parts"]) == files.MAX_BAD_MESSAGES
    assert sum(p["n_bad"] for p in man["parts"]) == 250
    assert len(json.dumps(man)) < 40_000
    err = capsys.readouterr().err
    assert "3 rows decided" in err and "250 bad rows skipped" in err and "... and 245 more" in err


def test_rows_that_crashed_the_command_are_bad_rows(tmp_path, capsys):
    """A Parquet string that is not UTF-8, an int category for the "truthfulqa" preset and a risk past a
    double's range each ended the command with a traceback (exit 1), --on-bad-row skip or not."""
    vals = [b"What is the capital?", b"bad \xff query", b"And the river?"]
    offsets = np.cumsum([0] + [len(v) for v in vals]).astype(np.int32)
    q = pa.Array.from_buffers(pa.string(), 3, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(vals))])
    src = tmp_path / "bad_utf8.parquet"
    pq.write_table(pa.table({"question": q, "mems": pa.array([["capital paris"], ["x"], ["the seine"]])}), src)
    assert _gate(src, tmp_path / "a.jsonl", *FIELDS) == 2
    assert re.search(r"bad_utf8\.parquet, row 2: column .question.: a string that is not UTF-8", _err_line(capsys))
    assert _gate(src, tmp_path / "b.jsonl", *FIELDS, "--on-bad-row", "skip") == 0
    assert "2 rows decided" in capsys.readouterr().err
    rows = [{"question": "q capital", "mems": ["capital a"], "cat": 5, "A": 0.5},
            {"question": "q river", "mems": ["river b"], "cat": "Health", "A": 10 ** 400}]
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _gate(src, tmp_path / "c.jsonl", *FIELDS, "--risk", "truthfulqa", "--category-field", "cat") == 2
    assert "line 1: field 'cat': category: expected a string or None" in _err_line(capsys)
    assert _gate(src, tmp_path / "d.jsonl", *FIELDS, "--risk-field", "A") == 2
    assert re.search(r"line 2: field 'A': expected a number in \[0, 1\], got 1000", _err_line(capsys))


def test_a_core_install_without_the_embedding_extra_is_one_line_naming_it(tmp_path):
    """Only the core installed (sentence-transformers, ONNX Runtime and OpenVINO absent: blocked here),
    an empty cache: the gate cannot load its model, and says which extra to install in one line, exit 2,
    no traceback; ``MemoryGate`` raises the same as a ValueError."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"query": "capital of France?", "memories": ["Paris is the capital."]}) + "\n")
    code = ("import sys\n"
            "for m in ('sentence_transformers', 'openvino', 'onnxruntime', 'onnx'):\n"
            "    sys.modules[m] = None\n"
            "from mdl_jax.cli import main\n"
            "from mdl_jax.gate import MemoryGate\n"
            "try:\n"
            "    MemoryGate(risk=0.5).decide('capital of France?', ['Paris is the capital.'])\n"
            "except ValueError as e:\n"
            "    print('gate:', e)\n"
            f"sys.exit(main(['gate', {str(rows)!r}, '--out', {str(tmp_path / 'out.jsonl')!r}]))\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "MDL_JAX_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    need = "the torch backend needs sentence_transformers, which is not installed or fails to import: " \
           "pip install 'mdl-jax[signals]'"
    assert r.returncode == 2, r.stderr
    assert r.stdout.strip() == f"gate: embedder: {need}", r.stdout
    assert r.stderr.strip().splitlines()[-1] == f"mdl-jax: error: --embedder: {need}", r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out.jsonl").exists()


def test_a_fifo_in_a_dataset_folder_does_not_hang_its_digest(tmp_path):
    """The folder's digest skips what is not a regular file; opening a FIFO to check it waited for a
    writer, forever."""
    import threading

    from mdl_jax.gate import manifest

    folder = tmp_path / "data"
    folder.mkdir()
    _jsonl(folder / "a.jsonl", gate_rows.rows(2))
    os.mkfifo(folder / "pipe.jsonl")
    got: list = []
    t = threading.Thread(target=lambda: got.append(manifest.content_digest(str(folder))), daemon=True)
    t.start()
    t.join(30)
    if not got:  # the thread is stuck in open(): give it its writer, so the test process can end
        os.close(os.open(folder / "pipe.jsonl", os.O_WRONLY | os.O_NONBLOCK))
    assert got, "content_digest hung on a FIFO"
    (folder / "pipe.jsonl").unlink()
    assert got[0] == manifest.content_digest(str(folder))


def test_a_dataset_folder_whose_files_disagree_is_one_line_naming_it(tmp_path, capsys):
    """datasets reads a folder lazily: two files whose columns differ fail mid-stream, as its own
    exception types (a traceback, exit 1, before)."""
    pytest.importorskip("datasets")
    folder = tmp_path / "data"
    folder.mkdir()
    _jsonl(folder / "a.jsonl", gate_rows.rows(2))
    _jsonl(folder / "b.jsonl", [{"other": 1, "name": "x"}])
    out = tmp_path / "out.jsonl"
    assert _gate(folder, out) == 2
    assert f"IN: cannot read the dataset {str(folder)!r} near row" in _err_line(capsys)
    assert not _parts(out).exists() and not out.exists()


@pytest.mark.parametrize("line, cells", [('is it safe?,"[""x""]",extra', 3), ("is it safe?", 1)])
def test_a_csv_row_with_more_or_fewer_cells_than_its_header_is_a_bad_row(tmp_path, capsys, line, cells):
    """A cell past the header became a column named "null" in the output; a missing one read as an
    empty field (a missing memories cell was "got NoneType")."""
    src, out = tmp_path / "in.csv", tmp_path / "out.jsonl"
    src.write_text(f'query,memories\nfirst?,"[""a""]"\n{line}\nthird?,"[""b""]"\n')
    assert _gate(src, out) == 2
    assert f"{src}, row 2: the row has {cells} cell{'s' * (cells != 1)}, the header 2" in _err_line(capsys)
    assert _gate(src, out, "--on-bad-row", "skip") == 0
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["mdl_row"] for r in got] == [0, 2] and all(set(r) - {"query", "memories"} <= set(files.OUT_COLUMNS)
                                                         for r in got)


def test_a_csv_header_naming_a_column_twice_is_refused(tmp_path, capsys):
    src, out = tmp_path / "in.csv", tmp_path / "out.jsonl"
    src.write_text('query,memories,note,note\nfirst?,"[""a""]",x,y\n')
    assert _gate(src, out) == 2
    assert f"IN: {src}: the header names the column 'note' twice" in _err_line(capsys)


def test_a_csv_with_a_byte_order_mark_reads_its_first_column(tmp_path):
    """A spreadsheet's "CSV UTF-8" export begins with a BOM, which was read into the first name
    ('\\ufeffquery': the query field "missing")."""
    src, out = tmp_path / "in.csv", tmp_path / "out.jsonl"
    src.write_bytes(b'\xef\xbb\xbfquery,memories\nfirst?,"[""a""]"\n')
    assert _gate(src, out) == 0
    assert json.loads(out.read_text())["query"] == "first?"


@pytest.mark.parametrize("tail, why", [('torn?,"[""a', "unexpected end of data"),
                                       ('odd?,"[""a""]"x', "',' expected after '\"'")])
def test_a_csv_torn_in_a_quoted_cell_or_with_text_after_a_quote_is_one_line_naming_the_row(tmp_path, capsys,
                                                                                            tail, why):
    """A quoted cell left open at the end of the file (a torn file) was read to the end and decided;
    text after a closing quote was joined to the cell with the quotes dropped."""
    src, out = tmp_path / "in.csv", tmp_path / "out.jsonl"
    src.write_text(f'query,memories\nfirst?,"[""a""]"\n{tail}\n')
    assert _gate(src, out) == 2
    line = _err_line(capsys)
    assert f"IN: {src}, row 2: not readable as CSV ({why}" in line and "CSV_FIELD_LIMIT" not in line

