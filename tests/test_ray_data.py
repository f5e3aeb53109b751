"""``MemoryGateBatch``, the gate as a Ray Data ``map_batches`` callable class: its decision columns equal
the single-process gate's row for row, in every batch format, on a real local Ray instance (two workers,
127.0.0.1 only) with the bundled MiniLM; bad rows fail the batch or are marked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mdl_jax.controller.decision import Action
from mdl_jax.gate.core import ACTION_NAMES, SCALARS, MemoryGate
from mdl_jax.integrations.ray_data import MemoryGateBatch
from tests.gate_embedders import hashed

ROOT = Path(__file__).resolve().parents[1]


def _rows(n: int = 40) -> list[dict]:
    """TruthfulQA questions (the bundled copy) with memories drawn from their reference answers, some
    rows with none: every action and the empty-memories path occur."""
    from mdl_repro.pipeline.data import load

    items = load("truthfulqa", ROOT.parent / "shared" / "data", limit=n)
    rows = []
    for i, it in enumerate(items):
        mems = (list(it.correct[:2]) + list(it.incorrect[: i % 4]))[: i % 6]
        rows.append({"id": i, "query": it.question, "memories": mems, "category": it.category})
    return rows


def _single_process(gate: MemoryGate, rows: list[dict]) -> dict[str, np.ndarray]:
    return gate.columns([r["query"] for r in rows], [r["memories"] for r in rows])


def _same(out: dict, ref: dict, atol: float = 0.0) -> None:
    assert list(out["mdl_action"]) == [ACTION_NAMES[Action(int(a))] for a in ref["action"]]
    for k in SCALARS:
        np.testing.assert_allclose(np.asarray(out[f"mdl_{k}"], np.float64), ref[k].astype(np.float64), rtol=0,
                                   atol=atol, err_msg=k)
    np.testing.assert_array_equal(np.asarray(out["mdl_n_relevant"]), ref["n_relevant"])


@pytest.mark.parametrize("fmt", ["numpy", "pandas", "pyarrow"])
def test_batch_columns_equal_the_single_process_gate_in_every_batch_format(fmt):
    rows = _rows(24)
    ref = _single_process(MemoryGate(embedder=hashed), rows)
    fn = MemoryGateBatch(embedder=hashed)
    if fmt == "numpy":
        batch = {"id": np.array([r["id"] for r in rows]), "query": np.array([r["query"] for r in rows]),
                 "memories": np.array([np.array(r["memories"], dtype=object) for r in rows], dtype=object)}
        out = fn(batch)
        np.testing.assert_array_equal(out["id"], batch["id"])  # input columns pass through
    elif fmt == "pandas":
        import pandas as pd

        out = fn(pd.DataFrame(rows))
        assert list(out["id"]) == [r["id"] for r in rows]
        out = {c: out[c].to_numpy() for c in out.columns}
    else:
        import pyarrow as pa

        t = fn(pa.Table.from_pylist(rows))
        assert t.column("id").to_pylist() == [r["id"] for r in rows]
        out = {c: np.asarray(t.column(c).to_pylist(), dtype=object if c == "mdl_action" else None)
               for c in t.column_names if c.startswith("mdl_")}
    _same(out, ref)


def test_a_row_depends_on_itself_alone_so_batching_does_not_change_it():
    rows = _rows(30)
    fn = MemoryGateBatch(embedder=hashed)
    whole = fn.decide_columns({"query": [r["query"] for r in rows], "memories": [r["memories"] for r in rows]})
    parts = [fn.decide_columns({"query": [r["query"] for r in rows[a:a + 7]],
                                "memories": [r["memories"] for r in rows[a:a + 7]]}) for a in range(0, 30, 7)]
    for k in whole:
        np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), whole[k], err_msg=k)


def test_bad_rows_fail_the_batch_naming_the_row_or_are_marked():
    cols = {"query": ["fine question", "", "another one"], "memories": [["a memory"], ["x"], "not a list"]}
    with pytest.raises(ValueError, match=r"row 1 of the batch: queries\[0\]"):
        MemoryGateBatch(embedder=hashed)(cols)
    out = MemoryGateBatch(embedder=hashed, on_bad_row="mark")(cols)
    assert out["mdl_action"][0] in ACTION_NAMES.values()
    assert out["mdl_action"][1] is None and out["mdl_action"][2] is None
    assert "queries[1]" in out["mdl_error"][1] and "memories_lists[2]" in out["mdl_error"][2]
    assert out["mdl_error"][0] is None and np.isnan(out["mdl_C"][1]) and out["mdl_n_relevant"][2] == -1
    with pytest.raises(ValueError, match="no column 'question'"):
        MemoryGateBatch(embedder=hashed, query_field="question")(cols)
    with pytest.raises(ValueError, match="on_bad_row"):
        MemoryGateBatch(embedder=hashed, on_bad_row="skip")
    with pytest.raises(TypeError, match="batch_format"):
        MemoryGateBatch(embedder=hashed)([1, 2, 3])


def test_a_risk_column_overrides_the_assessor_and_is_checked():
    cols = {"query": ["q one", "q two"], "memories": [["m one"], ["m two"]], "A": [0.9, 0.1]}
    out = MemoryGateBatch(embedder=hashed, risk_field="A")(cols)
    np.testing.assert_allclose(out["mdl_A"], [0.9, 0.1], rtol=1e-6)
    with pytest.raises(ValueError, match=r"risks\[0\]: expected a number in \[0, 1\]"):
        MemoryGateBatch(embedder=hashed, risk_field="A")({**cols, "A": [None, 0.1]})


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["numpy", "pandas"])
def test_a_lone_surrogate_fails_the_batch_naming_it_or_marks_the_row_and_the_batch_stays_writable(
        fmt, embedder, tmp_path):
    """The real MiniLM (whose tokenizer cannot take a lone surrogate) behind the batch: the bad row
    fails the batch naming it, or is marked; a marked batch still converts to Arrow and Parquet."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": 0, "query": "Is raw cookie dough safe to eat?", "memories": ["Raw flour can carry E. coli"]},
            {"id": 1, "query": "Is \ud800 safe?", "memories": ["a memory"]},
            {"id": 2, "query": "What is the capital of France?", "memories": ["Paris", "a \udfff memory"]}]

    def batch():
        if fmt == "pandas":  # object columns: pandas' Arrow-backed strings cannot hold the text at all
            return pd.DataFrame(rows, dtype=object)
        return {"id": np.array([r["id"] for r in rows]),
                "query": np.array([r["query"] for r in rows], dtype=object),
                "memories": np.array([np.array(r["memories"], dtype=object) for r in rows], dtype=object)}

    with pytest.raises(ValueError, match=r"^row 1 of the batch: queries\[0\]: holds a lone surrogate "
                                         r"\('\\ud800' at character 3\)"):
        MemoryGateBatch(embedder=embedder)(batch())
    out = MemoryGateBatch(embedder=embedder, on_bad_row="mark")(batch())
    if fmt == "pandas":
        out = {c: out[c].to_numpy() for c in out.columns}
    assert out["mdl_action"][0] in ACTION_NAMES.values()
    assert pd.isna(out["mdl_action"][1]) and pd.isna(out["mdl_action"][2])  # None, or pandas' missing value
    assert "queries[1]: holds a lone surrogate" in out["mdl_error"][1]
    assert "memories_lists[2][1]: holds a lone surrogate" in out["mdl_error"][2]
    assert out["query"][1] == "Is \ufffd safe?" and list(out["memories"][2]) == ["Paris", "a \ufffd memory"]
    assert out["query"][0] == rows[0]["query"]  # a good row's cells are untouched
    ref = MemoryGate(embedder=embedder).columns([rows[0]["query"]], [rows[0]["memories"]])
    assert out["mdl_action"][0] == ACTION_NAMES[int(ref["action"][0])]
    table = pa.Table.from_pandas(pd.DataFrame({k: pd.Series(list(v), dtype=object) for k, v in out.items()}))
    pq.write_table(table, tmp_path / "gated.parquet")
    assert pq.read_table(tmp_path / "gated.parquet").column("query").to_pylist()[1] == "Is \ufffd safe?"


def test_a_lone_surrogate_with_a_callable_embedder_is_refused_before_it_is_decided():
    """A callable embedder takes any string, so the row would be decided and the batch fail only when
    written: the check is the gate's own, before any embedder runs."""
    cols = {"query": ["fine question", "bad \udc80 question"], "memories": [["a memory"], ["another"]]}
    with pytest.raises(ValueError, match=r"^row 1 of the batch: queries\[0\]: holds a lone surrogate"):
        MemoryGateBatch(embedder=hashed)(cols)
    out = MemoryGateBatch(embedder=hashed, on_bad_row="mark")(cols)
    assert out["mdl_action"][1] is None and "queries[1]: holds a lone surrogate" in out["mdl_error"][1]
    assert out["query"][1] == "bad \ufffd question" and out["query"][0] == "fine question"


@pytest.mark.parametrize("fmt", ["numpy", "pandas", "pyarrow"])
@pytest.mark.parametrize("column", ["mdl_action", "mdl_C_final", "mdl_n_relevant"])
def test_a_batch_that_holds_an_output_column_is_refused_not_overwritten(fmt, column):
    import pandas as pd
    import pyarrow as pa

    rows = [{"query": "q one", "memories": ["m one"], column: "kept"}]
    batch = {"numpy": lambda: {k: np.array([r[k] for r in rows], dtype=object) for k in rows[0]},
             "pandas": lambda: pd.DataFrame(rows), "pyarrow": lambda: pa.Table.from_pylist(rows)}[fmt]
    for mode in ("error", "mark"):
        with pytest.raises(ValueError, match=rf"^batch: field '{column}' is one of the gate's output columns "
                                             r"\(mdl_action, mdl_M, mdl_R, \.\.\.\): is the dataset already gated\?"):
            MemoryGateBatch(embedder=hashed, on_bad_row=mode)(batch())
    # mdl_error is an output column only where it is written (mark)
    rows = [{"query": "q one", "memories": ["m one"], "mdl_error": "kept"}]
    kept = MemoryGateBatch(embedder=hashed)(batch())["mdl_error"]
    assert (kept.to_pylist() if fmt == "pyarrow" else list(kept)) == ["kept"]
    with pytest.raises(ValueError, match=r"^batch: field 'mdl_error' is one of the gate's output columns"):
        MemoryGateBatch(embedder=hashed, on_bad_row="mark")(batch())


RAY_SCRIPT = r"""
import json, sys
import numpy as np
import ray
from mdl_jax.integrations.ray_data import MemoryGateBatch

rows = json.load(open(sys.argv[1]))
ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
         configure_logging=False)
try:
    ds = ray.data.from_items(rows, override_num_blocks=4)
    out = ds.map_batches(MemoryGateBatch, fn_constructor_kwargs={"cache_dir": sys.argv[3], "embed_backend": "onnx"},
                         concurrency=2, batch_size=8, num_cpus=1).take_all()
finally:
    ray.shutdown()
keep = ["id", "mdl_action", "mdl_n_relevant"] + [k for k in out[0] if k.startswith("mdl_") and k not in
                                                 ("mdl_action", "mdl_n_relevant")]
json.dump([{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items() if k in keep} for r in out],
          open(sys.argv[2], "w"))
"""


@pytest.mark.slow
def test_ray_data_on_a_local_two_worker_instance_equals_the_single_process_gate(tmp_path, cache_dir):
    pytest.importorskip("ray.data", reason="the ray extra: pip install 'mdl-jax[ray]'")
    rows = _rows(40)
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    (tmp_path / "run.py").write_text(RAY_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_DEDUP_LOGS": "0", "JAX_PLATFORMS": "cpu"}
    p = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "rows.json"),
                        str(tmp_path / "out.json"), str(tmp_path / "ray-cache")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = sorted(json.loads((tmp_path / "out.json").read_text()), key=lambda r: r["id"])
    assert [r["id"] for r in got] == [r["id"] for r in rows]
    # the real bundled MiniLM, here and on the workers, in float32 (ONNX Runtime) on both sides: "auto"
    # would run bfloat16 on a CPU with it, whose vectors move by ~1e-4 with the batch a text is encoded
    # in (its parity, not Ray's; docs/guides/gate.md), which would hide a float32-sized difference here
    ref = _single_process(MemoryGate(cache_dir=cache_dir, embed_backend="onnx"), rows)
    out = {k: np.array([r[k] for r in got], dtype=object if k == "mdl_action" else None) for k in got[0]}
    # actions and counts exactly; the scalars to float32 rounding: MiniLM's vectors move by an ulp or
    # two with the batch a text is encoded in (padding), and the workers' batches are not the driver's
    _same(out, ref, atol=1e-5)
    assert len(set(out["mdl_action"])) >= 3, "the rows should reach several actions"


def test_a_dict_batch_whose_columns_differ_in_length_is_an_error_naming_them():
    # a row past the short column was an IndexError
    g = MemoryGateBatch(embedder=hashed)
    batch = {"query": np.array(["q1", "q2"]), "memories": np.array([["a"]], dtype=object)}
    with pytest.raises(ValueError, match=r"^batch: expected columns of one length .*'query': 2, 'memories': 1"):
        g(batch)


def test_a_risk_table_without_a_category_column_is_refused_at_construction():
    # every row failed, one batch at a time ("None is not in the risk table"); mdl-jax gate refuses it at start
    with pytest.raises(ValueError, match=r"^category_field: a \{category: risk\} table"):
        MemoryGateBatch(embedder=hashed, risk={"Health": 0.9})
    MemoryGateBatch(embedder=hashed, risk={"Health": 0.9}, category_field="topic")
    MemoryGateBatch(embedder=hashed, risk={"Health": 0.9}, risk_field="A")


def test_settings_that_would_be_ignored_or_misread_are_refused_at_construction():
    """An empty category_field was read as none (a preset then gave every row its default risk), a
    column name of another type failed at the first batch, a device beside an embedder that is not a
    name (or a pathlib path) was dropped and the job ran on the CPU."""
    for name, bad in (("category_field", ""), ("risk_field", ""), ("category_field", 5), ("risk_field", 0.5)):
        with pytest.raises(ValueError, match=rf"^{name}: expected a column name or None, got {bad!r}$"):
            MemoryGateBatch(embedder=hashed, risk="truthfulqa", **{name: bad})
    for bad in ("", 5):
        with pytest.raises(ValueError, match=rf"^device: expected a torch device name .* got {bad!r}$"):
            MemoryGateBatch(embedder=hashed, device=bad)
    for bad in (0, -1, "64", 2.0, True):
        with pytest.raises(ValueError, match=rf"^batch_size: expected a positive int, got {bad!r}$"):
            MemoryGateBatch(embedder=hashed, batch_size=bad)
    with pytest.raises(ValueError, match=r"^device: applies to a named embedder; the embedder given is a function"):
        MemoryGateBatch(embedder=hashed, device="cuda")
    gate = MemoryGateBatch(embedder=Path("all-MiniLM-L6-v2"), device="cpu", batch_size=8).gate
    assert gate.embedder.device == "cpu" and gate.embedder.batch_size == 8


def test_an_arrow_batch_gets_the_same_column_types_when_empty_or_all_marked(tmp_path):
    """An empty batch, or one whose rows were all marked bad, gained Arrow null columns: a Parquet folder
    holding such a part beside a decided one could not be read back."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    gate = MemoryGateBatch(embedder=hashed, on_bad_row="mark")
    good = gate(pa.table({"query": ["a question"], "memories": [["a memory"]]}))
    bad = gate(pa.table({"query": ["", None], "memories": [["a memory"], ["another"]]}))
    empty = gate(pa.table({"query": pa.array([], pa.string()), "memories": pa.array([], pa.list_(pa.string()))}))
    assert bad.schema == good.schema == empty.schema
    assert good.schema.field("mdl_action").type == pa.string() and good.schema.field("mdl_M").type == pa.float64()
    for i, part in enumerate((bad, empty, good)):
        pq.write_table(part, tmp_path / f"{i}.parquet")
    back = pq.read_table(tmp_path)
    assert back.num_rows == 3 and back.column("mdl_action").to_pylist().count(None) == 2

