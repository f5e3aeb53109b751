"""One run of MDL on the field's benchmarks: signals, every gate, tables, risk–coverage plots, REPORT.md.

``run_benchmarks`` is what ``mdl-jax benchmarks`` calls. A run folder holds:

  inputs.json                 what the run's results are made from, recorded before any work: the
                              limit, the embedder, the config and relevance threshold, the resamples,
                              whether MDL is fitted, and per data set a digest of its items (and of a
                              user's gate scores for them)
  run.json                    what the run was: data sets, limits, the embedder, the config, versions
  signals/<data set>.npz      each data set's signal columns, with the digest of what they depend on
                              (the items, the embedder, the config and the code that computes them): a
                              rerun reuses a file whose digest matches and recomputes one that does not
  metrics.csv                 every (data set, gate, metric) with its interval, n and questions
  conditions.csv              per memory-set condition: labels, mean signals, MDL's actions
  figures/<data set>.png      risk–coverage curves (adopting the k most confident memory sets)
  REPORT.md                   the tables, per data set, and what the data can and cannot resolve

A rerun into the same folder continues that run: it is refused (``OtherInputs``, naming what changed)
when an input in inputs.json differs (``run_record``), so one report never mixes two runs' settings.
With the same inputs it resumes: each data set's signals are reused, and every data set the run holds,
those named before and those named now, is scored again and reported, so naming a data set new to the
run adds it and naming fewer keeps the others. A folder with results but no inputs.json (an earlier version's run)
is checked against its run.json (the limit, the config, the resamples, fitting) and its data sets kept.
One run at a time writes a folder: a run holds ``.lock`` in it (an ``flock``, let go however the run
ends), and a second run into the folder meanwhile is refused (``RunInUse``). A run refused before any
work (a bad argument, a missing data set, other inputs) leaves a folder it made itself as it was: absent,
with any parent folder it made for it.

Each file goes through the project's one writer (``mdl_jax._io``): a fresh temporary name beside it,
renamed, so a reader sees a whole file or the previous one.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import math
import os
import re
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from mdl_jax._io import OutputError, lock_file
from mdl_jax._io import write_bytes as _write
from mdl_jax._version import __version__
from mdl_jax.controller.validation import zero_d_number
from mdl_jax.evaluation import metrics
from mdl_jax.evaluation.datasets import BENCHMARKS, load_benchmark
from mdl_jax.evaluation.datasets.adarague import ADARAGUE_DATASETS, AdaRAGUEItem
from mdl_jax.evaluation.replay import replay, replay_table
from mdl_jax.evaluation.run_record import INPUTS, LOCK, check_inputs, recorded_inputs, run_inputs
from mdl_jax.evaluation.run_record import OtherInputs as OtherInputs  # what a refused rerun raises
from mdl_jax.evaluation.run_record import RunInUse as RunInUse  # what a run into a folder in use raises
from mdl_jax.evaluation.scoring import (
    GATE_NAMES,
    REFERENCE,
    Scored,
    condition_table,
    metric_table,
    score_gates,
    signal_columns,
)

# Reader-free scoring: every shared data set whose memory sets carry their own labels.
READER_FREE = ("rgb_en_fact", "rgb_en_fact_equal", "ramdocs", "conflictqa_strategyqa", "conflictnq", "poisonedrag_adv",
               "nomiracl_en", "retrievalqa_gpt4", "selfaware")
# The replay of AdaRAGUE's reader answers: every data set's test split (MDL only where passages exist).
REPLAY = tuple(f"adarague:{d}_test" for d in ADARAGUE_DATASETS)
ALL = READER_FREE + REPLAY


SIGNAL_KEYS = ("M", "R", "phi", "C_final", "action", "M_either", "R_either", "phi_either", "C_final_either",
               "action_either")
# The code that turns texts into signals and decisions besides the embedder and the config: a change to
# a detector or to the controller within one version must not reuse columns computed by the old one.
_SIGNAL_SOURCES = ("signals/conflict.py", "signals/answer_conflict.py", "signals/aggregation.py",
                   "signals/jax_pass.py", "signals/_native/dots.cc", "signals/_native/conflict.cc",
                   "evaluation/scoring.py", "controller/decision.py", "controller/api.py", "gate/core.py",
                   "engines/_native/decide_cpu.cc")


def _cache_key(items, gate) -> str | None:
    """The digest the cached signals of ``items`` must carry, or None where the gate's embedder cannot be
    named across processes (a callable or an object of the caller's): then nothing is cached or reused."""
    emb = gate.embedder
    backend = getattr(emb, "backend_id", None)
    if backend is None:
        return None
    h = hashlib.sha256()
    pkg = Path(__file__).resolve().parents[1]
    for rel in _SIGNAL_SOURCES:
        h.update((pkg / rel).read_bytes())
    # the embedder's cache id: a local folder's carries its content hash (a fine-tune in place is new)
    h.update(f"{__version__}\0{getattr(emb, 'model_id', '')}\0{backend}\0{gate.config!r}\0"
             f"{gate.relevance_threshold!r}\0".encode())
    for it in items:
        h.update(json.dumps([it.qid, it.question, list(it.memories)], ensure_ascii=False).encode())
    return h.hexdigest()


def _own_dir(path: Path) -> Path:
    """A folder of the run's own, created if missing; never a symbolic link (written through, a link
    would put our files where it points)."""
    if path.is_symlink():
        raise OutputError(path, message=f"{path} is a symbolic link; refusing to write the run's files through it")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _cached(path: Path, key: str, n: int) -> dict[str, np.ndarray] | None:
    """The signals stored at ``path`` if they carry ``key`` and one value per item, else None (recompute).
    A damaged, truncated or foreign file is recomputed, never trusted and never an error: it is a cache."""
    if path.is_symlink() or not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["digest"]) != key:
                return None
            cols = {k: np.asarray(z[k]) for k in SIGNAL_KEYS}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    return cols if all(c.shape == (n,) for c in cols.values()) else None


def _signals(name: str, items, gate, out: Path, progress: bool) -> dict[str, np.ndarray]:
    path = _own_dir(out / "signals") / f"{name.replace(':', '__')}.npz"
    key = _cache_key(items, gate)
    cols = None if key is None else _cached(path, key, len(items))
    if cols is not None:
        return cols
    cols = signal_columns(items, gate, progress=progress)
    if key is not None:
        buf = io.BytesIO()
        arrays: dict[str, Any] = {"digest": np.array(key), **{k: cols[k] for k in SIGNAL_KEYS}}
        np.savez(buf, **arrays)
        _write(path, buf.getvalue())
    return cols


def _csv(rows: Sequence[Mapping], path: Path) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))   # every row's columns, in order of appearance
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    _write(path, buf.getvalue().encode())


def _figure(s: Scored, path: Path, user: Sequence[str]) -> bool:
    """Draw the data set's risk–coverage curves at ``path``; False (and no file: a figure of an earlier
    run there is removed) where fewer than 2 evaluated rows carry a label."""
    ev = ~s.calibration & ~np.isnan(s.dont_adopt)
    if ev.sum() < 2:
        path.unlink(missing_ok=True)
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = s.dont_adopt[ev]
    fig, ax = plt.subplots(figsize=(5.2, 3.6), dpi=110)
    for g in s.gates:
        if g.name in ("always adopt", "never adopt", "oracle") or (
                g.name not in ("similarity (top-1)", "R alone", REFERENCE, "MDL + answer detector") + tuple(user)):
            continue
        cov, risk = metrics.risk_coverage(h, -g.score[ev])[:2]  # a confidence: higher first
        ax.plot(cov, risk, label=g.name, lw=1.4)
    ax.axhline(float(np.mean(h)), color="grey", ls=":", lw=1, label="adopt all")
    ax.set_xlabel("coverage (share of memory sets adopted, most confident first)")
    ax.set_ylabel("risk (share that should not be)")
    ax.set_title(f"{s.dataset}: risk–coverage (n = {int(ev.sum())})", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    _write(path, buf.getvalue())
    return True


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.3f}"


def _ci(r: Mapping) -> str:
    if r["lo"] is None or math.isnan(r["lo"]):
        return _fmt(r["value"])
    return f"{r['value']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]"


MIN_GROUPS_DIRECTION = 10  # questions: below it a bootstrap cannot estimate a difference's variance


def _resolved(r: Mapping) -> str:
    if math.isnan(r["lo"]):
        return "not resolved"
    if int(r["n_groups"]) < MIN_GROUPS_DIRECTION:
        return f"too few questions to tell (< {MIN_GROUPS_DIRECTION})"
    if r["lo"] > 0:
        return "higher"
    if r["hi"] < 0:
        return "lower"
    return "not resolved"


def _table(rows: Sequence[Mapping], metric_names: Sequence[str]) -> list[str]:
    gates = list(dict.fromkeys(r["gate"] for r in rows))
    by = {(r["gate"], r["metric"]): r for r in rows}
    out = ["| gate | " + " | ".join(metric_names) + " |", "|---|" + "---|" * len(metric_names)]
    for g in gates:
        cells = []
        for m in metric_names:
            r = by.get((g, m))
            if r is None:
                cells.append("—")
            elif "mde" in r:
                cells.append(f"{_ci(r)} ({_resolved(r)}; MDE {r['mde']:.3f})")
            else:
                cells.append(_ci(r))
        out.append(f"| {g} | " + " | ".join(cells) + " |")
    return out


SUMMARY_FREE = ("always adopt", "similarity (top-1)", "R alone", "MDL (paper defaults)", "MDL + answer detector",
                "MDL calibrated", "MDL tuned", "oracle")
SUMMARY_REPLAY = ("never retrieve", "always retrieve", "IRCoT", "Adaptive-RAG classifier", "When-to-Retrieve flag",
                  "similarity (top-1)", "MDL (paper defaults)", "MDL (paper defaults), never abstain",
                  "MDL calibrated, never abstain", "oracle")


def summary_markdown(rows: Sequence[Mapping]) -> str:
    """The run's summary tables, from its metrics rows (``metrics.csv``): per reader-free data set the
    decision accuracy and AUROC of the main gates and of the user's own (``extra``, before the oracle),
    per AdaRAGUE data set the In-Accuracy of each gate.
    The docs page embeds this text; a test rebuilds it from the committed run's metrics.csv."""
    by = {(r["dataset"], r["gate"], r["metric"]): r for r in rows}
    sets = list(dict.fromkeys(r["dataset"] for r in rows))
    free = [d for d in sets if (d, "MDL (paper defaults)", "decision accuracy") in by]
    # a user's gate is what a reader adds a run for: it stands beside MDL here, not only in the data set's section
    users = [g for g in dict.fromkeys(r["gate"] for r in rows if r["dataset"] in free) if g not in GATE_NAMES]
    free_gates = (*SUMMARY_FREE[:-1], *users, SUMMARY_FREE[-1])
    rep = [d for d in sets if (d, "never retrieve", "In-Accuracy") in by]

    def cell(key) -> str:
        r = by.get(key)
        return "—" if r is None or _num(r["value"]) is None else _ci({k: _num(r[k]) for k in ("value", "lo", "hi")})

    def table(title: str, gates: Sequence[str], data_sets: list, n_of: tuple, text: Callable) -> list[str]:
        # one row a data set, its n from the (gate, metric) ``n_of``, one cell a gate
        return [title, "", "| data set | n | " + " | ".join(gates) + " |", "|---|---|" + "---|" * len(gates),
                *(f"| {d} | {by[(d, *n_of)]['n']} | " + " | ".join(text(d, g) for g in gates) + " |"
                  for d in data_sets), ""]

    L: list[str] = []
    for metric in ("decision accuracy", "AUROC"):
        L += table(f"**{metric}** (evaluated memory sets; 95% question-bootstrap intervals)", free_gates, free,
                   ("MDL (paper defaults)", "decision accuracy"), lambda d, g, metric=metric: cell((d, g, metric)))
    ab = [d for d in sets if (d, "MDL (paper defaults)", "abstention F1") in by]
    if ab:
        L += table("**Abstention** (MDL's Opt-Out against \"should abstain\": F1 / over-refusal)",
                   ("MDL (paper defaults)", "MDL calibrated", "MDL tuned"), ab, ("MDL (paper defaults)", "abstention F1"),
                   lambda d, g: f"{cell((d, g, 'abstention F1'))} / {cell((d, g, 'over-refusal'))}")
    if rep:
        L += table("**In-Accuracy** (AdaRAGUE's protocol, Llama-3.1-8B-Instruct's answers; MDL only where passages "
                   "exist)", SUMMARY_REPLAY, rep, ("never retrieve", "In-Accuracy"),
                   lambda d, g: cell((d, g, "In-Accuracy")))
    return "\n".join(L)


def _num(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def _report(free: dict[str, tuple[list, list, bool]], rep: dict[str, list], meta: Mapping, rows: Sequence[Mapping]) -> str:
    L = ["# MDL on the field's benchmarks", ""]
    L += [
        f"MDL (mdl-jax {meta['version']}, the paper's zero-parameter defaults unless a row says otherwise) and the "
        "gates it is compared with, on the same rows of each data set. Reader-free: each memory set's label says "
        "whether it should be adopted (and, where the data set says, whether the system should abstain); the "
        "replay scores AdaRAGUE's adaptive-retrieval protocol with Llama-3.1-8B-Instruct's recorded answers. "
        "Every interval is a 95% question-bootstrap interval; a difference is called higher or lower only when "
        "its interval excludes 0. Thresholds and fitted configs are fitted on questions the metrics do not see.",
        "",
        f"Embedder: {meta['embedder']}. Task risk A = 0.5 everywhere. Data: {meta['data']}.",
        "",
        "## Summary",
        "",
        summary_markdown(rows),
    ]
    if free:
        L += ["## Reader-free: should the memories be adopted?", "",
              "`decision accuracy` counts a memory set as right when the gate adopts it (MDL: Active) exactly where "
              "its label says it should; `withheld` is the share not adopted; AUROC and AUPRC rank the sets by "
              "the gate's score against \"do not adopt\" (— where the evaluated rows hold one label only); the "
              "last column is the paired difference in decision accuracy from MDL with the paper's defaults. "
              "A fitted gate (a τ, a calibrated or tuned config) has no decision (—) where its calibration "
              "rows were fewer than 5 or held one label: there was nothing to fit.", ""]
        for name, (rows, conds, drawn) in free.items():
            n = rows[0]["n"] if rows else 0
            ng = rows[0]["n_groups"] if rows else 0
            L += [f"### {name} (evaluated: {n} memory sets, {ng} questions)", ""]
            if any(r["metric"] == "decision accuracy" for r in rows):
                L += _table([r for r in rows if not r["metric"].startswith(("abstention", "over-refusal"))],
                            ["decision accuracy", "withheld", "AUROC", "AUPRC", "accuracy − MDL (paper defaults)"])
            else:
                L.append("No memory set here holds memories to adopt: only abstention is scored.")
            ab = [r for r in rows if r["metric"].startswith(("abstention", "over-refusal"))]
            if ab:
                L += ["", "Abstention (MDL's Opt-Out against the data set's \"should abstain\"):", ""]
                L += _table(ab, ["abstention precision", "abstention recall", "abstention F1", "over-refusal"])
            if conds:
                L += ["", "By memory-set condition (evaluated rows; means):", "",
                      "| condition | n | do not adopt | M | R | R (either) | φ>0 | φ>0 (either) | C_final | "
                      "C_final (either) | Active | Active (either) | Opt-Out |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
                for c in conds:
                    L.append("| " + " | ".join([c["condition"], str(c["n"])] + [
                        _fmt(c[k]) for k in ("do not adopt", "M", "R", "R (either)", "phi>0", "phi>0 (either)",
                                             "C_final", "C_final (either)", "Active", "Active (either)",
                                             "Opt-Out")]) + " |")
            L += ["", f"![risk–coverage](figures/{name}.png)" if drawn else
                  "*No risk–coverage figure: fewer than 2 evaluated memory sets carry a label.*", ""]
    if rep:
        L += ["## AdaRAGUE's protocol with Llama-3.1-8B-Instruct's answers", "",
              "Active and Supp take the with-retrieval answer (the one recorded with these passages), Silent the "
              "no-retrieval answer, Opt-Out abstains (wrong for In-Accuracy). ROC-AUC ranks the gate's "
              "\"retrieve\" score against AdaRAGUE's oracle (the no-retrieval answer is wrong). MDL rows appear "
              "only where the retrieved passages exist (HotpotQA and 2Wiki test).", ""]
        for name, rows in rep.items():
            n = rows[0]["n"] if rows else 0
            L += [f"### {name} ({n} questions)", ""]
            L += _table(rows, ["In-Accuracy", "coverage", "selective accuracy", "retrieval calls",
                               "ROC-AUC (oracle: no-retrieval answer wrong)", "In-Accuracy − always retrieve",
                               "In-Accuracy − MDL (paper defaults)"])
            L.append("")
    return "\n".join(L) + "\n"


MAX_LIMIT = 10**9  # questions per data set: more than any benchmark holds
MAX_BOOT = 100_000  # resamples per interval: beyond it the run is minutes per table for no visible change
GATE_NAME = re.compile(r"[^|\n\r`]{1,80}")  # a user's gate name: one table cell


def _check(names, limit, n_boot, extra) -> list[str]:
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise TypeError(f"names: expected a sequence of data set names, got {type(names).__name__}")
    names = list(names)
    unknown = [n for n in names if n not in ALL]
    if unknown:
        raise ValueError(f"names: unknown data set(s) {unknown}; expected some of {list(ALL)}")
    if len(set(names)) != len(names):
        raise ValueError(f"names: a data set named twice in {names}")
    if not names:
        raise ValueError("names: expected at least one data set")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT):
        raise ValueError(f"limit: expected a number of questions in [1, {MAX_LIMIT:,}], got {limit!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or not 1 <= n_boot <= MAX_BOOT:
        raise ValueError(f"n_boot: expected a number of resamples in [1, {MAX_BOOT:,}], got {n_boot!r}")
    for g in extra or {}:
        # (a table cell drops the spaces around a name: ' oracle' would stand as a second oracle there)
        if not isinstance(g, str) or not GATE_NAME.fullmatch(g) or g.strip() in GATE_NAMES:
            raise ValueError(f"extra: {g!r} cannot name a gate: expected 1-80 characters without '|', '`' or a "
                             f"line break, and none of the built-in gates' names ({', '.join(GATE_NAMES)})")
    if extra and not any(n in READER_FREE for n in names):
        raise ValueError("extra: a user's gate scores memory sets of the reader-free data sets "
                         f"({', '.join(READER_FREE)}); none is named")
    return names


def run_benchmarks(out: str | os.PathLike, names: Sequence[str] = ALL, *, gate=None, limit: int | None = None,
                   data_dir: str | os.PathLike | None = None, extra: Mapping[str, Mapping[str, float]] | None = None,
                   fit_mdl: bool = True, n_boot: int = 1000, progress: bool = True,
                   log: Callable[[str], None] = print) -> Path:
    """Score MDL and the compared gates on the named benchmarks and write the run folder (module docstring).

    Every data set is loaded (seconds) and every argument checked before the first text is embedded, so
    a missing data set, a user's column that lacks a memory set or a rerun onto other inputs is named at
    once.

    Args:
      out: the run folder (created). A rerun into it continues the run it holds (module docstring): it is
        refused where an input changed; else the signal files are reused and every data set of the run,
        those named before and now, is scored and reported.
      names: data sets from ``ALL``: ``READER_FREE`` names and ``"adarague:<dataset>_test"``, each once
        (added, in a rerun, to those the run holds).
      gate: a ``MemoryGate`` (its embedder and config); the bundled MiniLM with the paper's defaults when None.
        Signals are cached only for an embedder that can be named across processes (``Embedder``); with
        a callable they are recomputed on every run.
      limit: the number of questions per data set (a smoke test), in [1, ``MAX_LIMIT``]; None for all.
      data_dir: the benchmarks folder (default: the shared copy, as ``load_benchmark`` finds it).
      extra: {gate name: {qid: score}}, a user's own gate scores (higher = do not adopt), joined on the
        items' qid; only with a reader-free data set named.
      fit_mdl: fit the calibrated, tuned and learned MDL configs too.
      n_boot: bootstrap resamples per interval, in [1, ``MAX_BOOT``].
      progress: progress bars.
      log: where one line per data set goes.

    Returns:
      The path of REPORT.md.

    Raises:
      TypeError: ``names`` is a string or not a sequence; a gate's scores in ``extra`` not a mapping.
      ValueError: an unknown, repeated or empty list of data set names; ``limit`` or ``n_boot`` outside its
        range; a gate name in ``extra`` that is empty, holds '|', '`' or a line break, or is a built-in
        gate's; ``extra`` without a reader-free data set, or lacking a score for one of its memory sets, or
        with one that is no finite number; a
        data set with no items.
      OtherInputs: (a ``ValueError``) ``out`` holds a run made from other inputs (a limit, embedder,
        config, relevance threshold, number of resamples, fitting, a data set's items or its user's gate
        scores), naming each change, or whose record of its inputs cannot be read.
      RunInUse: another live run is writing ``out`` (it holds ``out/.lock``).
      DataError: a data file that cannot be read (naming it).
      OutputError: a folder of the run that is a symbolic link, or a file that cannot be written.
    """
    names = _check(names, limit, n_boot, extra)
    if gate is None:
        from mdl_jax.gate.core import MemoryGate

        gate = MemoryGate(risk=0.5)
    out = Path(out)
    made: list[Path] = []  # the folders this run makes (``out`` and any missing parents), deepest first
    had_lock = False

    def make_folder() -> None:
        # again where a refused run that made it removed it (holding its lock) as this one locked
        nonlocal had_lock
        p = out.absolute()
        made.clear()
        while not os.path.lexists(p) and p != p.parent:
            made.append(p)
            p = p.parent
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(out, e) from None
        had_lock = os.path.lexists(out / LOCK)

    lock = lock_file(out / LOCK, make_folder=make_folder)
    if lock is None:
        raise RunInUse(f"out: another mdl-jax benchmarks run is writing {str(out)!r}; wait for it to finish, "
                       "or run into another --out")
    try:
        before = recorded_inputs(out, gate, ALL)
        if before is not None:  # the run's data sets: those it holds, then those new to it
            names = list(dict.fromkeys([*before["data"], *names]))
        path = None if data_dir is None else Path(data_dir)
        loaded = {}
        for name in names:
            if name.startswith("adarague:"):
                loaded[name] = load_benchmark("adarague_llama8b", split=name.split(":", 1)[1], limit=limit,
                                              path=None if path is None else path / "adarague_llama8b")
            else:
                # the data set's folder, not its name: rgb_en_fact_equal reads rgb_en_fact/
                loaded[name] = load_benchmark(name, limit=limit,
                                              path=None if path is None else path / BENCHMARKS[name].folder)
            if not loaded[name]:
                raise ValueError(f"names: {name} holds no items (read from {path or 'the shared copy'})")
        user_cols: dict[str, dict[str, np.ndarray]] = {}
        for name, items in loaded.items():
            if name not in READER_FREE:
                continue
            user_cols[name] = {}
            for g, scores in (extra or {}).items():
                if not isinstance(scores, Mapping):
                    raise TypeError(f"extra[{g!r}]: expected a mapping {{qid: score}}, got {type(scores).__name__}")
                missing = [it.qid for it in items if it.qid not in scores]
                if missing:
                    raise ValueError(f"extra[{g!r}]: no score for {len(missing)} of {name}'s memory sets, "
                                     f"e.g. qid {missing[0]!r}")
                # checked here, before inputs.json records them: found after the embedding, a bad score
                # left a run folder whose record then refused the corrected scores
                values = []
                for it in items:
                    v: Any = zero_d_number(scores[it.qid])   # a 0-d NumPy or JAX number: its value
                    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
                            or not math.isfinite(v):
                        raise ValueError(f"extra[{g!r}][{it.qid!r}]: expected a finite number, got {v!r}")
                    values.append(v)
                user_cols[name][g] = np.array(values, float)
        now = run_inputs(gate, limit, n_boot, fit_mdl, loaded, user_cols)
        check_inputs(out, before, now)
        if before is not None:
            if None in before["data"].values():
                import warnings

                warnings.warn(f"out: {out} holds a benchmark run of an earlier version, with no record of its data's "
                              f"digests: its data sets are taken as this run's, which {INPUTS} records from now on",
                              RuntimeWarning, stacklevel=2)
            added = [n for n in names if n not in before["data"]]
            log(f"{out}: resuming its run of {', '.join(before['data'])}"
                + (f", adding {', '.join(added)}" if added else ""))
        out.mkdir(parents=True, exist_ok=True)
        _write(out / INPUTS, (json.dumps(now, indent=1, ensure_ascii=False) + "\n").encode())
        emb = getattr(gate.embedder, "backend_id", None) or type(gate.embedder).__name__
        embedder_id = f"{getattr(gate.embedder, 'model_name', '')} {emb}".strip()
        free: dict[str, tuple[list, list, bool]] = {}
        rep: dict[str, list] = {}
        all_rows: list[dict] = []
        all_conds: list[dict] = []
        for name, items in loaded.items():
            if name.startswith("adarague:"):
                split = name.split(":", 1)[1]
                with_passages = all(it.memories for it in items)
                cols = _signals(name, items, gate, out, progress) if with_passages else None
                rows = replay_table(replay(split, cast("list[AdaRAGUEItem]", items), cols, config=gate.config), n_boot=n_boot)
                rep[split] = rows
            else:
                cols = _signals(name, items, gate, out, progress)
                user = user_cols[name]
                # the split is the folder's: two readings of one data set evaluate the same questions
                s = score_gates(name, items, cols, config=gate.config, extra=user, fit_mdl=fit_mdl,
                                split_salt=BENCHMARKS[name].folder)
                rows = metric_table(s, n_boot=n_boot)
                conds = condition_table(s)
                drawn = _figure(s, _own_dir(out / "figures") / f"{name}.png", tuple(user))
                free[name] = (rows, conds, drawn)
                all_conds += conds
            all_rows += rows
            log(f"{name}: {len(items)} memory sets scored")
        _csv(all_rows, out / "metrics.csv")
        _csv(all_conds, out / "conditions.csv")
        meta = {"version": __version__, "names": names, "limit": limit, "embedder": embedder_id,
                "config": repr(gate.config), "n_boot": n_boot, "fit_mdl": fit_mdl, "extra": sorted(extra or {}),
                "data": "the shared copy (../shared/data/benchmarks)" if path is None else str(path)}
        _write(out / "run.json", (json.dumps(meta, indent=1) + "\n").encode())
        report = out / "REPORT.md"
        _write(report, _report(free, rep, meta, all_rows).encode())
        return report
    except BaseException:
        # refused before any work: leave no folder behind, nor a lock in the user's own folder (one
        # whose REPORT.md this run refused to overwrite)
        if (made or not had_lock) and not os.path.lexists(out / INPUTS):
            with contextlib.suppress(OSError):
                os.unlink(out / LOCK)
                for d in made:
                    os.rmdir(d)
        raise
    finally:
        lock.close()
