"""``mdl-jax gate`` under hostile input: planted symlinks are never followed, a wide row
is bounded (MAX_MEMORIES per row, PAIR_BUDGET per aggregation step), bad text and broken files are one
line naming the file and row with nothing left behind, the gate's own output columns in the input are
refused, and a part is on disk before the manifest names it (the manifest's size bounded).

Every run uses ``tests.gate_embedders:hashed`` (deterministic vectors, no model to load)."""

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mdl_jax.cli import main
from mdl_jax.gate import MemoryGate, files, reading
from mdl_jax.signals import aggregation
from mdl_jax.signals.aggregation import MAX_MEMORIES, PAIR_BUDGET, memory_signals
from tests.gate_embedders import hashed
from tests.xla_cache import without_cache

ROOT = Path(__file__).resolve().parents[1]
EMBED = ["--embedder", "tests.gate_embedders:hashed", "--no-progress"]


def _rows(n, start=0):
    return [{"id": i, "query": f"is thing {i} safe?",
             "memories": [f"thing {i} is safe", f"thing {i} is not safe", f"thing {i} is blue"]}
            for i in range(start, start + n)]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _gate(src, out, *extra):
    return main(["gate", str(src), "--out", str(out), *EMBED, *extra])


def _err_line(capsys):
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("mdl-jax: error:")]
    assert len(err) == 1, err
    return err[0]


def _parts(out):
    return out.with_name(out.name + ".parts")


# --- planted symlinks ---------------------------------------------------------------------------------

@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim.txt"
    v.write_text("the user's precious file\n")
    return v


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_symlink_planted_at_OUT_tmp_is_never_followed(tmp_path, victim, suffix):
    src = _jsonl(tmp_path / "in.jsonl", _rows(5))
    out = tmp_path / f"out{suffix}"
    (tmp_path / f"out{suffix}.tmp").symlink_to(victim)
    assert _gate(src, out) == 0
    assert victim.read_text() == "the user's precious file\n"
    assert out.is_file() and not out.is_symlink() and len(out.read_bytes()) > 0


def test_a_symlink_planted_at_the_manifests_temp_name_is_never_followed(tmp_path, victim):
    src = _jsonl(tmp_path / "in.jsonl", _rows(5))
    out = tmp_path / "out.jsonl"
    _parts(out).mkdir()
    (_parts(out) / "manifest.json.tmp").symlink_to(victim)
    (_parts(out) / "part-000000.jsonl.tmp").symlink_to(victim)
    assert _gate(src, out, "--chunk-size", "2") == 0
    assert victim.read_text() == "the user's precious file\n"
    assert [json.loads(ln)["id"] for ln in out.read_text().splitlines()] == list(range(5))
    assert not _parts(out).exists()


def test_a_symlink_planted_at_the_lock_is_refused_not_truncated(tmp_path, victim, capsys):
    src = _jsonl(tmp_path / "in.jsonl", _rows(5))
    out = tmp_path / "out.jsonl"
    _parts(out).mkdir()
    (_parts(out) / "lock").symlink_to(victim)
    assert _gate(src, out) == 2
    assert "lock is a symbolic link" in _err_line(capsys)
    assert victim.read_text() == "the user's precious file\n"
    assert not out.exists()


def test_a_parts_folder_that_is_a_symlink_is_refused(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl", _rows(5))
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
    src = _jsonl(tmp_path / "in.jsonl", _rows(5))
    out = tmp_path / "out.jsonl"
    _parts(out).mkdir()
    _parts(out).chmod(0o777)
    assert _gate(src, out) == 2
    assert "is writable by other users" in _err_line(capsys)
    assert _parts(out).is_dir() and not out.exists()


def test_a_manifest_that_is_not_ours_is_one_line_and_left_alone(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl", _rows(5))
    out = tmp_path / "out.jsonl"
    _parts(out).mkdir()
    (_parts(out) / "manifest.json").write_text("{not json")
    assert _gate(src, out) == 2
    assert "is not a manifest" in _err_line(capsys)
    assert (_parts(out) / "manifest.json").read_text() == "{not json"


# --- wide rows ----------------------------------------------------------------------------------------

def _wide(n):
    return {"id": "wide", "query": "is the wide thing safe?",
            "memories": [f"wide thing {j} is {'not ' * (j % 2)}safe" for j in range(n)]}


def test_a_row_over_MAX_MEMORIES_is_one_line_naming_the_row_or_skipped(tmp_path, capsys):
    rows = _rows(3) + [_wide(MAX_MEMORIES + 1)] + _rows(2, 3)
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


def test_the_library_refuses_a_store_over_MAX_MEMORIES_before_any_work():
    gate = MemoryGate(embedder=hashed)
    wide = _wide(MAX_MEMORIES + 1)
    with pytest.raises(ValueError, match=r"^memories_lists\[0\]: expected at most 1,000 memories"):
        gate.decide_batch([wide["query"]], [wide["memories"]])
    with pytest.raises(ValueError, match=r"^memories: expected at most"):
        gate.decide(wide["query"], wide["memories"])
    with pytest.raises(ValueError, match=r"^stores\[1\]: expected at most"):
        memory_signals(["a", "b"], [["x"], wide["memories"]], gate.embedder)


def test_one_wide_store_does_not_pad_its_step_to_its_width(monkeypatch):
    """A step holding one store of MAX_MEMORIES among 15 of three used to be padded to (16, S, S):
    16·10^6 elements. Every step now stays within PAIR_BUDGET, and the signals are those of each
    store alone."""
    seen = []
    real = aggregation.aggregate

    def spy(q, mem, mask, flags, threshold):
        seen.append(flags.shape)
        return real(q, mem, mask, flags, threshold)

    gate = MemoryGate(embedder=hashed)
    rows = _rows(5) + [_wide(MAX_MEMORIES)] + _rows(10, 5)
    qs, ms = [r["query"] for r in rows], [r["memories"] for r in rows]
    monkeypatch.setattr(aggregation, "aggregate", spy)
    got = memory_signals(qs, ms, gate.embedder)
    assert seen and all(b * s * s2 <= PAIR_BUDGET for b, s, s2 in seen), seen
    alone = [memory_signals([q], [m], gate.embedder) for q, m in zip(qs, ms)]
    for k in got:
        np.testing.assert_allclose(got[k], [a[k][0] for a in alone], atol=1e-6, err_msg=k)


_PEAK = textwrap.dedent("""
    import json
    from mdl_jax.gate import MemoryGate
    from mdl_jax.signals.aggregation import MAX_MEMORIES
    from tests.gate_embedders import hashed
    from tests.test_gate_hardening import _rows, _wide

    def peak_mb():  # this process's own peak RSS (getrusage's ru_maxrss survives exec: the parent's)
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")) / 1024

    gate = MemoryGate(embedder=hashed)
    small = _rows(16)
    gate.columns([r["query"] for r in small], [r["memories"] for r in small])
    before = peak_mb()
    rows = _rows(5) + [_wide(MAX_MEMORIES)] + _rows(10, 5)
    cols = gate.columns([r["query"] for r in rows], [r["memories"] for r in rows])
    print(json.dumps({"before_mb": before, "peak_mb": peak_mb(), "n": len(cols["action"])}))
""")


def test_a_chunk_with_a_row_of_MAX_MEMORIES_stays_within_a_modest_peak():
    """Measured (peak RSS of a fresh process, over its peak after a chunk of small rows): one row of
    1,000 memories among 15 small ones added ~225 MB when its chunk was padded to (16, S, S), ~60 MB
    now (most of it the lexical flags' Python lists and the new shape's compilation)."""
    r = subprocess.run([sys.executable, "-c", _PEAK], cwd=ROOT, capture_output=True, text=True,
                       env={**without_cache(os.environ), "PYTHONPATH": str(ROOT)}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads(r.stdout.strip().splitlines()[-1])
    assert m["n"] == 16
    assert m["peak_mb"] - m["before_mb"] < 150, m


# --- bad text and broken files ------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["query", "memory", "passed-through"])
def test_a_lone_surrogate_is_one_line_naming_the_row_or_a_skipped_row(tmp_path, capsys, field):
    bad = {"query": '"is \\ud800 safe?"', "memory": '["fine", "a \\udfff memory"]',
           "passed-through": '"x"'}
    query = bad["query"] if field == "query" else '"q?"'
    mems = bad["memory"] if field == "memory" else '["m"]'
    note = '{"k": ["ok", "\\ud83d"]}' if field == "passed-through" else '"n"'
    line = f'{{"id": 1, "query": {query}, "memories": {mems}, "note": {note}}}'
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(_rows(1)[0]) + "\n" + line + "\n" + json.dumps(_rows(1, 2)[0]) + "\n")
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
    pq.write_table(pa.Table.from_pylist(_rows(n)), path, row_group_size=group, compression="snappy")
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


def test_a_crash_before_any_part_leaves_nothing_behind(tmp_path):
    src = _jsonl(tmp_path / "in.jsonl", _rows(3))
    out = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError, match="embedder down"):
        main(["gate", str(src), "--out", str(out), "--embedder", "tests.test_gate_hardening:broken",
              "--no-progress"])
    assert not _parts(out).exists() and not out.exists()


def broken(texts):
    raise RuntimeError("embedder down")


# --- the gate's own columns in the input --------------------------------------------------------------

@pytest.mark.parametrize("column", ["mdl_action", "mdl_row", "mdl_C_final", "mdl_n_relevant"])
def test_an_input_with_the_gates_output_columns_is_refused(tmp_path, capsys, column):
    rows = [{**r, column: "Active"} for r in _rows(4)]
    src = _jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    assert _gate(src, out, "--on-bad-row", "skip") == 2
    msg = _err_line(capsys)
    assert f"{src}, line 1: field {column!r} is one of the gate's output columns" in msg
    assert not _parts(out).exists() and not out.exists()


def test_re_gating_a_gated_file_is_refused(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl", _rows(4))
    once = tmp_path / "once.jsonl"
    assert _gate(src, once) == 0
    assert _gate(once, tmp_path / "twice.jsonl") == 2
    assert "field 'mdl_row' is one of the gate's output columns" in _err_line(capsys)
    written = json.loads(once.read_text().splitlines()[0])
    assert set(files.OUT_COLUMNS) == {k for k in written if k.startswith("mdl_")}  # the list is complete


# --- durability -----------------------------------------------------------------------------------------

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
    src = _jsonl(tmp_path / "in.jsonl", _rows(7))
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
    rows = _rows(3) + [{"id": i, "query": "", "memories": ["m"]} for i in range(250)]
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
