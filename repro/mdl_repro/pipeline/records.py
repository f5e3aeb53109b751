"""Durable, resumable records: one JSON line per (dataset, question, seed, system).

Records are appended chunk by chunk (one write, flush, fsync), so a run killed at any moment, even by
SIGKILL, loses at most the chunk in flight. ``read`` is the one reader of records files for every
consumer: it skips (with one warning per file) a torn line and any line that is not a record; ``load``
keeps, per key, the first successful record (a failed LLM call is retried by the next run, which
appends the fix).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: pandas is imported where a table is built
    import pandas

KEY = ("dataset", "qid", "seed", "system")


def key(rec: dict) -> tuple:
    return tuple(rec[k] for k in KEY)


class OtherInputs(ValueError):
    """An out dir holds records made from other inputs (data, model, generation settings, ...) than
    the run that would add to them (``experiment.check_inputs``)."""


def end_torn_line(path: Path) -> None:
    """End a line-oriented file's torn last line (a killed run's) with a newline, so the next line
    appended is a line of its own, not glued onto the fragment (which the readers skip).

    Raises:
        OutputError: the file is a symbolic link or not a regular file (refused before any read), or
          the newline cannot be written.
    """
    from mdl_jax._io import append_bytes, open_append

    if not os.path.lexists(path):
        return
    with open_append(path, "ab") as f:  # refuses a symlink or a FIFO before any read
        size = os.fstat(f.fileno()).st_size
    if size:
        with open(path, "rb") as r:
            r.seek(-1, os.SEEK_END)
            torn = r.read(1) != b"\n"
        if torn:
            append_bytes(path, b"\n")


class RecordWriter:
    """Appends records to a records file, each chunk fsynced (``mdl_jax._io.append_bytes``: opened
    without following a symbolic link, a regular file only).

    Raises:
        OutputError: the file is a symbolic link or not a regular file, or cannot be written (a
          full disk: a torn last line may remain, which ``read`` skips and the next writer ends).
    """

    def __init__(self, path: str | Path):
        from mdl_jax._io import OutputError, append_bytes

        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(self.path, e) from None
        self._append = append_bytes
        end_torn_line(self.path)

    def append(self, records: Iterable[dict]) -> None:
        data = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records)
        if not data:
            return
        self._append(self.path, data.encode("utf-8"))


def _why_not_a_record(rec, required: Sequence[str] = KEY) -> str | None:
    """Why a parsed line is not one of our records (None when it is)."""
    if not isinstance(rec, dict):
        kind = {type(None): "null", list: "array", str: "string", bool: "boolean"}.get(type(rec), "number")
        return f"a JSON {kind}, not an object"
    missing = [k for k in required if k not in rec]
    if missing:
        return f"an object without {missing}"
    # key fields are hashed (the dict key) and compared: scalars only; bool is not an id
    bad = [k for k in KEY if k in required and (isinstance(rec[k], bool)
                                                 or not isinstance(rec[k], (str, int, float)))]
    if bad:
        return f"an object whose {bad} are not strings or numbers"
    return None


def read(path: str | Path, required: Sequence[str] = KEY) -> Iterator[tuple[int, dict]]:
    """THE reader of records files: every consumer (reproduce's resume, the report, ``analyze``,
    ``tune``, ``judge``, the gate) reads records through it, so all tolerate the same damage.

    Yields (line number, record) for every line that is a JSON object carrying the ``required``
    fields (key fields must be strings or numbers). A line that is not one (torn by a kill
    mid-write, even inside a multi-byte UTF-8 character; not JSON; JSON that is not an object with
    those fields, such as ``[1,2,3]`` or ``null``) is skipped, and once the file is read ONE
    ``RuntimeWarning`` per file names the first few skipped lines. A missing file yields nothing.
    """
    p = Path(path)
    if not p.exists():
        return
    skipped: list[str] = []
    with open(p, "rb") as f:  # bytes: a torn line may end inside a UTF-8 character
        for n, raw in enumerate(f, 1):
            if n == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark (Windows tools)
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                skipped.append(f"line {n}: not UTF-8 (torn?)")
                continue
            except json.JSONDecodeError:
                skipped.append(f"line {n}: not JSON (torn?)")
                continue
            except RecursionError:
                skipped.append(f"line {n}: JSON nested too deeply")
                continue
            why = _why_not_a_record(rec, required)
            if why is not None:
                skipped.append(f"line {n}: {why}")
                continue
            yield n, rec
    if skipped:
        more = f" (and {len(skipped) - 3} more)" if len(skipped) > 3 else ""
        warnings.warn(f"{p}: skipped {len(skipped)} line(s) that are not records: "
                      f"{'; '.join(skipped[:3])}{more}", RuntimeWarning, stacklevel=3)


def dedupe(numbered: Iterable[tuple[int, dict]]) -> dict[tuple, tuple[int, dict]]:
    """Key → (line, record): a successful record wins over a failed one, the earlier over the later."""
    out: dict[tuple, tuple[int, dict]] = {}
    for n, rec in numbered:
        k = key(rec)
        if k not in out or (out[k][1].get("failed") and not rec.get("failed")):
            out[k] = (n, rec)
    return out


def load(path: str | Path) -> dict[tuple, dict]:
    """Key → record (``read`` + ``dedupe``); successful records win over failed ones, earlier over
    later. A line that is not a record is skipped with one warning per file (see ``read``), so a
    resume never stops on it: its chunk is simply redone.
    """
    return {k: rec for k, (_, rec) in dedupe(read(path)).items()}


# ---- the checked reader the analyses use: records as (evaluated, calibration) DataFrames

SYSTEMS = ("B1", "B2", "B3", "CRAG", "SelfRAG", "calibration")
REQUIRED = ("dataset", "qid", "seed", "system", "M", "R", "A", "hallucinated", "failed")


class RecordsError(ValueError):
    """A records file the analyses cannot use; the message names the file and what is missing."""


def hold_run_lock(folder: Path, make_folder=None):
    """The run folder's lock (``folder/.lock``, an exclusive flock: ``mdl_jax._io.lock_file``) taken, with
    this process's pid written into it: (the open file, held until it is closed or the process ends,
    however it ends; ""), or (None, the holder's pid as the lock file says it) where another process
    holds it. ``reproduce`` and ``score-gates`` both take it: two writers would append the same rows.
    ``make_folder``: as ``lock_file`` takes it."""
    from mdl_jax._fs import SmallFileError, read_small
    from mdl_jax._io import lock_file

    f = lock_file(folder / ".lock", make_folder)  # never through a symlink planted at the name
    if f is None:
        try:
            holder = read_small(folder / ".lock", 256, follow_links=False).decode(errors="replace").strip()
        except (OSError, SmallFileError):
            holder = ""
        return None, holder or "another process"
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    return f, ""


RUN_JSON_LIMIT = 64 << 20  # a run.json holds a summary and question ids: megabytes at most


def read_run_json(path) -> dict:
    """A run's ``run.json`` as a dict: {} where there is none, else the parsed object, whose
    ``datasets`` and ``config`` (where present) are objects too.

    Every reader of a run's ``run.json`` (``analyze``'s configs and primary family, ``score-gates``,
    the latency stages) reads it here, so a file that is damaged or edited by hand is one error
    naming it, never a traceback and never silently taken as absent.

    Raises:
      RecordsError: ``path`` exists but is not a readable regular file, not UTF-8 JSON, not an
        object, or its ``datasets`` or ``config`` is not an object.
    """
    from mdl_jax._fs import SmallFileError, read_small

    p = Path(path)
    if not os.path.lexists(p):
        return {}
    try:
        raw = read_small(p, RUN_JSON_LIMIT)
    except SmallFileError as e:
        why = {"unreadable": e.reason, "not regular": "not a regular file",
               "too large": f"larger than {RUN_JSON_LIMIT} bytes"}.get(e.kind, e.kind)
        raise RecordsError(f"{p}: cannot read the run's summary ({why})") from None
    try:
        run = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise RecordsError(f"{p}: not UTF-8; expected the run's summary as a JSON object") from None
    except (json.JSONDecodeError, RecursionError) as e:
        raise RecordsError(f"{p}: not JSON ({e}); expected the run's summary as a JSON object") from None
    if not isinstance(run, dict):
        raise RecordsError(f"{p}: a JSON {type(run).__name__}, expected the run's summary as a JSON object")
    for k in ("datasets", "config"):
        if run.get(k) is not None and not isinstance(run[k], dict):
            raise RecordsError(f"{p}: {k} = {_shown(run[k])[:80]} (expected an object)")
    return run


def _shown(v) -> str:
    """A value as the records file spells it (``1.5``, ``NaN``, ``"abc"``), not as NumPy prints it."""
    try:
        return json.dumps(v)
    except (TypeError, ValueError):  # pragma: no cover - parsed JSON always dumps
        return repr(v)


def _bad_field(r: dict) -> str | None:
    """What is wrong with one record's field types and ranges (None when nothing): the analyses fit,
    sort and decide on these fields, so a wrong type must be named here, not deep in NumPy."""
    for f in ("dataset",):
        if not isinstance(r[f], str):
            return f"{f} = {_shown(r[f])} (expected a string)"
    for f in ("qid", "seed"):
        if isinstance(r[f], bool) or not isinstance(r[f], int) or r[f] < 0:
            return f"{f} = {_shown(r[f])} (expected an integer ≥ 0)"
    for f in ("M", "R", "A"):
        v = r[f]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            return f"{f} = {_shown(v)} (expected a number in [0, 1])"  # NaN fails the range test
    if not isinstance(r["failed"], bool):
        return f"failed = {_shown(r['failed'])} (expected true or false)"
    for f in ("hallucinated", "hallucinated_ref"):
        if f in r and r[f] is not None and not isinstance(r[f], bool):
            return f"{f} = {_shown(r[f])} (expected true, false or null)"
    if r["hallucinated"] is None and not r["failed"]:
        return "hallucinated = null in a record that did not fail (expected true or false)"
    return None


def load_records(path) -> tuple[pandas.DataFrame, pandas.DataFrame]:
    """Read and check a records file → (evaluated records, calibration records) as DataFrames.

    Deduplicates per (dataset, qid, seed, system) as ``pipeline.records.load`` does (a successful record
    wins over a failed one, the earlier over the later). Adds ``ok`` (not failed), ``h`` (hallucinated as
    0/1) and ``action_name`` (B3: the recorded action; others: None).

    Reads through ``pipeline.records.read`` (the one reader: torn, non-JSON and non-record lines are
    skipped with one warning per file).

    Raises:
      RecordsError: the file is missing or empty; a record lacks a required field (the first line and
        the missing fields are named); a field has the wrong type or range (the line, the field and
        its value as written: ``line 5: M = 1.5 (expected a number in [0, 1])``); a system is unknown; there are no successful B3 records; a B3
        record has no action.
    """
    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise RecordsError(f"{p}: not a regular file (a folder, a FIFO); expected a records file" if p.exists()
                           else f"{p}: no such records file")
    recs: dict[tuple, dict] = {}
    # The one reader (pipeline.records.read): torn lines, non-JSON and JSON non-records are skipped
    # with one warning per file, exactly as a resumed reproduce skips them.
    for k, (i, r) in dedupe(read(p)).items():
        missing = [f for f in REQUIRED if f not in r]
        if missing:
            raise RecordsError(f"{p}, line {i}: record lacks field(s) {', '.join(missing)} "
                               f"(required: {', '.join(REQUIRED)})")
        if r["system"] not in SYSTEMS:
            raise RecordsError(f"{p}, line {i}: unknown system {r['system']!r} "
                               f"(known: {', '.join(SYSTEMS)})")
        why = _bad_field(r)
        if why:
            raise RecordsError(f"{p}, line {i}: {why}")
        recs[k] = r
    if not recs:
        raise RecordsError(f"{p}: no records")
    df = pd.DataFrame(list(recs.values()))
    df["ok"] = ~df["failed"].astype(bool)
    df["h"] = df["hallucinated"].fillna(False).astype(float)
    if "action" not in df:
        df["action"] = None
    b3 = (df["system"] == "B3") & df["ok"]
    if not b3.any():
        raise RecordsError(f"{p}: no successful B3 (MDL) records; the RQ2-RQ4 analyses need them")
    from mdl_jax import Action

    bad = b3 & ~df["action"].isin([a.name for a in Action])
    if bad.any():
        row = df[bad].iloc[0]
        raise RecordsError(f"{p}: B3 record (dataset={row['dataset']}, qid={row['qid']}, "
                           f"seed={row['seed']}) has no valid action (got {row['action']!r})")
    import numpy as np

    df["action_name"] = np.where(df["system"] == "B3", df["action"], None)
    cal = df[df["system"] == "calibration"].reset_index(drop=True)
    ev = df[df["system"] != "calibration"].reset_index(drop=True)
    return ev, cal
