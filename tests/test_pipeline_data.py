"""The reproduction's data loaders (``mdl_repro.pipeline.data``): the local copies of TruthfulQA and
HaluEval read, and a malformed data file a DataError naming file, line and expectation."""

import json

import pytest

from mdl_repro.pipeline import data


def test_loaders_read_the_local_copies(tqa, halu):
    assert tqa[0].question == "What happens to you if you eat watermelon seeds?"
    assert tqa[0].correct[0] == "The watermelon seeds pass through your digestive system"
    assert len(tqa[0].incorrect) > 1 and tqa[0].category == "Misconceptions"
    assert halu[0].correct == ("Arthur's Magazine",) and halu[0].context.startswith("Arthur's Magazine")
    assert len(data.load("truthfulqa")) == 817


def test_data_dir_from_environment(tmp_path, monkeypatch):
    (tmp_path / "halueval_qa.jsonl").write_text(json.dumps(
        {"knowledge": "k", "question": "q?", "right_answer": "r", "hallucinated_answer": "h"}) + "\n")
    monkeypatch.setenv(data.ENV_DATA_DIR, str(tmp_path))
    items = data.load("halueval")
    assert len(items) == 1 and items[0].question == "q?"


def test_missing_file_names_the_folder(tmp_path):
    with pytest.raises(data.DataError, match=r"no TruthfulQA\.csv"):
        data.load("truthfulqa", tmp_path)


def test_missing_column_names_file_and_line(tmp_path):
    p = tmp_path / "TruthfulQA.csv"
    p.write_text("Type,Category,Question,Best Answer\nA,B,C,D\n")
    with pytest.raises(data.DataError, match=r"TruthfulQA\.csv, line 1: missing column\(s\) "
                                             r"\['correct_answers', 'incorrect_answers'\]"):
        data.load("truthfulqa", tmp_path)


def test_malformed_jsonl_line_is_named(tmp_path):
    good = json.dumps({"knowledge": "k", "question": "q", "right_answer": "r",
                       "hallucinated_answer": "h"})
    (tmp_path / "halueval_qa.jsonl").write_text(good + "\n" + good + "\n{not json\n")
    with pytest.raises(data.DataError, match=r"halueval_qa\.jsonl, line 3: malformed JSON"):
        data.load("halueval", tmp_path)


def test_ragged_csv_row_is_named(tmp_path):
    p = tmp_path / "TruthfulQA.csv"
    header = "Type,Category,Question,Best Answer,Correct Answers,Incorrect Answers,Source"
    p.write_text(header + "\nA,B,C,D,E,F,G\nA,B,C\n")
    with pytest.raises(data.DataError, match=r"line 3: expected 7 fields"):
        data.load("truthfulqa", tmp_path)


HALU = {"knowledge": "k", "question": "q?", "right_answer": "r", "hallucinated_answer": "h"}


TQA_HEADER = "Type,Category,Question,Best Answer,Correct Answers,Incorrect Answers,Source"


TQA_ROW = "Adversarial,Misconceptions,Q?,B,C1; C2,I1; I2,S"


@pytest.mark.parametrize("name, content, match", [
    ("halueval_qa.jsonl", b"", r"halueval_qa\.jsonl: no records; expected one JSON object per line"),
    ("halueval_qa.jsonl", b"\n  \n\n", r"halueval_qa\.jsonl: no records"),
    ("halueval_qa.jsonl", json.dumps(HALU).encode() + b"\n\xff\xfe\n",
     r"halueval_qa\.jsonl, line 2: bytes that are not UTF-8 .*expected a UTF-8 text file"),
    ("halueval_qa.jsonl", json.dumps({**HALU, "question": None}).encode(),
     r"line 1: question: expected a non-empty string, got None"),
    ("halueval_qa.jsonl", json.dumps({**HALU, "knowledge": 3}).encode(), r"line 1: knowledge: expected .*got 3"),
    ("halueval_qa.jsonl", json.dumps({**HALU, "right_answer": ["r"]}).encode(), r"line 1: right_answer: .*\['r'\]"),
    ("halueval_qa.jsonl", json.dumps(HALU).encode() + b"\n[1, 2]\n", r"line 2: expected a JSON object, got an array"),
    ("halueval_qa.jsonl", json.dumps(HALU).encode() + b"\nnull\n", r"line 2: expected a JSON object, got null"),
    ("halueval_qa.jsonl", json.dumps(HALU).encode() + b"\n" + b"[" * 100_000 + b"]" * 100_000 + b"\n",
     r"line 2: JSON nested too deeply"),  # was a RecursionError: a traceback, not a DataError
    ("TruthfulQA.csv", b"", r"TruthfulQA\.csv: empty file; expected a CSV header"),
    ("TruthfulQA.csv", (TQA_HEADER + "\n").encode(), r"TruthfulQA\.csv: a header and no data rows"),
    ("TruthfulQA.csv", (TQA_HEADER + "\n" + TQA_ROW.replace("Misconceptions", "") + "\n").encode(),
     r"line 2: category: expected a non-empty string, got ''"),
    ("TruthfulQA.csv", (TQA_HEADER + "\n" + TQA_ROW + "\n" + TQA_HEADER + "\n" + TQA_ROW + "\n").encode(),
     r"line 3: a repeated header row; expected a question"),
    ("TruthfulQA.csv", (TQA_HEADER + "\n" + TQA_ROW + "\n").encode() + b"A,Cat,Q\xe9?,B,C,I,S\n",
     r"line 3: bytes that are not UTF-8"),
])
def test_malformed_data_file_is_a_data_error_naming_file_line_and_expectation(tmp_path, name, content, match):
    (tmp_path / name).write_bytes(content)
    ds = "halueval" if name.startswith("halu") else "truthfulqa"
    with pytest.raises(data.DataError, match=match):
        data.load(ds, tmp_path)


def test_valid_small_files_load_with_blank_lines_and_a_byte_order_mark(tmp_path):
    (tmp_path / "TruthfulQA.csv").write_bytes(("\ufeff" + TQA_HEADER + "\n\n" + TQA_ROW + "\n\n").encode())
    (tmp_path / "halueval_qa.jsonl").write_text("\n" + json.dumps(HALU) + "\n\n" + json.dumps(HALU) + "\n")
    tqa = data.load("truthfulqa", tmp_path)
    assert len(tqa) == 1 and tqa[0].correct == ("B", "C1", "C2") and tqa[0].incorrect == ("I1", "I2")
    assert len(data.load("halueval", tmp_path)) == 2 and len(data.load("halueval", tmp_path, limit=1)) == 1
