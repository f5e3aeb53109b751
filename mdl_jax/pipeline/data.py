"""Datasets: TruthfulQA (generation task) and HaluEval-QA, from local files or the hub.

Both go through the ``datasets`` library. Where the files come from, in order:
  1. an explicit ``data_dir`` / ``path`` argument (CLI: ``--data-dir``);
  2. the environment variable ``MDL_JAX_DATA_DIR`` (a folder holding TruthfulQA.csv and
     halueval_qa.jsonl, or .parquet / .jsonl / .csv files of those names);
  3. the folder ``../shared/data`` beside the repository, when it exists (the project's offline copy);
  4. the hub: ``truthfulqa/truthful_qa`` (config ``generation``, split ``validation``) and
     ``pminervini/HaluEval`` (config ``qa``, split ``data``); needs a network.
Before a local file reaches ``datasets`` it is checked line by line, so a missing file, a missing
column or a malformed line is an error that names the file, the line and what was expected.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from pathlib import Path
from typing import Sequence

ENV_DATA_DIR = "MDL_JAX_DATA_DIR"
HUB = {
    "truthfulqa": ("truthfulqa/truthful_qa", "generation", "validation"),
    "halueval": ("pminervini/HaluEval", "qa", "data"),
}
FILE_STEMS = {"truthfulqa": "TruthfulQA", "halueval": "halueval_qa"}
# Local-file column → canonical field, per dataset (the hub already uses the canonical names).
COLUMNS = {
    "truthfulqa": {"Type": "type", "Category": "category", "Question": "question",
                   "Best Answer": "best_answer", "Correct Answers": "correct_answers",
                   "Incorrect Answers": "incorrect_answers", "Source": "source"},
    "halueval": {"knowledge": "knowledge", "question": "question", "right_answer": "right_answer",
                 "hallucinated_answer": "hallucinated_answer"},
}
REQUIRED = {
    "truthfulqa": ("category", "question", "best_answer", "correct_answers", "incorrect_answers"),
    "halueval": ("knowledge", "question", "right_answer", "hallucinated_answer"),
}
DATASETS = tuple(HUB)


class DataError(ValueError):
    """A data file is missing or malformed; the message names the file and line."""


@dataclasses.dataclass(frozen=True)
class Item:
    """One question with its reference answers, dataset-independent.

    correct / incorrect: reference answers (TruthfulQA: best answer first; HaluEval: one each).
    context: HaluEval's knowledge snippet (empty for TruthfulQA).
    """

    dataset: str
    qid: int
    question: str
    category: str
    correct: tuple[str, ...]
    incorrect: tuple[str, ...]
    context: str = ""


def default_data_dir() -> Path | None:
    env = os.environ.get(ENV_DATA_DIR)
    if env:
        return Path(env)
    shared = Path(__file__).resolve().parents[3] / "shared" / "data"  # ../shared beside the repo
    return shared if shared.is_dir() else None


def find_local(dataset: str, data_dir: str | Path | None) -> Path | None:
    """The local file for ``dataset`` in ``data_dir`` (or the default dir), else None (→ hub)."""
    d = Path(data_dir) if data_dir is not None else default_data_dir()
    if d is None:
        return None
    if not d.is_dir():
        raise DataError(f"data_dir: {d} is not a folder (set --data-dir or {ENV_DATA_DIR})")
    stem = FILE_STEMS[dataset]
    for ext in (".csv", ".jsonl", ".json", ".parquet"):
        if (d / (stem + ext)).is_file():
            return d / (stem + ext)
    raise DataError(f"{d}: no {stem}.csv / .jsonl / .parquet for dataset '{dataset}'")


def _check_csv(path: Path, dataset: str) -> None:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty file; expected a CSV header")
        _check_columns(path, dataset, header, line=1)
        width = len(header)
        for row in reader:
            if len(row) != width:
                raise DataError(f"{path}, line {reader.line_num}: expected {width} fields "
                                f"({', '.join(header)}), got {len(row)}")


def _check_jsonl(path: Path, dataset: str) -> None:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}, line {n}: malformed JSON ({e.msg}); expected one object "
                                "per line") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path}, line {n}: expected a JSON object, got {type(obj).__name__}")
            _check_columns(path, dataset, list(obj), line=n)


def _check_columns(path: Path, dataset: str, cols: Sequence[str], line: int) -> None:
    canon = {COLUMNS[dataset].get(c, c) for c in cols}
    missing = [c for c in REQUIRED[dataset] if c not in canon]
    if missing:
        raise DataError(f"{path}, line {line}: missing column(s) {missing}; expected "
                        f"{list(COLUMNS[dataset])}")


def _split_answers(x) -> tuple[str, ...]:
    if isinstance(x, (list, tuple)):
        parts = x
    else:
        parts = str(x or "").split(";")
    return tuple(p.strip() for p in parts if p and p.strip())


def load(dataset: str, data_dir: str | Path | None = None, *, path: str | Path | None = None,
         limit: int | None = None) -> list[Item]:
    """Load ``dataset`` ('truthfulqa' or 'halueval') as a list of ``Item`` in file order."""
    import datasets  # heavy; imported on use

    if dataset not in HUB:
        raise ValueError(f"dataset: expected one of {list(HUB)}, got {dataset!r}")
    src = Path(path) if path is not None else find_local(dataset, data_dir)
    if src is not None:
        if not src.is_file():
            raise DataError(f"{src}: file not found (dataset '{dataset}')")
        kind = {".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(src.suffix)
        if kind is None:
            raise DataError(f"{src}: expected a .csv, .jsonl or .parquet file")
        if kind == "csv":
            _check_csv(src, dataset)
        elif kind == "json":
            _check_jsonl(src, dataset)
        ds = datasets.load_dataset(kind, data_files=str(src), split="train")
        if kind == "parquet":
            _check_columns(src, dataset, ds.column_names, line=0)
        ds = ds.rename_columns({k: v for k, v in COLUMNS[dataset].items()
                                if k in ds.column_names and k != v})
    else:
        name, config, split = HUB[dataset]
        ds = datasets.load_dataset(name, config, split=split)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    items = []
    for i, row in enumerate(ds):
        if dataset == "truthfulqa":
            best = str(row["best_answer"]).strip()
            correct = (best,) + tuple(a for a in _split_answers(row["correct_answers"]) if a != best)
            items.append(Item(dataset, i, row["question"].strip(), row["category"].strip(), correct,
                              _split_answers(row["incorrect_answers"])))
        else:
            items.append(Item(dataset, i, row["question"].strip(), "", (row["right_answer"].strip(),),
                              (row["hallucinated_answer"].strip(),), row["knowledge"].strip()))
        if not items[-1].question:
            raise DataError(f"{src or HUB[dataset][0]}, record {i}: empty question")
    return items
