"""``mdl-jax signals`` and ``mdl-jax reproduce``: the experiment pipeline's commands. ``reproduce`` runs
the experiment (``pipeline.experiment``), then composes the analyses and the report on its records:
that composition lives here, at the top, so the pipeline never imports the analyses."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from mdl_jax.cli.args import (
    CommandError,
    DefaultsHelpFormatter,
    config_file,
    existing_dir,
    nonneg_int,
    out_dir,
    out_file,
    positive_float,
    positive_int,
    seed_int,
    user_errors,
)

# The first run embeds every memory text (26,293 of them); the embedding cache makes later runs
# take seconds, so the message tells a user what to expect before the long first wait
# (docs/benchmarks.md gives the measured figure).
SIGNALS_COST = "about 20 minutes on first use here (26,293 texts), seconds once they are cached"


def _common(p: argparse.ArgumentParser) -> None:
    # Help texts that name their own default contain %(default)s, so the formatter adds none.
    p.add_argument("--data-dir", default=None, type=existing_dir,
                   help="folder with TruthfulQA.csv and halueval_qa.jsonl (%(default)s: "
                        "$MDL_JAX_DATA_DIR, else ../shared/data beside the repo, else the hub)")
    p.add_argument("--datasets", nargs="+", default=["truthfulqa", "halueval"],
                   choices=["truthfulqa", "halueval"], help="datasets to run")
    p.add_argument("--model", default="all-MiniLM-L6-v2", type=_model_name,
                   help="sentence-transformers model name or path")
    p.add_argument("--cache-dir", default=None, type=out_dir, help="embedding cache (%(default)s: $MDL_JAX_CACHE_DIR "
                                                     "or ~/.cache/mdl_jax)")
    p.add_argument("--split-seed", type=seed_int, default=0,
                   help="seed of the memory stores' distractors and of the calibration / evaluation split")
    # The old name, ambiguous beside reproduce's --seeds; hidden, warns, kept so old scripts run.
    p.add_argument("--seed", dest="split_seed", type=seed_int, default=argparse.SUPPRESS,
                   action=_DeprecatedSeed, help=argparse.SUPPRESS)


def _model_name(text: str) -> str:
    """A model name or folder: a blank one would name the working folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a model name or a model folder, got {text!r}")
    return text


def _model_error(cmd: str, e: ValueError) -> CommandError:
    """The embedder's refusal of --model (a folder missing its vocabulary, a truncated weight file, a
    name not on the hub) as the command's one line: it surfaces only when the first text is embedded."""
    return CommandError(f"{cmd}: --model: {str(e).removeprefix('embedder: ')}")


class _DeprecatedSeed(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        print("warning: --seed is deprecated; it is the store/split seed, now --split-seed "
              "(generation seeds are reproduce's --seeds)", file=sys.stderr)
        setattr(namespace, self.dest, values)


def register(sub) -> None:
    p = sub.add_parser("signals", help="build memory stores and the M, R, A signals table (Parquet)",
                       description="Build the memory stores and the M, R, A signals table (Parquet). "
                                   "No LLM. A bare run embeds every memory of both datasets with "
                                   f"MiniLM: {SIGNALS_COST}.",
                       formatter_class=DefaultsHelpFormatter)
    _common(p)
    p.add_argument("--limit", type=positive_int, default=None, help="first N questions per dataset (None: all)")
    p.add_argument("--n-calibration", type=nonneg_int, default=80,
                   help="questions per dataset marked as the calibration split")
    p.add_argument("--out", default="out/signals.parquet", type=out_file, help="Parquet file to write")
    p.set_defaults(func=signals_cmd)
    _register_reproduce(sub, _common)


def signals_cmd(args) -> int:
    from mdl_jax.signals.embedding_models import ModelLoadError, resolve_model
    from mdl_repro.pipeline.store_signals import build_signal_table, save_table
    from mdl_repro.pipeline.stores import StoreConfig

    need = StoreConfig().n_distractors + 1  # each store draws its distractors from the other questions
    if args.limit is not None and args.limit < need:
        raise CommandError(f"signals: argument --limit: each memory store draws {need - 1} distractors "
                           f"from the other questions, so expected at least {need} questions, got {args.limit}")
    try:
        resolve_model(args.model)   # a path to no folder: refused now, not after reading the data sets
    except ValueError as e:
        raise _model_error("signals", e) from None
    try:
        table, _, emb = build_signal_table(args.datasets, data_dir=args.data_dir, limit=args.limit,
                                           model=args.model, cache_dir=args.cache_dir, seed=args.split_seed,
                                           n_calibration=args.n_calibration, progress=sys.stderr.isatty())
    except ModelLoadError as e:
        raise _model_error("signals", e) from None
    path = save_table(table, args.out)
    print(f"wrote {len(table)} rows to {path} (embedded {emb.n_embedded} new texts, "
          f"{emb.n_cached} from cache)", file=sys.stderr)
    summary = table.groupby("dataset")[["M", "R", "A", "phi"]].mean().round(3)
    print(summary.to_string())
    return 0


# Told before a bare run starts, so a user knows it is minutes of work, not a hang: the time is the
# bundled model's generation, plus the embedding of the question pools on a fresh cache, and it grows
# with the machine's load (docs/benchmarks.md has the measured runs).
BARE_RUN_COST = ("A bare run (20 questions x 2 datasets, B1/B2/B3 on both, CRAG and Self-RAG on "
                 "TruthfulQA, 1 seed, the shipped config so no calibration answers) takes about "
                 "{minutes}")
BARE_RUN_MINUTES = "2 minutes on an idle 2-core VM, three times that while other jobs share its cores"
MOST_FAILED = 0.5  # above this share of failed records the run exits non-zero


def _register_reproduce(sub, common) -> None:
    from mdl_repro.pipeline import systems as sysm

    p = sub.add_parser(
        "reproduce", help="run the end-to-end hallucination experiment and write a report",
        description="Run the end-to-end hallucination experiment (paper Section 5.2) and write "
                    "records.jsonl, REPORT.md, tables and Figure 3 into --out; rerun to resume. "
                    + BARE_RUN_COST.format(minutes=BARE_RUN_MINUTES) + ".",
        formatter_class=DefaultsHelpFormatter)
    common(p)
    p.add_argument("--out", default="out/reproduce", type=out_dir,
                   help="output dir (one run at a time; a rerun resumes it)")
    p.add_argument("--n-questions", type=positive_int, default=20, help="evaluated questions per dataset")
    p.add_argument("--seeds", type=seed_int, nargs="+", default=[0],
                   help="generation seeds: every evaluated question is answered once per seed "
                        "(the store/split seed is --split-seed)")
    p.add_argument("--systems", nargs="+", default=list(sysm.SYSTEMS), choices=list(sysm.SYSTEMS),
                   help="systems compared (paper Table 3)")
    p.add_argument("--baseline-datasets", nargs="+", default=["truthfulqa"],
                   choices=["truthfulqa", "halueval"],
                   help="datasets on which CRAG and Self-RAG run (paper: TruthfulQA)")
    p.add_argument("--baseline-seeds", type=nonneg_int, default=2,
                   help="CRAG/Self-RAG run on the first this many of --seeds")
    p.add_argument("--n-calibration", type=positive_int, default=80,
                   help="calibration questions per dataset (used when the run calibrates: --recalibrate, "
                        "or a model without a shipped config, such as any --backend openai model; each "
                        "costs one B2 answer, on top of the evaluated questions)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--recalibrate", action="store_true",
                   help="calibrate n_min/n_max and θ on this run's calibration split (Section 3.4; B2 "
                        "answers on --n-calibration questions per dataset) instead of using the config "
                        "shipped for the bundled model; always done for other models")
    g.add_argument("--config", default=None, metavar="FILE", type=config_file,
                   help="an MDL config file (mdl_jax.save_config, e.g. from mdl-jax tune) used for B3 "
                        "on every dataset; no calibration")
    p.add_argument("--chunk-size", type=positive_int, default=32, help="questions per resumable chunk")
    p.add_argument("--backend", choices=["local", "openai"], default="local",
                   help="local: transformers on this machine; openai: an OpenAI-compatible server "
                        "at $MDL_JAX_OPENAI_BASE_URL")
    p.add_argument("--llm", default=None, help="local: HF id or path (%(default)s: the bundled "
                                                "SmolLM2-135M); openai: the served model name")
    p.add_argument("--batch-size", type=positive_int, default=32, help="local backend generation batch")
    p.add_argument("--device", default="cpu", help="local backend torch device (cuda on a GPU)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="local backend weights/activations: auto (bf16 where "
                                                   "the hardware has it, else float32), float32, bfloat16")
    p.add_argument("--engine", default="torch", choices=["torch", "ctranslate2", "llama.cpp", "auto"],
                   help="local backend generation engine: torch (transformers, the paper setup), "
                        "ctranslate2 (int8 weights, the ct2 extra; faster on CPUs without bf16; "
                        "scoring stays in torch; see docs/deviations.md), llama.cpp (the GGUF itself, the "
                        "llamacpp extra; the fastest single-stream on such CPUs), auto (ctranslate2 on a CPU "
                        "without AVX512-BF16 when it is installed, else torch)")
    p.add_argument("--gguf-weights", default=None, choices=["auto", "file", "q8_0"],
                   help="--engine llama.cpp: the weights llama.cpp runs: auto (default: a GGUF under 8 bits, "
                        "like the bundled Q4_1, is requantised once to a cached Q8_0 copy, faster on AVX2 "
                        "CPUs; see docs/deviations.md), file (the GGUF as it is), q8_0 (always the copy)")
    p.add_argument("--max-new-tokens", type=positive_int, default=150, help="answer length cap (paper: 150)")
    p.add_argument("--call-timeout", type=positive_float, default=120.0,
                   help="openai backend: total seconds one call may take, retries included; a call "
                        "over budget becomes a failed record (a rerun fills it in)")
    p.add_argument("--no-analyses", action="store_true",
                   help="write the records and the RQ1 report only, without the learned MDL and the "
                        "RQ2-RQ4 analyses (tables and figures under OUT/analysis); `mdl-jax analyze "
                        "OUT/records.jsonl` and `mdl-jax tune` run them later on the same records")
    p.set_defaults(func=reproduce_cmd)


def reproduce_cmd(args) -> int:
    from mdl_jax._io import OutputError, write_text
    from mdl_jax.signals.embedding_models import ModelLoadError
    from mdl_jax.signals.embeddings import Embedder
    from mdl_repro.analysis.report import write_report
    from mdl_repro.pipeline.experiment import RUN_FILES, Experiment, OutDirInUse, RunConfig
    from mdl_repro.pipeline.generation import make_backend
    from mdl_repro.pipeline.records import read_run_json

    calibration = ("run" if args.recalibrate else args.config if args.config else
                   "shipped" if args.backend == "local" and args.llm is None else "run")
    # a value given twice is one (the report counted "--seeds 0 0" as two seeds of one seed's records)
    once = lambda xs: tuple(dict.fromkeys(xs))  # noqa: E731
    cfg = RunConfig(out=Path(args.out), datasets=once(args.datasets), n_questions=args.n_questions,
                    seeds=once(args.seeds), systems=once(args.systems),
                    baseline_datasets=once(args.baseline_datasets), baseline_seeds=args.baseline_seeds,
                    n_calibration=args.n_calibration, chunk_size=args.chunk_size,
                    data_dir=args.data_dir, embed_model=args.model, cache_dir=args.cache_dir,
                    store_seed=args.split_seed, calibration=calibration,
                    # bars on a terminal, as benchmarks and sweep draw them: written to a log or a
                    # pipe, each redraw is a line, and a line beside an error's one line
                    progress=sys.stderr.isatty())
    if calibration == "run":
        if args.n_calibration < 2:
            raise CommandError(f"reproduce: --n-calibration: this run calibrates (Section 3.4), which "
                               f"needs at least 2 questions per dataset, got {args.n_calibration}")
    local = dict(batch_size=args.batch_size, device=args.device, dtype=args.dtype)
    if args.gguf_weights is not None:
        if args.engine != "llama.cpp" or args.backend != "local":
            raise CommandError(f"reproduce: --gguf-weights: only the local backend's --engine llama.cpp runs "
                               f"a GGUF, got --engine {args.engine} with --backend {args.backend}")
        local["weights"] = args.gguf_weights
    remote = dict(call_timeout=args.call_timeout)
    try:
        backend = make_backend(args.backend, args.llm, max_new_tokens=args.max_new_tokens,
                               engine=args.engine if args.backend == "local" else "torch",
                               **(local if args.backend == "local" else remote))
    except ValueError as e:  # e.g. no server URL for the openai backend: names the setting
        raise CommandError(f"reproduce: {e}") from None
    if calibration == "run" and not args.recalibrate:
        # Not silent: a model other than the bundled one has no shipped config, so the run adds
        # B2 answers on the calibration split to what the user asked for.
        print(f"reproduce: {args.llm or 'this ' + args.backend + ' model'} has no shipped config, so "
              f"B3's config is calibrated on this run's split: {args.n_calibration} calibration "
              f"questions per dataset (one B2 answer each) besides the {args.n_questions} evaluated; "
              "--n-calibration changes the number, --config FILE skips calibration", file=sys.stderr)
    try:
        emb = Embedder(args.model, cache_dir=args.cache_dir)
    except ValueError as e:   # a path to no folder, or a folder that cannot be read to key the cache
        raise _model_error("reproduce", e) from None
    t0 = time.perf_counter()
    # what this run creates, it removes again if it fails on bad input before writing a record: the
    # folders it made, and of a run's files only those that were not there before (a folder that
    # existed may hold the user's own files, or an earlier run's)
    top = cfg.out.absolute()
    while not top.parent.exists():
        top = top.parent
    fresh = None if cfg.out.exists() else top
    made = [name for name in RUN_FILES if not os.path.lexists(cfg.out / name)]
    read_run_json(cfg.out / "run.json")  # a damaged run summary is refused before any file is made
    try:
        exp = Experiment(cfg, backend, emb)  # takes the out dir's lock before any work
    except OutDirInUse as e:
        raise CommandError(str(e)) from None
    except OutputError:  # a link planted at the lock, a full disk: the message names the file
        _remove_empty_run(cfg.out, fresh, made)
        raise
    except OSError as e:  # a folder the OS refuses (read-only, /proc, ...)
        _remove_empty_run(cfg.out, fresh, made)
        raise CommandError(f"reproduce: argument --out: cannot create {str(cfg.out)!r}: "
                           f"{e.strerror or e}") from None
    # what a run that held the lock before this one left (it ended between the list above and the
    # lock) is that run's: not this one's to remove
    made = [name for name in made if name == ".lock" or name in exp.absent_at_lock]
    try:  # the lock is held until the report is written: it reads the records
        prev = read_run_json(cfg.out / "run.json")  # (under the lock: no other run rewrites it now)
        stops: tuple[type[BaseException], ...] = (*user_errors(), ModelLoadError)
        try:
            summary = exp.run()
        except stops as e:
            if not exp.n_written:
                exp.close()
                _remove_empty_run(cfg.out, fresh, made)
            if isinstance(e, ModelLoadError):
                raise _model_error("reproduce", e) from None
            raise
        summary["wall_seconds"] = time.perf_counter() - t0
        run = dict(summary["this_run"])  # this run's own counts decide the exit status below
        if (not run["records_written"] and isinstance(prev.get("this_run"), dict)
                and prev["this_run"].get("records_written")):
            # A rerun with nothing left to do only rewrites the report (new judges, new analyses):
            # it keeps the figures of the last run that did the work instead of reporting the near-zero time of a run that did nothing.
            summary["this_run"], summary["wall_seconds"] = prev["this_run"], prev.get("wall_seconds")
            summary["report_rewritten"] = True
        # a dataset of an earlier run into this out dir keeps its entry (its config scores its records)
        earlier = (prev or {}).get("datasets") if isinstance(prev, dict) else None
        if isinstance(earlier, dict):
            summary["datasets"] = {**{k: v for k, v in earlier.items() if k not in summary["datasets"]},
                                   **summary["datasets"]}
        write_text(cfg.out / "run.json", json.dumps(summary, indent=2))
        # tune first: the analyses score the tuned configs beside the practitioners' gates
        if not args.no_analyses:
            tuned_md = tune_step(cfg.out)
            analysis_md = analyze_step(cfg.out)
        else:
            tuned_md = None
            analysis_md = (f"The RQ2–RQ4 analyses were not run (--no-analyses): `mdl-jax analyze "
                           f"{cfg.out / 'records.jsonl'}` runs them on these records.")
        report = write_report(cfg.out, summary, embedder=emb, analysis_md=analysis_md,
                              tuned_md=tuned_md)
    finally:
        exp.close()
    print(f"wrote {report}", file=sys.stderr)
    if run["records_written"] and run["records_failed"] > MOST_FAILED * run["records_written"]:
        print(f"reproduce: {run['records_failed']} of {run['records_written']} records of this run "
              f"failed ({run['backend_failed_calls']} of {run['backend_calls']} backend calls); "
              "see the 'error' field of records.jsonl. Rerun to retry them.", file=sys.stderr)
        return 3
    return 0


def _remove_empty_run(out: Path, top: Path | None, made: list[str]) -> None:
    """Undo what a run that failed on bad input before its first record created: of the run files
    those in ``made`` (absent before the run: the lock, the empty generation cache and records file,
    the inputs), and the folders from ``out`` up to ``top``, each only if empty (``top`` None: ``out``
    existed before the run, and stays). Under the folder's lock, taken again: a run that took it since
    owns these files now, and a lock file is removed only by its holder (``lock_file``)."""
    from mdl_jax._io import OutputError, lock_file

    try:
        lock = lock_file(out / ".lock") if out.is_dir() else None
    except OutputError:  # a link planted at the lock since: nothing of this run's to remove there
        return
    if lock is None and out.is_dir():
        return
    try:
        for name in made:
            f = out / name
            if f.is_file() and not f.is_symlink() and (name != "records.jsonl" or f.stat().st_size == 0):
                f.unlink()
    finally:
        if lock is not None:
            lock.close()
    if top is None:
        return
    d = out.absolute()
    while True:  # the folders this run created, from --out up to the first that existed before
        try:
            d.rmdir()
        except OSError:
            return
        if d == top:
            return
        d = d.parent


def analyze_step(out: Path) -> str | None:
    """The RQ2-RQ4 analyses of this run's records (``mdl-jax analyze``), or a note why not."""
    from mdl_jax._io import OutputError
    from mdl_repro.analysis.analyze import analyze
    from mdl_repro.analysis.oracle import RecordsError

    try:
        analyze(out / "records.jsonl", out / "analysis")
    except RecordsError as e:
        return f"The RQ2–RQ4 analyses were not run: {e}"
    except OutputError:  # a full disk is the user's to fix, not a finding of the analyses
        raise
    except Exception as e:  # noqa: BLE001
        # The analyses come after the experiment; on a tiny run their fits and bins can fail (sklearn
        # ValueError, empty bins). The records and the RQ1 report are still good: say so, don't crash.
        print(f"reproduce: the RQ2-RQ4 analyses failed: {type(e).__name__}: {e}", file=sys.stderr)
        return f"The RQ2–RQ4 analyses failed on these records: {type(e).__name__}: {e}"
    return (out / "analysis" / "ANALYSIS.md").read_text()


TUNE_MIN_RECORDS = 500  # below this, 5 folds × 3 seeds of tuning say nothing: the report says so


def tune_step(out: Path) -> str | None:
    """The learned MDL beside Table 7 (``mdl-jax tune``) on this run's records, when there are enough."""
    from mdl_repro.analysis.learned import learned_table, markdown
    from mdl_repro.analysis.oracle import RecordsError, load_records, pooled

    try:
        n = len(pooled(load_records(out / "records.jsonl")[0]))
    except RecordsError:
        return None
    if n < TUNE_MIN_RECORDS:
        return (f"## The learned MDL\n\nNot trained: {n} pooled B1/B2/B3 records, fewer than "
                f"{TUNE_MIN_RECORDS}. Run `mdl-jax tune {out / 'records.jsonl'}` on a larger run.")
    try:
        return markdown(learned_table(out / "records.jsonl", out / "tuned"))
    except RecordsError as e:  # e.g. every oracle label equal: a report line, not a crash
        return f"## The learned MDL\n\nNot trained: {e}"
