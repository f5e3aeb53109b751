"""The one file writer (``mdl_jax/_io.py``) and every writer of the project through it: a file is
whole or untouched (a failed block, a full disk, a kill), a folder of files is published whole, a
symbolic link planted at a final or temporary name is never written through, and a full disk is one
``OutputError`` naming the path (one line and exit 2 on the command line)."""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import signal
import stat
import subprocess
import sys
import uuid
from itertools import chain
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mdl_jax import _io
from mdl_jax._io import (
    OutputError,
    append_bytes,
    atomic_open,
    atomic_path,
    database_path,
    lock_file,
    open_append,
    publish_dir,
    write_bytes,
    write_text,
)

ROOT = Path(__file__).resolve().parents[1]
VICTIM = "do not touch\n"


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# --------------------------------------------------------------------------------- the helper

def test_a_file_is_replaced_whole_and_no_temporary_remains(tmp_path):
    p = tmp_path / "sub" / "a.json"
    write_text(p, "old\n")
    write_bytes(p, b"new\n")
    assert p.read_bytes() == b"new\n" and os.listdir(p.parent) == ["a.json"]


def test_a_block_that_raises_leaves_the_old_file_and_no_temporary(tmp_path):
    p = tmp_path / "a.csv"
    write_text(p, "old\n")
    with pytest.raises(RuntimeError, match="midway"), atomic_open(p, "w") as f:
        f.write("new, half\n" * 10_000)
        raise RuntimeError("midway")
    assert p.read_text() == "old\n" and os.listdir(tmp_path) == ["a.csv"]


def test_a_symlink_at_the_final_name_is_replaced_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    (tmp_path / "out.json").symlink_to(victim)
    write_text(tmp_path / "out.json", "{}\n")
    assert victim.read_text() == VICTIM
    assert not (tmp_path / "out.json").is_symlink() and (tmp_path / "out.json").read_text() == "{}\n"


def test_a_planted_temporary_name_is_skipped_never_opened(tmp_path, monkeypatch):
    """The first temporary name the writer tries is a planted link (dangling, then to a file): the
    create fails on it (O_EXCL) and the next fresh name is used; the link and its target stay."""
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    names = _io._names
    monkeypatch.setattr(_io, "_names", lambda name: chain([f".{name}.planted.tmp"], names(name)))
    for target in (tmp_path / "nowhere", victim):
        link = tmp_path / ".out.txt.planted.tmp"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        write_text(tmp_path / "out.txt", "fresh\n")
        assert (tmp_path / "out.txt").read_text() == "fresh\n" and link.is_symlink()
    assert victim.read_text() == VICTIM and not (tmp_path / "nowhere").exists()


def test_a_new_file_gets_the_mode_open_would_give(tmp_path):
    old = os.umask(0o027)
    try:
        write_text(tmp_path / "a", "x")
        with atomic_path(tmp_path / "b") as t:
            t.write_text("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(tmp_path / "b").st_mode) == 0o640


def test_atomic_path_publishes_what_a_named_writer_wrote_and_cleans_up(tmp_path):
    target = tmp_path / "model.onnx"
    target.write_text("old")
    with pytest.raises(ValueError), atomic_path(target) as t:
        t.write_text("half")
        raise ValueError("exporter failed")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["model.onnx"]
    with atomic_path(target) as t:
        assert t.parent != tmp_path and stat.S_IMODE(os.stat(t.parent).st_mode) == 0o700
        t.write_text("new")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["model.onnx"]


def test_bad_arguments_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="mode: expected one of 'wb', 'w', got 'a'"), atomic_open(tmp_path / "x", "a"):
        pass
    with pytest.raises(TypeError, match="data: expected bytes, got str"):
        write_bytes(tmp_path / "x", "text")
    with pytest.raises(TypeError, match="text: expected a str, got bytes"):
        write_text(tmp_path / "x", b"bytes")
    with pytest.raises(ValueError, match="mode: expected one of 'ab', 'a', 'a\\+', got 'w'"):
        open_append(tmp_path / "x", "w")
    assert os.listdir(tmp_path) == []


def test_a_figure_without_a_suffix_is_refused_naming_the_path(tmp_path):
    from mdl_repro.analysis.figures import save_figure

    with pytest.raises(ValueError, match="path: expected an image file name with a suffix"):
        save_figure(object(), tmp_path / "figure")
    assert os.listdir(tmp_path) == []


def test_output_error_is_an_oserror_naming_the_path_and_pickles(tmp_path):
    e = OutputError(tmp_path / "x.csv", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert isinstance(e, OSError) and e.errno == errno.ENOSPC and e.filename == str(tmp_path / "x.csv")
    assert str(e).startswith(f"cannot write {tmp_path / 'x.csv'}: No space left on device")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is OutputError and str(back) == str(e) and back.errno == errno.ENOSPC


def test_a_read_only_folder_is_one_output_error_naming_the_path(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes through a folder's missing write permission")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        with pytest.raises(OutputError, match=r"cannot write .*ro/a\.txt: Permission denied"):
            write_text(d / "a.txt", "x")
    finally:
        d.chmod(0o700)


# ----------------------------------------------------------------------------- publish_dir

def _old_folder(folder: Path, names=("TUNED.md", "tuned.json", "tuned-all.json")) -> dict[str, bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        (folder / n).write_text(f"old {n}\n")
    return _tree(folder)


def test_publish_dir_swaps_a_folder_of_its_own_whole(tmp_path):
    out = tmp_path / "tuned"
    _old_folder(out)
    with publish_dir(out, owns=lambda n: n.startswith(("TUNED", "tuned"))) as work:
        assert work.parent == tmp_path and work != out
        write_text(work / "TUNED.md", "new\n")
        write_text(work / "tuned-gates.json", "{}\n")
    assert _tree(out) == {"TUNED.md": b"new\n", "tuned-gates.json": b"{}\n"}  # the stale ones are gone
    assert os.listdir(tmp_path) == ["tuned"]


def test_publish_dir_keeps_files_it_does_not_own_and_removes_its_stale_ones(tmp_path):
    run = tmp_path / "run"
    _old_folder(run, ("records.jsonl", "REPORT.md", "table4_ref.md"))
    own = {"REPORT.md", "table4.md", "table4_ref.md"}
    with publish_dir(run, owns=own.__contains__) as work:
        write_text(work / "REPORT.md", "new\n")
        write_text(work / "table4.md", "t4\n")
    assert _tree(run) == {"REPORT.md": b"new\n", "records.jsonl": b"old records.jsonl\n", "table4.md": b"t4\n"}
    assert os.listdir(tmp_path) == ["run"]


def test_publish_dir_without_owns_removes_nothing_it_did_not_write(tmp_path):
    out = tmp_path / "out"
    _old_folder(out, ("mine.md", "theirs.txt"))
    with publish_dir(out) as work:
        write_text(work / "mine.md", "new\n")
    assert _tree(out) == {"mine.md": b"new\n", "theirs.txt": b"old theirs.txt\n"}


@pytest.mark.parametrize("failure", [RuntimeError("an analysis failed"), KeyboardInterrupt()])
def test_publish_dir_that_fails_leaves_the_old_folder_and_no_temporary(tmp_path, failure):
    out = tmp_path / "analysis"
    before = _old_folder(out)
    with pytest.raises(type(failure)), publish_dir(out) as work:
        write_text(work / "TUNED.md", "new\n")
        raise failure
    assert _tree(out) == before and os.listdir(tmp_path) == ["analysis"]


def test_publish_dir_killed_midway_leaves_the_old_folder(tmp_path):
    """SIGKILL after the first new file: the folder holds the old run's files only (the new file
    stays in the hidden temporary folder beside it)."""
    out = tmp_path / "tuned"
    before = _old_folder(out)
    code = (f"import os, signal\nfrom mdl_jax._io import publish_dir, write_text\n"
            f"with publish_dir({str(out)!r}) as w:\n"
            f"    write_text(w / 'TUNED.md', 'new')\n"
            f"    os.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == -signal.SIGKILL
    assert _tree(out) == before
    left = [n for n in os.listdir(tmp_path) if n != "tuned"]
    assert len(left) == 1 and left[0].startswith(".tuned.") and left[0].endswith(".tmp")


def test_publish_dir_keep_existing_keeps_the_first_copy(tmp_path):
    out = tmp_path / "model"
    before = _old_folder(out, ("config.json",))
    with publish_dir(out, keep_existing=True) as work:
        write_text(work / "config.json", "second\n")
    assert _tree(out) == before and os.listdir(tmp_path) == ["model"]


def test_publish_dir_refuses_a_file_where_the_folder_goes(tmp_path):
    (tmp_path / "out").write_text("a file")
    with pytest.raises(OutputError, match="a file is there, not a folder"), publish_dir(tmp_path / "out"):
        pass
    assert (tmp_path / "out").read_text() == "a file" and os.listdir(tmp_path) == ["out"]


# --------------------------------------------------------------------------------- appends

def test_append_bytes_appends_to_a_regular_file(tmp_path):
    p = tmp_path / "records.jsonl"
    append_bytes(p, b'{"a": 1}\n')
    append_bytes(p, b'{"a": 2}\n')
    assert p.read_bytes() == b'{"a": 1}\n{"a": 2}\n'


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "fifo"])
def test_an_append_refuses_a_symlink_or_a_fifo(tmp_path, kind):
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    p = tmp_path / "records.jsonl"
    if kind == "fifo":
        os.mkfifo(p)
    else:
        p.symlink_to(victim if kind == "symlink" else tmp_path / "nowhere")
    what = "not a regular file" if kind == "fifo" else "symbolic link"
    with pytest.raises(OutputError, match=f"records.jsonl: .*{what}"):
        append_bytes(p, b"x\n")
    assert victim.read_text() == VICTIM and not (tmp_path / "nowhere").exists()
    with pytest.raises(OutputError, match=what):
        database_path(p)


def _lockable(p: Path) -> bool:
    """Whether ``lock_file`` takes ``p``'s lock now (let go at once)."""
    f = lock_file(p)
    if f is None:
        return False
    f.close()
    return True


def test_a_lock_file_is_held_by_one_open_file_at_a_time_and_let_go_on_close(tmp_path):
    p = tmp_path / ".lock"
    first = lock_file(p)
    assert first is not None
    assert not _lockable(p), "a second holder while the first is open"
    first.close()
    assert _lockable(p)


def test_score_gates_refuses_a_run_folder_another_run_holds_and_appends_nothing(tmp_path):
    # two scorers of one run would append the same rows: the second is refused while the first writes
    from mdl_repro.pipeline.experiment import lock_out_dir
    from mdl_repro.pipeline.gate_scores import SCORES_FILE, score_run
    from mdl_repro.pipeline.records import RecordsError

    data = Path(__file__).resolve().parents[2] / "shared" / "data"
    if not (data / "TruthfulQA.csv").is_file():
        pytest.skip("the shared data is not beside the checkout")
    rows = [{"dataset": "truthfulqa", "qid": q, "seed": 0, "system": s, "M": 0.5, "R": 0.5, "A": 0.5,
             "hallucinated": False, "failed": False, "answer": "an answer",
             "action": "ACTIVE" if s == "B3" else None} for q in range(3) for s in ("B1", "B2", "B3")]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = lock_out_dir(tmp_path)
    try:
        with pytest.raises(RecordsError, match=r"is in use by another run \(pid \d+\)"):
            score_run(tmp_path, backend=object(), embedder=object(), data_dir=data, progress=False)
    finally:
        held.close()
    assert not (tmp_path / SCORES_FILE).exists()
    assert _lockable(tmp_path / ".lock")


def test_a_lock_file_is_let_go_when_its_process_dies(tmp_path):
    p = tmp_path / ".lock"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from mdl_jax._io import lock_file; "
                               f"f = lock_file({str(p)!r}); print('locked', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert not _lockable(p)
    finally:
        holder.kill()
        holder.wait()
    assert _lockable(p)


def _unlinked_as_it_locks(monkeypatch, p: Path, times: int) -> None:
    """The first ``times`` flocks of ``p`` find the file removed by its holder just before, as a run that
    ends and removes its lock does beside one that opened the name an instant earlier."""
    import fcntl

    real, left = fcntl.flock, [times]

    def flock(f, op):
        if left[0]:
            left[0] -= 1
            os.unlink(p)
        return real(f, op)

    monkeypatch.setattr(fcntl, "flock", flock)


def test_a_lock_file_is_on_the_file_its_name_holds_when_the_old_one_went_as_it_locked(tmp_path, monkeypatch):
    # a lock on the removed file guards nothing: the next run would create the name anew and lock that,
    # two runs each holding "the" lock of one folder
    p = tmp_path / ".lock"
    p.write_text("")
    _unlinked_as_it_locks(monkeypatch, p, 1)
    f = lock_file(p)
    assert f is not None
    try:
        assert os.fstat(f.fileno()).st_ino == os.stat(p).st_ino
        monkeypatch.undo()
        assert not _lockable(p), "a second run took the folder's lock beside the first"
    finally:
        f.close()


def test_a_lock_file_whose_name_keeps_changing_as_it_locks_is_not_taken(tmp_path, monkeypatch):
    p = tmp_path / ".lock"
    _unlinked_as_it_locks(monkeypatch, p, 1000)  # more than it tries
    assert lock_file(p) is None


def test_a_lock_file_whose_folder_went_as_it_locked_is_not_taken(tmp_path, monkeypatch):
    # the run that held it removed its whole folder (mdl-jax gate's parts folder) as it ended
    import fcntl

    d = tmp_path / "parts"
    d.mkdir()
    real = fcntl.flock

    def flock(f, op):
        shutil.rmtree(d)
        return real(f, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    assert lock_file(d / "lock") is None


def test_a_lock_file_refuses_a_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    (tmp_path / ".lock").symlink_to(victim)
    with pytest.raises(OutputError, match="symbolic link"):
        lock_file(tmp_path / ".lock")
    assert victim.read_text() == VICTIM


# ------------------------------------------------- every writer of the project, a link planted

def _records(path: Path) -> Path:
    from tests.test_analysis import CFG, make_records, write

    run = {"datasets": {ds: {"thresholds": list(c.thresholds), "n_min": c.n_min, "n_max": c.n_max}
                        for ds, c in CFG.items()}}
    return write(path, make_records(n_q=16), run)


def _parquet(path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    M, R, A = np.random.default_rng(0).uniform(size=(3, 50)).astype(np.float32)
    pq.write_table(pa.table({"M": M, "R": R, "A": A, "adopt": np.arange(50) % 2 == 0}), path)
    return path


def _save_config(d: Path) -> list[Path]:
    from mdl_jax import MDLConfig, load_config, save_config

    save_config(MDLConfig(), d / "cfg.json", note="planted")
    assert load_config(d / "cfg.json") == MDLConfig()
    return [d / "cfg.json"]


def _save_table(d: Path) -> list[Path]:
    from mdl_repro.pipeline.store_signals import save_table

    save_table(pd.DataFrame({"M": [0.5], "R": [0.1], "A": [0.2]}), d / "signals.parquet")
    assert pd.read_parquet(d / "signals.parquet")["M"].tolist() == [0.5]
    return [d / "signals.parquet"]


def _judge_jsonl(d: Path) -> list[Path]:
    from mdl_repro.cli.judge import _write_jsonl

    _write_jsonl(d / "r.judged.jsonl", [{"a": 1}, {"a": "é"}])
    assert (d / "r.judged.jsonl").read_text(encoding="utf-8") == '{"a": 1}\n{"a": "é"}\n'
    return [d / "r.judged.jsonl"]


def _sweep_out(d: Path) -> list[Path]:
    from mdl_jax.cli import main

    src = _parquet(d.parent / f"r-{uuid.uuid4().hex}.parquet")
    assert main(["sweep", str(src), "--grid", "g_a=0,1", "--out", str(d / "o.csv")]) == 0
    assert (d / "o.csv").read_text().startswith("g_a,accuracy")
    return [d / "o.csv"]


def _tune(d: Path) -> list[Path]:
    from mdl_repro.analysis.learned import learned_table

    learned_table(_records(d.parent / "records.jsonl"), d / "tuned", steps=5, seeds=(0,), field_sets=("gates",))
    files = [d / "tuned" / n for n in ("tuned-gates.json", "tuned.json", "TUNED.md")]
    assert all(f.is_file() and not f.is_symlink() for f in files)
    return files


def _report(d: Path) -> list[Path]:
    from mdl_repro.analysis.report import write_report

    _records(d / "records.jsonl")
    write_report(d, {})
    files = [d / n for n in ("REPORT.md", "table4.md", "table5.md", "metrics.json", "figure3.png")]
    assert all(f.is_file() and not f.is_symlink() for f in files)
    return files


def _gate(d: Path) -> list[Path]:
    from mdl_jax.cli import main

    src = d.parent / f"in-{uuid.uuid4().hex}.jsonl"
    src.write_text("".join(json.dumps({"q": f"question {i}", "m": ["a memory", "another"]}) + "\n"
                           for i in range(5)))
    assert main(["gate", str(src), "--out", str(d / "o.parquet"), "--query-field", "q", "--memories-field", "m",
                 "--risk", "0.3", "--embedder", "tests.gate_embedders:hashed", "--no-progress"]) == 0
    assert len(pd.read_parquet(d / "o.parquet")) == 5
    return [d / "o.parquet"]


# (writer, its final files before it runs, relative to the folder it writes into); the gate refuses an
# OUT that exists (a link there is refused with the rest), so only its temporary names are planted
WRITERS = {
    "save_config": (_save_config, ["cfg.json"]),
    "save_table (signals.parquet)": (_save_table, ["signals.parquet"]),
    "judge --out": (_judge_jsonl, ["r.judged.jsonl"]),
    "sweep --out": (_sweep_out, ["o.csv"]),
    "tune": (_tune, ["tuned/tuned-gates.json", "tuned/tuned.json", "tuned/TUNED.md"]),
    "reproduce's report": (_report, ["REPORT.md", "table4.md", "table5.md", "metrics.json", "figure3.png"]),
    "gate --out": (_gate, [".o.parquet"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_symlink_planted_at_any_name_a_writer_uses_leaves_its_target_untouched(tmp_path, monkeypatch, writer):
    """At every final name, the old fixed temporary name (``NAME.tmp``) and the first fresh temporary
    name the helper tries, a link to the victim is planted: the writer writes its outputs, the victim
    keeps its bytes, and the planted temporary links are still links."""
    fn, finals = WRITERS[writer]
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    d = tmp_path / "out"
    names = _io._names
    monkeypatch.setattr(_io, "_names", lambda name: chain([f".{name}.planted.tmp"], names(name)))
    planted = []
    for rel in finals:
        temp_only = Path(rel).name.startswith(".")
        p = d / rel.replace("/.", "/").lstrip(".")
        p.parent.mkdir(parents=True, exist_ok=True)
        for link in (p, p.with_name(p.name + ".tmp"), p.with_name(f".{p.name}.planted.tmp")):
            if not (temp_only and link == p):
                link.symlink_to(victim)
            planted.append(link)
    fn(d)
    assert victim.read_text() == VICTIM and victim.stat().st_nlink == 1
    for link in planted[1::3] + planted[2::3]:
        assert link.is_symlink() or not link.exists(), link  # never replaced by a file of ours


def _appenders():
    from mdl_repro.pipeline.experiment import lock_out_dir
    from mdl_repro.pipeline.gate_scores import _Appender
    from mdl_repro.pipeline.generation.cache import GenerationCache
    from mdl_repro.pipeline.judgement_llm import ReplyCache
    from mdl_repro.pipeline.records import RecordWriter

    return {"records.jsonl": lambda d: RecordWriter(d / "records.jsonl").append([{"dataset": "x"}]),
            "gate_scores.jsonl": lambda d: _Appender(d / "gate_scores.jsonl").write([{"a": 1}]),
            ".lock": lambda d: lock_out_dir(d),
            "generations.sqlite": lambda d: GenerationCache(d / "generations.sqlite"),
            "llm_judge.sqlite": lambda d: ReplyCache(d / "llm_judge.sqlite")}


@pytest.mark.parametrize("name", ["records.jsonl", "gate_scores.jsonl", ".lock", "generations.sqlite",
                                  "llm_judge.sqlite"])
def test_a_record_file_writer_refuses_a_symlink_at_its_file(tmp_path, name):
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    d = tmp_path / "run"
    d.mkdir()
    (d / name).symlink_to(victim)
    with pytest.raises(OutputError, match=f"{name}: it is a symbolic link; refusing to write through it"):
        _appenders()[name](d)
    assert victim.read_text() == VICTIM


def test_records_are_appended_after_a_torn_line_is_ended(tmp_path):
    from mdl_repro.pipeline.records import RecordWriter

    p = tmp_path / "records.jsonl"
    p.write_bytes(b'{"a": 1}\n{"torn')
    RecordWriter(p).append([{"b": 2}])
    assert p.read_bytes() == b'{"a": 1}\n{"torn\n{"b": 2}\n'


# ------------------------------------------------------------------------------- a full disk

def _can_mount_tmpfs(where: Path) -> bool:
    where.mkdir(exist_ok=True)
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(where)],
                           capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


class Disk:
    """A folder whose disk fills on ``fill()``: a real 512 KiB tmpfs where this process may mount
    one, else the helper's one write call failing with ENOSPC after its first 4 KiB (a fake for
    the failure path only)."""

    def __init__(self, kind: str, folder: Path, monkeypatch):
        self.kind, self.folder, self._mp = kind, folder, monkeypatch

    def fill(self) -> None:
        if self.kind == "tmpfs":
            fd = os.open(self.folder / "filler", os.O_WRONLY | os.O_CREAT)
            try:
                while True:
                    os.write(fd, b"\0" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC
            finally:
                os.close(fd)
            return
        left = [4096]

        def write(fd, data):
            if left[0] <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            n = os.write(fd, bytes(memoryview(data)[:left[0]]))
            left[0] -= n
            return n

        self._mp.setattr(_io, "_write", write)

    def listing(self) -> list[str]:
        return sorted(n for n in os.listdir(self.folder) if n != "filler")


@pytest.fixture(params=["tmpfs", "fake"])
def disk(request, tmp_path, monkeypatch):
    folder = tmp_path / "disk"
    if request.param == "tmpfs":
        if not _can_mount_tmpfs(folder):
            pytest.skip("no tmpfs can be mounted here (not root, or no mount rights): the fake disk runs")
        try:
            yield Disk("tmpfs", folder, monkeypatch)
        finally:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)
    else:
        folder.mkdir()
        yield Disk("fake", folder, monkeypatch)


def test_a_full_disk_leaves_the_old_file_and_no_temporary(disk):
    p = disk.folder / "o.csv"
    write_text(p, "old,csv\n")
    disk.fill()
    with pytest.raises(OutputError, match=r"cannot write .*o\.csv: No space left on device"):
        write_text(p, "a,b\n" * 50_000)
    assert p.read_text() == "old,csv\n" and disk.listing() == ["o.csv"]


def test_a_full_disk_leaves_the_old_folder_and_no_temporary(disk):
    out = disk.folder / "tuned"
    before = _old_folder(out)
    disk.fill()
    with pytest.raises(OutputError, match=r"cannot write .*tuned/TUNED\.md: No space left"), publish_dir(out) as w:
        write_text(w / "TUNED.md", "x" * 100_000)
    assert _tree(out) == before and disk.listing() == ["tuned"]


def test_save_config_on_a_full_disk_leaves_the_old_file_and_no_temporary(disk):
    from mdl_jax import MDLConfig, save_config

    p = disk.folder / "cfg.json"
    save_config(MDLConfig(), p)
    before = p.read_bytes()
    disk.fill()
    with pytest.raises(OSError, match=r"cannot write .*cfg\.json: No space left on device"):
        save_config(MDLConfig(thresholds=(0.9, 0.6, 0.3)), p, note="n" * 20_000)
    assert p.read_bytes() == before and disk.listing() == ["cfg.json"]


def test_sweep_out_on_a_full_disk_is_one_line_and_exit_2(disk, tmp_path, cli):
    src = _parquet(tmp_path / "r.parquet")
    out = disk.folder / "o.csv"
    out.write_text("the previous sweep\n")
    disk.fill()
    rc, _, err = cli(["sweep", src, "--grid", "g_a=" + ",".join(str(i / 400) for i in range(400)),
                      "--out", out])
    assert rc == 2, err
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert err.startswith(f"mdl-jax: error: cannot write {out}: No space left on device")
    assert out.read_text() == "the previous sweep\n" and disk.listing() == ["o.csv"]


@pytest.mark.slow
def test_tune_on_a_full_disk_is_one_line_and_leaves_the_previous_tuned_set(disk, tmp_path, cli):
    out = disk.folder / "tuned"
    before = _old_folder(out)
    disk.fill()
    rc, _, err = cli(["tune", _records(tmp_path / "records.jsonl"), "--out", out, "--steps", "5", "--seeds", "0",
                      "--field-sets", "gates"])
    assert rc == 2 and err.count("mdl-jax: error:") == 1 and "Traceback" not in err, err
    assert re.search(rf"mdl-jax: error: cannot write {re.escape(str(out))}/[\w.-]+: No space left on device", err)
    assert _tree(out) == before and disk.listing() == ["tuned"]


@pytest.mark.slow
def test_analyze_on_a_full_disk_leaves_the_previous_analysis(disk, tmp_path):
    from mdl_repro.analysis.analyze import analyze

    out = disk.folder / "analysis"
    before = _old_folder(out, ("ANALYSIS.md", "analysis.json", "figure4_action_regions.png", "table6.md"))
    disk.fill()
    with pytest.raises(OutputError, match=r"cannot write .*analysis/.*: No space left on device"):
        analyze(_records(tmp_path / "records.jsonl"), out, data_dir=tmp_path)
    assert _tree(out) == before and disk.listing() == ["analysis"]


# ------------------------------------------------------- a run stopped midway publishes nothing

@pytest.mark.slow
def test_tune_stopped_after_its_first_file_leaves_the_previous_tuned_set(tmp_path, monkeypatch):
    from mdl_repro.analysis import learned

    out = tmp_path / "tuned"
    before = _old_folder(out)
    real = learned.write_text

    def stop_after(path, text, **kw):
        real(path, text, **kw)
        raise KeyboardInterrupt  # the kill after the first file of the set

    monkeypatch.setattr(learned, "write_text", stop_after)
    with pytest.raises(KeyboardInterrupt):
        learned.learned_table(_records(tmp_path / "records.jsonl"), out, steps=5, seeds=(0,), field_sets=("gates",))
    assert _tree(out) == before and sorted(os.listdir(tmp_path)) == ["records.jsonl", "run.json", "tuned"]


@pytest.mark.slow
def test_analyze_stopped_after_its_first_figure_leaves_the_previous_analysis(tmp_path, monkeypatch):
    from mdl_repro.analysis import figures
    from mdl_repro.analysis.analyze import analyze

    out = tmp_path / "analysis"
    before = _old_folder(out, ("ANALYSIS.md", "analysis.json", "figure4_action_regions.png", "table6.md"))
    real = figures.save_figure

    def stop_after(fig, path, **kw):
        real(fig, path, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(figures, "save_figure", stop_after)
    from mdl_jax import MDLConfig, save_config

    cfg = save_config(MDLConfig(), tmp_path / "cfg.json")
    with pytest.raises(KeyboardInterrupt):
        analyze(_records(tmp_path / "records.jsonl"), out, data_dir=tmp_path, config=cfg)
    assert _tree(out) == before
    assert sorted(os.listdir(tmp_path)) == ["analysis", "cfg.json", "records.jsonl", "run.json"]


def test_publish_dir_follows_a_link_only_to_a_folder_of_ours(tmp_path):
    elsewhere = tmp_path / "big-disk" / "analysis"
    elsewhere.mkdir(parents=True)
    (tmp_path / "analysis").symlink_to(elsewhere)
    with publish_dir(tmp_path / "analysis") as w:
        write_text(w / "ANALYSIS.md", "new\n")
    assert (tmp_path / "analysis").is_symlink() and _tree(elsewhere) == {"ANALYSIS.md": b"new\n"}
    (tmp_path / "tuned").symlink_to(tmp_path / "nowhere")  # dangling: we would create the folder it names
    with pytest.raises(OutputError, match="tuned: it is a symbolic link to .*nowhere, which is not an existing "
                                          "folder of yours"), publish_dir(tmp_path / "tuned"):
        pass
    assert not (tmp_path / "nowhere").exists()


def test_publish_dir_into_a_mount_point_renames_its_files_in(disk):
    if disk.kind != "tmpfs":
        pytest.skip("needs a mounted file system")
    before = _old_folder(disk.folder, ("TUNED.md", "tuned.json"))
    with publish_dir(disk.folder, owns=lambda n: n.lower().startswith("tuned")) as w:
        write_text(w / "TUNED.md", "new\n")
    assert _tree(disk.folder) == {"TUNED.md": b"new\n"} and before and disk.listing() == ["TUNED.md"]


@pytest.mark.slow
def test_analyze_replaces_its_previous_folder_whole_and_owns_every_name_it_writes(tmp_path):
    """A rerun of ``analyze`` into its previous folder: the stale file of the earlier run (a ``ref``
    table this run has no judge for) is gone, every name written is one ``analysis_file`` owns (so
    the next rerun swaps the folder whole), and no temporary folder remains."""
    from mdl_repro.analysis.analyze import analysis_file, analyze

    out = tmp_path / "analysis"
    _old_folder(out, ("ANALYSIS.md", "table6_ref.md", "figure5a_confusion_ref.png"))
    analyze(_records(tmp_path / "records.jsonl"), out, data_dir=tmp_path)
    names = sorted(os.listdir(out))
    assert "table6_ref.md" not in names and "figure5a_confusion_ref.png" not in names
    assert {"ANALYSIS.md", "analysis.json", "table6.md", "figure6_cases.png"} <= set(names)
    assert [n for n in names if not analysis_file(n)] == []
    assert (out / "ANALYSIS.md").read_text() != "old ANALYSIS.md\n"
    assert sorted(os.listdir(tmp_path)) == ["analysis", "records.jsonl", "run.json"]


def test_a_gate_scores_row_after_a_torn_line_is_kept(tmp_path):
    # the scores file was appended to as it was: a killed run's torn last line swallowed the next row
    import json

    from mdl_repro.pipeline.gate_scores import _Appender

    path = tmp_path / "gate_scores.jsonl"
    path.write_text('{"system": "B1", "qid": 1}\n{"system": "B1", "qi')
    w = _Appender(path)
    w.write([{"system": "B2", "qid": 2}])
    w.close()
    lines = path.read_text().splitlines()
    assert lines[1] == '{"system": "B1", "qi' and json.loads(lines[2]) == {"system": "B2", "qid": 2}


def test_judge_never_writes_over_its_input(tmp_path, cli):
    src = tmp_path / "one.jsonl"
    src.write_text('{"dataset": "truthfulqa", "qid": 5, "answer": "yes"}\n')
    (tmp_path / "link.jsonl").symlink_to(src)
    for out in (src, tmp_path / "link.jsonl"):
        rc, _, err = cli(["judge", src, "--out", out])
        assert rc == 2 and "is the IN.jsonl file" in err, err
    assert src.read_text() == '{"dataset": "truthfulqa", "qid": 5, "answer": "yes"}\n'


def test_score_gates_refuses_a_run_of_another_model(tmp_path, cli):
    # it scored with the bundled SmolLM2 whatever model had answered (its help said "the run's model")
    import json

    base = {"dataset": "truthfulqa", "qid": 0, "seed": 0, "answer": "x", "failed": False, "hallucinated": False,
            "M": 0.5, "R": 0.5, "A": 0.5, "C": 0.5, "alpha": 0.5, "C_final": 0.5}
    (tmp_path / "records.jsonl").write_text("".join(
        json.dumps({**base, "system": s, "action": "ACTIVE" if s == "B3" else None}) + "\n" for s in ("B1", "B2", "B3")))
    (tmp_path / "run.json").write_text(json.dumps({"model": "Qwen/Qwen2.5-Coder-1.5B-Instruct [float32]",
                                                   "config": {}}))
    rc, _, err = cli(["score-gates", tmp_path])
    assert rc == 2 and "the run's answers are from Qwen/Qwen2.5-Coder-1.5B-Instruct" in err, err


# ------------------------------------------------------------------- a disk that refuses the fsync

def _write_with(writer: str, p: Path, text: str) -> None:
    if writer == "write_text":
        write_text(p, text)
    elif writer == "atomic_path":
        with atomic_path(p) as t:
            t.write_text(text)
    elif writer == "append_bytes":
        append_bytes(p, text.encode())
    else:
        with publish_dir(p) as w:
            write_text(w / "f.md", text)


@pytest.mark.parametrize("refused", ["file", "folder"])
@pytest.mark.parametrize("writer", ["write_text", "atomic_path", "append_bytes", "publish_dir"])
def test_a_refused_fsync_is_an_output_error_naming_the_path(tmp_path, monkeypatch, writer, refused):
    """A write is on disk only once fsynced (the file, then the folder holding its new name): the disk
    refusing either fsync (EIO) is an error naming the path, never a quiet success; a refused fsync of
    the file leaves the old content. (A fake for the failure path only: ``os.fsync`` raises.)"""
    if writer == "append_bytes" and refused == "folder":
        pytest.skip("an append renames nothing: no folder fsync")
    p = tmp_path / "out"
    _write_with(writer, p, "old\n")
    real = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode) == (refused == "folder"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OutputError, match=f"cannot write {re.escape(str(p))}"):
        _write_with(writer, p, "new\n")
    monkeypatch.setattr(os, "fsync", real)
    if refused == "file" and writer != "append_bytes":
        assert (p / "f.md" if writer == "publish_dir" else p).read_text() == "old\n"
        assert os.listdir(tmp_path) == ["out"]


def test_an_append_on_a_full_disk_is_an_output_error_naming_the_path(disk):
    p = disk.folder / "records.jsonl"
    append_bytes(p, b'{"a": 1}\n')
    disk.fill()
    with pytest.raises(OutputError, match=r"cannot write .*records\.jsonl: No space left on device"):
        append_bytes(p, b'{"a": 2}\n' * 100_000)


@pytest.mark.parametrize("writer", ["atomic_open", "publish_dir"])
def test_an_error_of_the_blocks_own_reads_keeps_its_type(tmp_path, writer):
    """Only the writer's own refusals become OutputError: a file the block fails to read is the
    caller's FileNotFoundError, as it would be outside the block, and nothing is written."""
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError) as e, \
            (atomic_open(out, "w") if writer == "atomic_open" else publish_dir(out)):
        (tmp_path / "missing.json").read_text()
    assert not isinstance(e.value, OutputError) and os.listdir(tmp_path) == []


def test_atomic_path_publishes_nothing_where_the_writer_made_no_regular_file(tmp_path):
    target = tmp_path / "model.onnx"
    with pytest.raises(OutputError, match=r"model\.onnx: the writer made no regular file"), atomic_path(target) as t:
        t.mkdir()  # an exporter that wrote a folder of files under the name
    assert os.listdir(tmp_path) == []


def test_atomic_path_refuses_a_fifo_the_writer_made_without_waiting_for_a_reader(tmp_path):
    """The check that the writer made a regular file opened the name first, and an open of a FIFO
    for reading waits for a writer: it hung there. (The alarm only turns a hang into a failure.)"""
    def hung(*_):
        raise TimeoutError("atomic_path waited on the FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        with pytest.raises(OutputError, match="the writer made no regular file"), \
                atomic_path(tmp_path / "model.onnx") as t:
            os.mkfifo(t)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert os.listdir(tmp_path) == []


def test_atomic_path_gives_the_mode_open_would_give_whatever_mode_the_writer_chose(tmp_path):
    """A writer that makes its file private (0600, as a temporary-file helper does) still publishes
    the file a plain ``open`` would make: 0666 less the umask."""
    old = os.umask(0o022)
    try:
        with atomic_path(tmp_path / "model.onnx") as t:
            os.close(os.open(t, os.O_WRONLY | os.O_CREAT, 0o600))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "model.onnx").st_mode) == 0o644


def test_publish_dir_publishes_a_symbolic_link_the_block_made(tmp_path):
    """A link among the new files is published as a link: the fsync of the new files skips it (it
    is not followed, and there is nothing of ours behind it to sync)."""
    out = tmp_path / "out"
    with publish_dir(out) as w:
        write_text(w / "v2.md", "new\n")
        (w / "latest.md").symlink_to("v2.md")
    assert (out / "latest.md").is_symlink() and (out / "latest.md").read_text() == "new\n"


def test_publish_dir_refuses_a_link_to_a_folder_of_another_user(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("making a folder of another user needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 12345, 12345)
    (tmp_path / "out").symlink_to(theirs)
    with pytest.raises(OutputError, match="which is not an existing folder of yours"), publish_dir(tmp_path / "out") as w:
        write_text(w / "f.md", "new\n")
    assert os.listdir(theirs) == []


def test_a_published_folder_gets_the_mode_mkdir_would_give(tmp_path):
    old = os.umask(0o027)
    try:
        with publish_dir(tmp_path / "out") as w:
            write_text(w / "f.md", "new\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "out").st_mode) == 0o750


def test_publish_dir_whose_new_folder_cannot_be_renamed_in_puts_the_old_one_back(tmp_path, monkeypatch):
    """The swap renames the old folder aside, then the new one in: a refusal of the second rename
    (a fake for the failure path) leaves the old folder at its name, whole."""
    out = tmp_path / "tuned"
    before = _old_folder(out)
    real = os.rename

    def rename(src, dst):
        if Path(dst) == out and Path(src).name.startswith(".tuned.") and Path(src).name.endswith(".tmp"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OutputError, match="tuned"), publish_dir(out, owns=lambda n: True) as w:
        write_text(w / "TUNED.md", "new\n")
    monkeypatch.setattr(os, "rename", real)
    assert _tree(out) == before
    assert os.listdir(tmp_path) == ["tuned"]


def test_an_append_refuses_a_fifo_that_has_a_reader(tmp_path):
    p = tmp_path / "records.jsonl"
    os.mkfifo(p)
    reader = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(OutputError, match="records.jsonl: not a regular file"):
            append_bytes(p, b"x\n")
        assert os.read(reader, 10) == b""  # nothing went into it
    finally:
        os.close(reader)


def test_a_write_without_make_parents_refuses_a_missing_folder_and_makes_none(tmp_path):
    with pytest.raises(OutputError, match=r"cannot write .*missing/a\.json"):
        write_text(tmp_path / "missing" / "a.json", "{}\n", make_parents=False)
    assert os.listdir(tmp_path) == []


def test_write_text_writes_in_the_encoding_it_is_given(tmp_path):
    write_text(tmp_path / "a.txt", "é", encoding="latin-1")
    assert (tmp_path / "a.txt").read_bytes() == b"\xe9"


def test_publish_dir_publishes_a_fifo_the_block_made(tmp_path):
    """The fsync of the new files is of regular files (and folders): a FIFO among them, which
    cannot be fsynced, is published as it is."""
    out = tmp_path / "out"
    with publish_dir(out) as w:
        os.mkfifo(w / "pipe")
        write_text(w / "f.md", "new\n")
    assert stat.S_ISFIFO(os.lstat(out / "pipe").st_mode) and (out / "f.md").read_text() == "new\n"


def test_a_refused_fsync_of_the_shared_folder_files_were_renamed_into_is_an_output_error(tmp_path, monkeypatch):
    """A folder holding files this output does not own gets the new files renamed in one by one; its
    fsync makes the renames durable, and the disk refusing it (a fake: ``os.fsync`` raises for that
    folder only) is an error naming it."""
    run = tmp_path / "run"
    _old_folder(run, ("records.jsonl", "REPORT.md"))
    real, ino = os.fsync, os.stat(run).st_ino

    def fsync(fd):
        if os.fstat(fd).st_ino == ino:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OutputError, match=f"cannot write {re.escape(str(run))}"), \
            publish_dir(run, owns={"REPORT.md"}.__contains__) as w:
        write_text(w / "REPORT.md", "new\n")


def test_a_lock_file_whose_name_another_run_made_anew_as_it_locked_is_on_the_new_file(tmp_path, monkeypatch):
    """The old file went and another run created the name anew (and will lock it) just as this one
    locked: the lock taken is on the file the name holds, not on the one that went."""
    import fcntl

    p = tmp_path / ".lock"
    p.write_text("")
    real, left = fcntl.flock, [1]

    def flock(f, op):
        if left[0]:
            left[0] -= 1
            os.unlink(p)
            p.write_text("")
        return real(f, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    f = lock_file(p)
    assert f is not None
    try:
        assert os.fstat(f.fileno()).st_ino == os.stat(p).st_ino
    finally:
        f.close()


def test_a_lock_file_in_a_missing_folder_is_an_output_error_naming_it(tmp_path):
    with pytest.raises(OutputError, match=r"missing/\.lock"):
        lock_file(tmp_path / "missing" / ".lock")
    assert os.listdir(tmp_path) == []


def test_a_lock_file_whose_folder_make_folder_never_makes_is_an_output_error_not_a_held_lock(tmp_path):
    """``make_folder`` is called before each try; where the folder is still missing at the last try,
    that is the error, not "another run holds it"."""
    calls = []
    with pytest.raises(OutputError, match=r"missing/\.lock"):
        lock_file(tmp_path / "missing" / ".lock", make_folder=lambda: calls.append(1))
    assert len(calls) == _io._LOCK_TRIES


@pytest.mark.parametrize("keep_existing", [True, False])
def test_publish_dir_that_another_process_beat_to_the_name_keeps_or_replaces_its_copy(tmp_path, monkeypatch,
                                                                                        keep_existing):
    """Another process publishes the same folder just after this one saw the name free (a fake: the
    look at the name makes the other copy): its rename then fails on the folder that is there. A cache
    (``keep_existing``) keeps the first copy; any other output replaces it, as if it had been there."""
    out = tmp_path / "model"
    real, looks = os.path.lexists, [0]

    def lexists(p):
        if Path(p) == out:
            looks[0] += 1
            if looks[0] == 2:  # publish_dir's first look is at the start, the second as it publishes
                out.mkdir()
                (out / "config.json").write_text("first\n")
                return False
        return real(p)

    monkeypatch.setattr(os.path, "lexists", lexists)
    with publish_dir(out, keep_existing=keep_existing) as w:
        write_text(w / "config.json", "second\n")
    monkeypatch.setattr(os.path, "lexists", real)
    assert _tree(out) == {"config.json": b"first\n" if keep_existing else b"second\n"}
    assert os.listdir(tmp_path) == ["model"]
