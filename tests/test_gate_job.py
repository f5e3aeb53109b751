"""``GateJob``: the one frozen description of an ``mdl-jax gate`` run. Every flag of the command is a
field of the job and reaches it; a job is checked when it is made (types by field name, values by the
flag's name, in the command's own words); the run takes nothing else, and no module of the gate reads
the parsed arguments."""

import argparse
import ast
import dataclasses
from pathlib import Path

import pytest

from mdl_jax.cli import Parser
from mdl_jax.cli import gate as gate_cli
from mdl_jax.gate import files
from mdl_jax.gate.job import CHUNK_SIZE, GateInputError, GateJob, RowFields

GATE = Path(files.__file__).parent


def _gate_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    parser = Parser(prog="mdl-jax")
    sub = parser.add_subparsers(dest="cmd")
    gate_cli.register(sub)
    return parser, sub.choices["gate"]


def test_every_flag_of_the_command_is_a_field_of_the_job():
    _, p = _gate_parser()
    flags = {a.dest for a in p._actions if a.dest != "help"}
    assert flags == {f.name for f in dataclasses.fields(GateJob)}


def test_the_command_line_hands_every_flag_to_the_job():
    parser, _ = _gate_parser()
    argv = ["gate", "in.jsonl", "--out", "o.parquet", "--query-field", "q", "--memories-field", "m",
            "--risk-field", "r", "--category-field", "c", "--risk", "t.json", "--config", "cfg.json",
            "--embedder", "pkg:fn", "--embed-backend", "torch", "--cache-dir", "cache", "--split", "test",
            "--chunk-size", "7", "--on-bad-row", "skip", "--restart", "--no-progress"]
    job = gate_cli.job_from_args(parser.parse_args(argv))
    assert job == GateJob(input="in.jsonl", out="o.parquet", query_field="q", memories_field="m", risk_field="r",
                          category_field="c", risk="t.json", config="cfg.json", embedder="pkg:fn",
                          embed_backend="torch", cache_dir="cache", split="test", chunk_size=7,
                          on_bad_row="skip", restart=True, no_progress=True)


def test_the_commands_defaults_are_the_jobs():
    parser, _ = _gate_parser()
    assert gate_cli.job_from_args(parser.parse_args(["gate", "in.jsonl", "--out", "o.jsonl"])) == \
        GateJob(input="in.jsonl", out="o.jsonl")


def test_a_job_is_frozen_and_names_where_rows_are_read():
    job = GateJob(input="in.csv", out="dir/o.JSONL", category_field="cat")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.out = "other.jsonl"
    assert job.out_format == ".jsonl" and job.parts_folder == Path("dir/o.JSONL.parts")
    assert job.row_fields("csv") == RowFields("query", "memories", "cat", None, "csv")


@pytest.mark.parametrize("kw, flag", [
    ({"out": "o.csv"}, r"--out: o\.csv: expected a \.parquet or \.jsonl file name"),
    ({"chunk_size": 0}, "--chunk-size: expected a positive int, got 0"),
    ({"on_bad_row": "warn"}, "--on-bad-row: expected one of"),
    ({"embed_backend": "tpu"}, "--embed-backend: expected one of"),
])
def test_a_bad_value_is_refused_when_the_job_is_made_naming_the_flag(kw, flag):
    with pytest.raises(GateInputError, match=flag):
        GateJob(**{"input": "in.jsonl", "out": "o.jsonl", **kw})


@pytest.mark.parametrize("kw, field", [
    ({"input": Path("in.jsonl")}, "GateJob.input: expected a string"),
    ({"risk": 0.5}, "GateJob.risk: expected a string"),
    ({"config": 3}, "GateJob.config: expected a string or None"),
    ({"chunk_size": "7"}, "GateJob.chunk_size: expected an int or None"),
    ({"chunk_size": True}, "GateJob.chunk_size: expected an int or None"),
    ({"restart": 1}, "GateJob.restart: expected a bool"),
])
def test_a_wrong_type_is_a_type_error_naming_the_field(kw, field):
    with pytest.raises(TypeError, match=field):
        GateJob(**{"input": "in.jsonl", "out": "o.jsonl", **kw})


def test_the_command_line_says_a_bad_job_in_one_line_with_exit_2(capsys):
    from mdl_jax.cli import main

    assert main(["gate", "in.jsonl", "--out", "o.txt"]) == 2
    assert capsys.readouterr().err == "mdl-jax: error: --out: o.txt: expected a .parquet or .jsonl file name\n"


def test_the_run_takes_a_job_and_nothing_else():
    ns = argparse.Namespace(input="in.jsonl", out="o.jsonl", chunk_size=None)
    with pytest.raises(TypeError, match="job: expected a GateJob, got Namespace"):
        files.run(ns)


def test_a_run_without_chunk_size_records_the_default_in_its_manifest(tmp_path, monkeypatch):
    """The job's chunk size is resolved once, before the manifest is written, and the run stays on it."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"query": "is it safe?", "memories": ["it is safe"]}\n')
    seen = {}
    real = files._summary
    monkeypatch.setattr(files, "_summary", lambda man, out: (seen.update(man=man), real(man, out)))
    job = GateJob(input=str(src), out=str(tmp_path / "o.jsonl"), embedder="tests.gate_embedders:hashed",
                  no_progress=True)
    assert files.run(job) == 0
    assert seen["man"]["args"]["chunk_size"] == CHUNK_SIZE and job.chunk_size is None  # the caller's job unchanged


def test_a_run_into_an_out_another_run_is_writing_is_refused_and_the_next_one_resumes(tmp_path):
    from mdl_jax._io import lock_file

    src = tmp_path / "in.jsonl"
    src.write_text('{"query": "is it safe?", "memories": ["it is safe"]}\n')
    job = GateJob(input=str(src), out=str(tmp_path / "o.jsonl"), embedder="tests.gate_embedders:hashed",
                  no_progress=True)
    job.parts_folder.mkdir()
    held = lock_file(job.parts_folder / "lock")  # another run's lock
    assert held is not None
    try:
        with pytest.raises(GateInputError, match="--out: another mdl-jax gate run is writing .*o.jsonl"):
            files.run(job)
    finally:
        held.close()
    assert not (tmp_path / "o.jsonl").exists()
    assert files.run(job) == 0 and (tmp_path / "o.jsonl").exists() and not job.parts_folder.exists()


@pytest.mark.parametrize("bad_input", [False, True])
def test_a_run_removes_its_parts_folder_while_it_still_holds_the_lock(bad_input, tmp_path, monkeypatch):
    # removed after the lock is let go, the lock file could be locked by a run starting then, whose lock
    # would guard a file no longer in the folder while a third run locked a new one
    from mdl_jax import _io

    src = tmp_path / "in.jsonl"
    src.write_text('{"query": "is it safe?", "memories": ["it is safe"]}\n' if not bad_input
                   else '{"query": "is it safe?", "memories": 3}\n')
    job = GateJob(input=str(src), out=str(tmp_path / "o.jsonl"), embedder="tests.gate_embedders:hashed",
                  no_progress=True)
    at_release = []

    class Held:
        def __init__(self, f):
            self.f = f

        def close(self):
            at_release.append(job.parts_folder.exists())
            self.f.close()

    monkeypatch.setattr(files, "lock_file", lambda p, **kw: Held(_io.lock_file(p, **kw)))
    if bad_input:
        with pytest.raises(GateInputError):
            files.run(job)
    else:
        assert files.run(job) == 0
    assert at_release == [False] and not job.parts_folder.exists()


def test_a_run_that_finds_out_written_once_it_holds_the_lock_leaves_that_out_as_it_is(tmp_path, monkeypatch):
    # a run checks OUT before it loads its gate and takes the lock: a run of another job that began and
    # ended meanwhile wrote OUT and removed its parts folder, and this one, finding no parts, began afresh
    # and replaced that OUT with its own; run one after the other, it is refused
    src = tmp_path / "in.jsonl"
    src.write_text('{"query": "is it safe?", "memories": ["it is safe"]}\n')
    out = tmp_path / "o.jsonl"
    first, second = (GateJob(input=str(src), out=str(out), embedder="tests.gate_embedders:hashed", risk=risk,
                             no_progress=True) for risk in ("0.2", "0.7"))
    real = files._open_gate

    def open_gate(job):
        got = real(job)
        if job is second:
            assert files.run(first) == 0  # the other run, from its start to its end
        return got

    monkeypatch.setattr(files, "_open_gate", open_gate)
    with pytest.raises(GateInputError, match=r"--out: .*o.jsonl exists; remove it or choose another file"):
        files.run(second)
    assert '"mdl_A": 0.2' in out.read_text() and not second.parts_folder.exists()


@pytest.mark.parametrize("when", ["before its opening", "as it locks"])
def test_a_run_whose_parts_folder_goes_as_it_takes_the_lock_makes_it_again(when, tmp_path, monkeypatch):
    # a run ending beside this one removes its parts folder (holding its lock) just after this run found
    # it: that is no error of this run's (it was "cannot write ...lock: No such file or directory", or
    # "another mdl-jax gate run is writing" with none left), and the run goes on as one begun after
    from tests.races import folder_goes_once

    src = tmp_path / "in.jsonl"
    src.write_text('{"query": "is it safe?", "memories": ["it is safe"]}\n')
    job = GateJob(input=str(src), out=str(tmp_path / "o.jsonl"), embedder="tests.gate_embedders:hashed",
                  no_progress=True)
    left = folder_goes_once(monkeypatch, job.parts_folder, "lock", when)
    assert files.run(job) == 0 and (tmp_path / "o.jsonl").exists() and not job.parts_folder.exists()
    assert not left[0]


def test_no_module_of_the_gate_reads_parsed_arguments():
    """The job is the gate's only input from the command line: no module under mdl_jax/gate imports
    argparse or names a Namespace."""
    bad = []
    for path in sorted(GATE.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n == "argparse" or n.startswith("argparse.") for n in names):
                    bad.append(f"{path.name}:{node.lineno} imports argparse")
            elif isinstance(node, (ast.Name, ast.Attribute)) and "Namespace" in (
                    node.id if isinstance(node, ast.Name) else node.attr):
                bad.append(f"{path.name}:{node.lineno} names a Namespace")
    assert not bad, bad

