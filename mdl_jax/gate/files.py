"""``mdl-jax gate IN --out OUT``: the memory gate over a file or a Hugging Face dataset, streamed.

IN is JSONL (``.jsonl`` / ``.ndjson``), Parquet, CSV (the memories cell holds a JSON list), a local
dataset folder (``datasets.load_from_disk``, else ``datasets.load_dataset(folder)``) or a dataset name on
the Hub (``datasets.load_dataset(name, streaming=True)``). Rows are read ``--chunk-size`` at a time,
decided in one batch and written as numbered part files beside OUT (``OUT.parts/part-000042.arrow``,
Arrow IPC, for a Parquet OUT; ``.jsonl`` for JSONL; each written to a temp file and renamed) with a
manifest that is replaced atomically after each part.
A killed run resumes from the manifest: part k always holds input rows [k·C, (k+1)·C), so a part
rewritten after a kill is the same part, and nothing is written twice. It resumes only onto what its
parts were decided from: the manifest records the input's content digest, the config's, the risk
table's and the embedder's identity and version, and a rerun onto any other stops (exit 2, saying
which changed; ``--restart`` starts over). At the end the parts are joined
into OUT (Parquet or JSONL by its suffix) and the folder is removed. Memory stays that of one chunk.

Output: the input's columns, then ``mdl_row`` (the 0-based input row), ``mdl_action`` (Active / Supp
/ Silent / Opt-Out) and ``mdl_M``, ``mdl_R``, ``mdl_A``, ``mdl_phi``, ``mdl_C``, ``mdl_alpha``,
``mdl_C_final``, ``mdl_E_wm``, ``mdl_E_r``, ``mdl_E_a``, ``mdl_n_relevant`` (prefixed so they never
clash with the input's own). In Parquet, a field that no row of the first part holds comes after them.

This module runs one ``GateJob`` (``run``): it opens the gate, takes the parts folder's lock, and
streams parts through reading (``reading.py``), deciding, writing (``writing.py``) and the manifest
(``manifest.py``); ``job.py`` holds the job and what those modules share.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import itertools
import os
import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mdl_jax._io import lock_file
from mdl_jax.gate.checks import unit_float
from mdl_jax.gate.core import ACTION_NAMES, RISK_PRESETS, MemoryGate, collector_paused
from mdl_jax.gate.job import (
    CHUNK_SIZE,
    MAX_BAD_MESSAGES,
    MAX_MESSAGE_CHARS,
    MAX_RISK_TABLE_BYTES,
    OUT_COLUMN_SET,
    OUT_COLUMNS,
    OUT_SUFFIXES,
    GateInputError,
    GateJob,
    RowFields,
    one_line,
    refuse_output_columns,
)
from mdl_jax.gate.manifest import (
    MANIFEST_VERSION,
    OLD_MANIFEST_VERSIONS,
    check_resume,
    clear,
    content_digest,
    digest,
    embedder_version,
    fingerprint,
    parts_folder,
    read_manifest,
    resumed_chunk_size,
    write_manifest,
)
from mdl_jax.gate.reading import (
    CSV_FIELD_LIMIT,
    MAX_JSON_DEPTH,
    MAX_LINE_BYTES,
    iter_rows,
    jsonl_parts,
    parquet_file,
    parse_row,
    source_kind,
    strict_json,
)
from mdl_jax.gate.writing import (
    ACTION_BY_CODE,
    JSON_COLUMNS_KEY,
    MAX_PARQUET_NESTING,
    PART_SUFFIX,
    Decided,
    join_parts,
    write_part,
)
from mdl_jax.signals.embeddings import Embedder, ModelLoadError
from mdl_jax.strict_json import DuplicateKeyError, loads_unique

# What callers import from here: the run, its job and error, the bounds and the output's names (the
# pieces live in job.py, reading.py, manifest.py and writing.py beside this module).
__all__ = [
    "ACTION_NAMES", "CHUNK_SIZE", "COST", "CSV_FIELD_LIMIT", "JSON_COLUMNS_KEY", "MANIFEST_VERSION",
    "MAX_BAD_MESSAGES", "MAX_JSON_DEPTH", "MAX_LINE_BYTES", "MAX_MESSAGE_CHARS", "MAX_PARQUET_NESTING",
    "MAX_RISK_TABLE_BYTES", "OLD_MANIFEST_VERSIONS", "OUT_COLUMNS", "OUT_SUFFIXES", "PART_SUFFIX",
    "GateInputError", "GateJob", "RowFields", "iter_rows", "parse_row", "refuse_output_columns", "run",
    "strict_json",
]

# The cost a user is told before a long run: embedding is most of a first run, the cache makes a second
# one cheap (the figures behind COST are in docs/benchmarks.md, "Memory gate").
COST = ("the first run embeds every unique text with MiniLM (~430 texts/s on an idle 2-core VM); "
        "with the texts cached, about 55,000 rows/s after ~2 s of start-up")


def _load_embedder(spec: str):
    """A model name / path, or ``module:function`` naming a callable texts -> (N, d) array, or an object
    with ``embed(texts)`` (the user's: what it raises is ``_EmbedderFailed`` naming it)."""
    if ":" in spec and not Path(spec).exists() and not spec.startswith(("/", ".")):
        mod, _, attr = spec.partition(":")
        try:
            fn = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise GateInputError(f"--embedder: cannot import {spec!r} ({e})") from None
        except Exception as e:  # noqa: BLE001 - the user's module runs its own code as it is imported
            raise _users_error(spec, "importing it", e) from e
        if isinstance(fn, Embedder):  # the library's own: a fault of its model is a ModelLoadError
            return fn
        if hasattr(fn, "embed"):
            return _UsersObject(spec, fn)
        return _UsersFunction(spec, fn) if callable(fn) else fn
    return spec


class _EmbedderFailed(GateInputError):
    """The user's ``--embedder module:function`` raised: one line naming it, exit 2, as bad input is;
    the parts written stay (their rows were decided), also in a fresh run."""


class _UsersFunction:
    """The user's ``--embedder module:function``: what it raises is the user's to fix, so it is one
    line naming the flag, the exception's type and its message, not a traceback into the gate."""

    def __init__(self, spec: str, fn: Callable):
        self.spec, self.fn = spec, fn

    def __call__(self, texts: list[str]) -> Any:
        try:
            return self.fn(texts)
        except Exception as e:  # noqa: BLE001 - the user's code raises its own types
            raise _users_error(self.spec, "the function", e) from e


class _UsersObject:
    """The user's ``--embedder module:name`` naming an object with ``embed(texts)``: what its ``embed``
    raises is one line, as for a function (its ValueError was the rows' error, and a fresh run's
    parts were removed with it); its other attributes are the object's."""

    def __init__(self, spec: str, obj: Any):
        self.spec, self.inner = spec, obj
        embed = obj.embed

        @functools.wraps(embed)  # its signature: the gate passes ``desc`` only where embed takes it
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            try:
                return embed(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - the user's code raises its own types
                raise _users_error(spec, "its embed", e) from e

        self.embed = wrapped

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being made): no recursion through it
            raise AttributeError(name)
        return getattr(self.inner, name)


def _users_error(spec: str, what: str, e: Exception) -> _EmbedderFailed:
    """The one line for an exception ``e`` raised by the user's embedder ``spec``."""
    try:
        said = " ".join(str(e).split())[:300]
    except Exception:  # noqa: BLE001 - the user's exception type may fail to print itself
        said = "(its message cannot be printed)"
    return _EmbedderFailed(f"--embedder {spec}: {what} raised {type(e).__name__}: {said}")


def _risk_spec(s: str):
    if s in RISK_PRESETS:
        return s
    if s.lower().endswith(".json"):
        return _risk_table(s)
    try:
        return unit_float("--risk", float(s))
    except ValueError:
        raise GateInputError(f"--risk: expected a number in [0, 1], one of {list(RISK_PRESETS)} or a "
                             f"JSON {{category: risk}} file, got {s!r}") from None


def _read_small(path: str, flag: str, what: str, limit: int) -> bytes:
    """The bytes of a small regular file (after links; ``mdl_jax._fs.read_small``: a FIFO cannot hang
    the run); GateInputError naming ``flag`` otherwise."""
    from mdl_jax._fs import SmallFileError, read_small

    try:
        return read_small(path, limit)
    except SmallFileError as e:
        if e.kind == "unreadable":
            raise GateInputError(f"{flag}: cannot read the {what} {path} ({e.reason})") from None
        if e.kind == "not regular":
            raise GateInputError(f"{flag}: the {what} {path} is not a regular file") from None
        raise GateInputError(f"{flag}: the {what} {path} is larger than {limit:,} bytes") from None


def _risk_table(path: str) -> dict:
    """A --risk JSON file: an object {category: A in [0, 1]}, read as strict JSON (GateInputError naming
    the file and what is wrong: not UTF-8, not JSON, too deep, a value that is not such a number, a
    category stated twice)."""
    data = _read_small(path, "--risk", "risk table", MAX_RISK_TABLE_BYTES)
    try:
        table = strict_json(data.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError among them
        raise GateInputError(f"--risk: the risk table {path} is not a JSON object ({one_line(e)[:200]})") from None
    if not isinstance(table, dict):
        raise GateInputError(f"--risk: the risk table {path} is a JSON {type(table).__name__}; expected an "
                             "object {category: risk in [0, 1]}")
    for k, v in table.items():
        if type(v) not in (int, float) or not 0 <= v <= 1:
            shown = repr(v) if type(v) in (int, float, str, bool) or v is None else f"a JSON {type(v).__name__}"
            raise GateInputError(f"--risk: the risk table {path}: {k[:60]!r} maps to {shown[:60]}; expected a "
                                 "number in [0, 1]")
    try:  # read again for a category stated twice, which JSON would map to its last risk silently
        loads_unique(data.decode("utf-8"))
    except DuplicateKeyError as e:
        raise GateInputError(f"--risk: the risk table {path}: {e}") from None
    return table


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A job as it runs: the job (its chunk size resolved), its input's kind, the fields rows are read
    by, the parts folder and OUT's format."""

    job: GateJob
    kind: str
    chunk: int
    fields: RowFields
    work: Path
    fmt: str


def run(job: GateJob) -> int:
    """The ``gate`` subcommand: decide every row of ``job.input`` into ``job.out``, resuming an
    unfinished run of the same job.

    Args:
      job: what to run (the command line makes it from its flags).

    Returns:
      0 (the summary is printed to stderr).

    Raises:
      TypeError: ``job`` is not a ``GateJob``.
      GateInputError: bad input or arguments, an exception raised by a ``module:function`` embedder
        (naming it, its type and message; chained to it), or a resume onto anything other than what
        the parts were decided from (the caller prints it as one line, exit 2).
      OutputError: the parts folder's lock cannot be opened (a symbolic link or another non-regular
        file planted at it, a read-only folder), named as the project's one writer names it.
    """
    from tqdm.auto import tqdm

    if not isinstance(job, GateJob):
        raise TypeError(f"job: expected a GateJob, got {type(job).__name__}")
    out, work = Path(job.out), job.parts_folder
    kind = source_kind(job.input)
    if out.exists() and not os.path.lexists(work):
        raise GateInputError(f"--out: {out} exists; remove it or choose another file")
    gate, risk = _open_gate(job)
    lock = lock_file(work / "lock", make_folder=lambda: parts_folder(work, out))
    if lock is None:
        raise GateInputError(f"--out: another mdl-jax gate run is writing {out}")
    try:
        if out.exists() and not os.path.lexists(work / "manifest.json"):
            # OUT written since the check above, by a run that began and ended meanwhile (its parts
            # folder gone, this one new): refused as it would be now, its folder removed under its lock
            shutil.rmtree(work, ignore_errors=True)
            raise GateInputError(f"--out: {out} exists; remove it or choose another file")
        plan, man, fresh = _begin(job, kind, gate, risk)
    except BaseException:
        lock.close()
        raise
    try:
        if not man["done"]:
            _stream(gate, plan, man, tqdm)
            _join(plan, man, out)
    except BaseException as e:
        # bad input in a fresh run, or anything (a crash, Ctrl-C) before a part is on disk, leaves
        # nothing behind; otherwise the parts stay for the rerun that resumes. The folder goes before
        # the lock is let go: a run that locks it meanwhile finds its lock file gone and makes its own
        if not man["parts"] or (fresh and isinstance(e, GateInputError)
                                and not isinstance(e, (_BackendChanged, _EmbedderFailed))):
            shutil.rmtree(work, ignore_errors=True)
        lock.close()
        raise
    _summary(man, out)
    shutil.rmtree(work, ignore_errors=True)
    lock.close()
    return 0


def _open_gate(job: GateJob) -> tuple[MemoryGate, Any]:
    """The job's gate, and its risk as ``MemoryGate`` takes it (a number, a preset or a table)."""
    risk = _risk_spec(job.risk)
    if isinstance(risk, dict) and not job.category_field and not job.risk_field:
        raise GateInputError(f"--risk: the risk table {job.risk} maps categories to A; name the rows' "
                             "category with --category-field")
    if risk == "truthfulqa" and not job.category_field and not job.risk_field:
        # the preset reads categories; without them every row silently got its default
        warnings.warn("--risk truthfulqa reads each row's category, but no --category-field is given: "
                      "every row gets the preset's default A = 0.5", stacklevel=3)
    embedder, backend = _load_embedder(job.embedder), job.embed_backend
    if backend != "auto" and not isinstance(embedder, str):
        raise GateInputError("--embed-backend: applies to a model name or path, not to a module:function embedder")
    try:
        gate = MemoryGate(embedder=embedder, risk=risk, config=job.config, cache_dir=job.cache_dir,
                          embed_backend=backend)
    except ValueError as e:
        raise GateInputError(str(e)) from None
    emb = gate.embedder
    if isinstance(emb, Embedder) and emb.requested_backend == "auto" and emb.backend != "torch":
        # "auto" settles on load (an export that fails falls back to torch): load now, so the manifest
        # records the backend that will run, never one that a fallback replaced mid-run
        try:
            _ = emb.model
        except ModelLoadError as err:   # named as the first chunk names it (``_decide_chunk``)
            raise GateInputError(f"--embedder: {str(err).removeprefix('embedder: ')}") from None
        except ValueError as err:
            raise GateInputError(str(err)) from None
    return gate, risk


def _begin(job: GateJob, kind: str, gate: MemoryGate, risk: Any) -> tuple[_Plan, dict, bool]:
    """Under the parts folder's lock: (the run's plan, its chunk size resolved; the manifest, new or the
    unfinished run's, checked; whether the run is fresh). ``--restart`` clears the folder first."""
    work = job.parts_folder
    if job.restart:
        clear(work)
    # the run being resumed keeps its parts' size; a new one the default
    chunk = job.chunk_size if job.chunk_size is not None else resumed_chunk_size(work) or CHUNK_SIZE
    job = dataclasses.replace(job, chunk_size=chunk)
    emb = gate.embedder
    depends = {
        # a Parquet file or a dataset folder is read out of file order: digested whole, first
        "input_sha256": content_digest(job.input) if kind in ("parquet", "hf-disk", "hf-folder") else None,
        "config_sha256": digest(dataclasses.asdict(gate.config)),
        "risk_sha256": digest(risk) if isinstance(risk, dict) else None,
        "embedder_version": embedder_version(emb, job.embedder)}
    fp = fingerprint(job, emb.backend_id if isinstance(emb, Embedder) else None, depends)
    fresh = not os.path.lexists(work / "manifest.json")
    man: dict[str, Any] = {"version": MANIFEST_VERSION, "args": fp, "parts": [], "done": False}
    if not fresh:  # another run's folder is left as it is: the error says how to start over
        man = read_manifest(work, fp)
        check_resume(job, kind, man)
    return _Plan(job, kind, chunk, job.row_fields(kind), work, job.out_format), man, fresh


def _join(plan: _Plan, man: dict, out: Path) -> None:
    """Every part on disk: join them into OUT, say what was written as JSON text or null, and mark the
    manifest done."""
    if not any(p["n_rows"] for p in man["parts"]):
        bad = [m for p in man["parts"] for m in p["bad"]]
        n_bad = sum(p["n_bad"] for p in man["parts"])
        # every row was bad: say why (the first), as an error without --on-bad-row skip would
        raise GateInputError(f"{plan.job.input}: no rows to decide"
                             + (f" ({n_bad} bad rows skipped; the first: {bad[0]})" if bad else ""))
    work = plan.work
    as_json = join_parts([work / p["file"] for p in man["parts"] if p["n_rows"]], out, plan.fmt, work)
    if as_json:
        print(f"mdl-jax: note: {', '.join(map(repr, as_json))} written as JSON text: their values mix "
              "types (e.g. texts and dicts), which a Parquet column cannot hold", file=sys.stderr)
    nulled = sorted({f for p in man["parts"] for f in p.get("nan_as_null", ())})
    if nulled:
        print(f"mdl-jax: note: {', '.join(map(repr, nulled))} held NaN or infinite numbers, written as "
              "null: JSON has neither", file=sys.stderr)
    man["done"] = True
    write_manifest(work, man)


def _decide_chunk(gate: MemoryGate, plan: _Plan, batch) -> tuple[Decided, dict, list[str]]:
    """Decide one chunk: (output rows, action counts, bad-row messages)."""
    job = plan.job
    good, parsed, bad = [], [], []
    for i, row, where in batch:
        if isinstance(row, dict) and not OUT_COLUMN_SET.isdisjoint(row):
            # not a bad row: the input is a gated file (every row has them); never skipped
            refuse_output_columns(row, where=f"{job.input}, {where}")
        try:
            q, mems, cat, risk = parse_row(row, plan.fields)
            if risk is None:  # the assessor per row, so a category outside a table is this row's error
                try:
                    risk = gate.risk(q, cat)
                except ValueError as e:
                    field = job.category_field or "query"
                    raise GateInputError(f"field {field!r}: {e}") from None
            parsed.append((q, mems, cat, risk))
            good.append((i, row))
        except GateInputError as e:
            msg = f"{job.input}, {where}: {e}"
            if job.on_bad_row == "error":
                raise GateInputError(msg) from None
            bad.append(msg[:MAX_MESSAGE_CHARS])
    counts = {name: 0 for name in ACTION_NAMES.values()}
    if not good:
        return Decided([], [], {}), counts, bad
    qs, texts, _, risks = (list(x) for x in zip(*parsed))
    try:  # every row checked by parse_row, its risk in [0, 1] (unit_float, or the assessor's): not again
        cols = gate.columns_checked(qs, texts, np.asarray(risks, np.float32))
    except _EmbedderFailed:  # named already; not the rows' error
        raise
    except ModelLoadError as e:  # the model loads on the first chunk: not the rows' error
        # its message begins "embedder: ", the library's name for what the command calls --embedder
        raise GateInputError(f"--embedder: {str(e).removeprefix('embedder: ')}") from None
    except ValueError as e:  # a category outside a risk table, a callable risk out of range, ...
        raise GateInputError(f"{job.input}, rows {good[0][0] + 1}-{good[-1][0] + 1}: {e}") from None
    for a, n in enumerate(np.bincount(cols["action"], minlength=len(ACTION_BY_CODE)).tolist()):
        counts[ACTION_BY_CODE[a]] += n
    return Decided([row for _, row in good], [i for i, _ in good], cols), counts, bad


def _stream(gate: MemoryGate, plan: _Plan, man: dict, tqdm) -> None:
    C, kind, job = plan.chunk, plan.kind, plan.job
    start = len(man["parts"]) * C
    total = parquet_file(Path(job.input)).metadata.num_rows if kind == "parquet" else None
    readers: list = []  # what digests the input as it is read (a CSV file's bytes, a Hub dataset's rows)
    expect = man["parts"][-1].get("input") if man["parts"] and kind == "hf-hub" else None
    rows = None if kind == "jsonl" else iter_rows(job.input, kind, start=start, split=job.split, chunk=C,
                                                  on_open=readers.append, expect=expect)
    bar = tqdm(total=total, initial=start, desc="mdl-jax gate", unit="row", file=sys.stderr,
               disable=job.no_progress)
    try:  # the bar ends its line, also when the run stops: an error is printed on a line of its own
        _stream_parts(gate, plan, man, rows, readers, bar)
    finally:
        bar.close()


def _stream_parts(gate: MemoryGate, plan: _Plan, man: dict, rows, readers: list, bar) -> None:
    C, work = plan.chunk, plan.work
    k = len(man["parts"])
    kept = sum(len(p["bad"]) for p in man["parts"])
    # part k holds input rows [k·C, (k+1)·C); the other readers yield every row, numbered in order, so a
    # part is one run of rows whose number // C is k (read as the part is taken)
    parts = (jsonl_parts(Path(plan.job.input), k, C) if plan.kind == "jsonl"
             else (list(run) for _, run in itertools.groupby(rows, key=lambda r: r[0] // C)))
    while True:
        lo, hi = k * C, (k + 1) * C
        # the collector off while a part's rows (a few objects each, none in a cycle) are read and
        # decided: it walked them ~every 700 allocations (see collector_paused); on again for the write
        with collector_paused(C):
            batch: Any = next(parts, None)
            if batch is None:
                break
            recs, counts, bad = _decide_chunk(gate, plan, batch)
            while _backend_changed(gate, man, work):  # nothing written yet: the run takes the new backend
                recs, counts, bad = _decide_chunk(gate, plan, batch)
        # the input read so far (its digest recorded: a resume checks it is unchanged)
        read = getattr(batch, "digest", None) or (readers[0].state() if readers else None)
        name = f"part-{k:06d}{PART_SUFFIX[plan.fmt]}"
        size, nulled = 0, []
        if recs:
            nulled = write_part(work / name, recs, plan.fmt)  # on disk (fsynced, folder too) before the manifest names it
            size = os.lstat(work / name).st_size
        # the manifest keeps the first MAX_BAD_MESSAGES messages and counts the rest: its size is bounded
        # by the number of parts, whatever the number of bad rows
        keep = bad[:max(0, MAX_BAD_MESSAGES - kept)]
        kept += len(keep)
        man["parts"].append({"file": name, "start": lo, "end": hi, "n_rows": len(recs), "bytes": size,
                             "counts": counts, "bad": keep, "n_bad": len(bad), "input": read,
                             **({"nan_as_null": nulled} if nulled else {})})
        write_manifest(work, man)
        bar.update(len(batch))
        k += 1


class _BackendChanged(GateInputError):
    """The embedder's backend changed mid-run: the parts written stay, also in a fresh run."""


def _backend_changed(gate, man: dict, work: Path) -> bool:
    """Whether the embedder's backend changed while a part was decided: under "auto" a runtime that
    fails at inference hands over to the next one (``Embedder._fall_back``), and the run's parts must
    not mix two backends' vectors. Before the first part is written the run takes the new backend
    (recorded in the manifest; True: decide the part again, under it alone); after, it stops with
    ``_BackendChanged``, and the parts on disk stay for a rerun to resume."""
    emb = getattr(gate, "embedder", None)
    then = man["args"].get("embed_backend")
    if not isinstance(emb, Embedder) or then is None or emb.backend_id == then:
        return False
    if not man["parts"]:
        man["args"]["embed_backend"] = emb.backend_id
        return True
    now = emb.backend_id.partition("@")[0]
    raise _BackendChanged(
        f"--embed-backend: the embedder failed with {then} during this run and 'auto' went on with "
        f"{emb.backend_id} (the warning above says why). The parts written so far ({len(man['parts'])}) were "
        f"embedded with {then}; the next one is not written, so no output mixes the two. Run the same "
        f"command again to resume with {then}, or remove {work} and run with --embed-backend {now}")


def _summary(man: dict, out: Path) -> None:
    counts = {name: sum(p["counts"][name] for p in man["parts"]) for name in ACTION_NAMES.values()}
    bad = [m for p in man["parts"] for m in p["bad"]]
    n_bad = sum(p["n_bad"] for p in man["parts"])
    n = sum(counts.values())
    line = ", ".join(f"{k} {v}" for k, v in counts.items())
    backend = (man.get("args") or {}).get("embed_backend")
    via = f"; embedder backend {backend}" if backend else ""
    print(f"mdl-jax gate: {n} rows decided → {out} ({line}); {n_bad} bad rows skipped{via}",
          file=sys.stderr)
    for msg in bad[:5]:
        print(f"  skipped: {msg}", file=sys.stderr)
    if n_bad > 5:
        print(f"  ... and {n_bad - 5} more", file=sys.stderr)
