"""What a benchmark run's results are made from, recorded in its folder, and the check a rerun passes.

``run_benchmarks`` (``run.py``) records ``run_inputs`` in ``OUT/inputs.json`` before any work; a rerun
into the same folder reads it back (``recorded_inputs``) and is refused by ``check_inputs``, naming
each change, where an input differs: one report never mixes two runs' settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mdl_jax._fs import SmallFileError, read_small
from mdl_jax.controller.config_file import config_to_dict

INPUTS = "inputs.json"
LOCK = ".lock"  # held (``_io.lock_file``) by the run writing the folder
_REPORTS = ("REPORT.md", "metrics.csv", "conditions.csv")  # what a run writes beside run.json
_RECORD_BYTES = 1 << 20  # an inputs.json or run.json: a few hundred bytes a data set


class OtherInputs(ValueError):
    """A rerun into a run folder whose results were made from other inputs, or whose record of them
    cannot be read; the message names what changed and how to start over."""


class RunInUse(RuntimeError):
    """A run into a folder another live run is writing (it holds the folder's ``.lock``)."""


def _plain(v: Any) -> Any:
    """``v`` as JSON-able values: an item's fields, its read-only ``meta``, NumPy's scalars and arrays."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (np.ndarray, np.generic)):
        return v.tolist()
    return v


def _digest(v: Any) -> str:
    text = json.dumps(_plain(v), sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _config_record(config) -> Any:
    """The config as its fields (so a change names them), or its repr where it is not one config."""
    try:
        return config_to_dict(config)
    except (TypeError, ValueError):
        return repr(config)


def run_inputs(gate, limit: int | None, n_boot: int, fit_mdl: bool, loaded: Mapping[str, Sequence],
               user_cols: Mapping[str, Mapping[str, np.ndarray]]) -> dict:
    """What a run's results are made from (``inputs.json``): the limit, the embedder (its cache id,
    which names the model, its content where it is a local folder, and the backend; None for one that
    cannot be named, a callable), the config and relevance threshold, the resamples, whether MDL is
    fitted, and per data set a digest of its items and of a user's gate scores for them."""
    emb = gate.embedder
    return {
        "limit": limit, "n_boot": n_boot, "fit_mdl": fit_mdl,
        "embedder": getattr(emb, "model_id", None) if getattr(emb, "backend_id", None) is not None else None,
        "relevance_threshold": gate.relevance_threshold, "config": _config_record(gate.config),
        "data": {name: _digest(items) for name, items in loaded.items()},
        "gate_scores": {name: _digest(cols) for name, cols in user_cols.items()},
    }


def _read_record(path: Path) -> Any:
    try:
        return json.loads(read_small(path, _RECORD_BYTES, follow_links=False))
    except (SmallFileError, ValueError):
        return None


def _start_over(out: Path) -> str:
    return f"run into a fresh --out, or remove {str(out)!r} to start over"


def recorded_inputs(out: Path, gate, known: Collection[str]) -> dict | None:
    """The inputs the run in ``out`` was made from, as ``run_inputs`` words them (only what is known),
    or None where ``out`` holds no results (a fresh run, whatever it recorded).

    A run of an earlier version, with results but no inputs.json, is read from its run.json: its data
    sets (their digests unknown: None, not compared), limit, resamples, fitting and config.

    Raises:
      OtherInputs: ``out`` holds results and an inputs.json (or, with none, a run.json) that is not a
        readable record, or one naming a data set not in ``known`` (this version's); or a REPORT.md,
        metrics.csv or conditions.csv with neither record (files a run did not write).
    """
    signals = out / "signals"
    reports = [f for f in _REPORTS if os.path.lexists(out / f)]
    has_results = os.path.lexists(out / "run.json") or bool(reports) or (
        signals.is_dir() and not signals.is_symlink() and any(signals.glob("*.npz")))
    if not has_results:
        return None
    path = out / INPUTS
    if os.path.lexists(path):
        before = _read_record(path)
        if not isinstance(before, dict) or not isinstance(before.get("data"), dict):
            raise OtherInputs(f"out: {str(out)!r} holds a benchmark run whose {INPUTS} is not a readable record of "
                              f"its inputs, so a rerun cannot be checked against them; {_start_over(out)}")
    elif os.path.lexists(out / "run.json"):
        meta = _read_record(out / "run.json")
        names = meta.get("names") if isinstance(meta, dict) else None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise OtherInputs(f"out: {str(out)!r} holds no {INPUTS} and a run.json that is no benchmark run's "
                              f"record, so a rerun cannot be checked against it; {_start_over(out)}")
        before = {k: meta[k] for k in ("limit", "n_boot", "fit_mdl") if k in meta}
        if "config" in meta:  # recorded as its repr
            before["config"] = _config_record(gate.config) if meta["config"] == repr(gate.config) else meta["config"]
        before["data"] = {n: None for n in names}  # digests unknown: not compared
    elif reports:
        # a run records inputs.json before any work (one of an earlier version, run.json with its
        # report): these names with neither record are the user's own files (or an earlier version's
        # run cut off before run.json), which the run would overwrite
        raise OtherInputs(f"out: {str(out)!r} holds {', '.join(reports)} but no record of a benchmark run "
                          f"({INPUTS} or run.json), so a run would overwrite files it did not write; run into "
                          "a fresh --out, or remove them")
    else:
        return None  # signals only: an earlier version's run stopped before its report; they check themselves
    unknown = [n for n in before["data"] if n not in known]
    if unknown:
        raise OtherInputs(f"out: {str(out)!r} holds a benchmark run of data sets this version does not know "
                          f"({', '.join(map(str, unknown))}); {_start_over(out)}")
    return before


def _config_changes(before, now) -> list[str]:
    if not (isinstance(before, dict) and isinstance(now, dict)):
        return ["config"]
    said = []
    for part in ("numeric", "static"):
        a, b = before.get(part), now.get(part)
        if not (isinstance(a, dict) and isinstance(b, dict)):
            continue
        said += [f"config {f} ({a[f]!r} then, {b[f]!r} now)" for f in sorted(set(a) & set(b)) if a[f] != b[f]]
    return said or ["config"]


def check_inputs(out: Path, before: Mapping | None, now: Mapping) -> None:
    """Refuse (``OtherInputs``) a rerun whose inputs differ from those the run in ``out`` was made from,
    naming each change. Only what both records name is compared (a version that records more still
    resumes a run of one that recorded less); a data set is compared only where both name it, so a data
    set new to the run is no change, and its items only under the same limit (another reads others)."""
    if before is None:
        return
    changed: list[str] = []
    for k in sorted(set(before) & set(now) - {"data", "gate_scores"}):
        if before[k] == now[k]:
            continue
        changed += _config_changes(before[k], now[k]) if k == "config" else [
            f"{k} ({before[k]!r} then, {now[k]!r} now)"]
    for key, what in (("data", "the {} data"), ("gate_scores", "the gate scores of {}")):
        if key == "data" and "limit" in before and before["limit"] != now.get("limit"):
            continue  # another limit reads other items: named once, as the limit
        old, new = before.get(key), now.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            changed += [what.format(n) for n in old if n in new and old[n] is not None and old[n] != new[n]]
    if changed:
        raise OtherInputs(f"out: {str(out)!r} holds a benchmark run made from other inputs: {'; '.join(changed)} "
                          f"changed; {_start_over(out)}")

