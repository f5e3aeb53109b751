"""The benchmark loaders (mdl_jax/evaluation/datasets): the counts the data's own documentation states,
memory sets rebuilt identically, the label rules, the argument errors, AdaRAGUE's Acc against its report's
table, and the hub-only loaders on fixtures written from each hub's documented schema.

The shared data is ../shared/data/benchmarks (LABELS.md and README.md there state the counts checked here).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mdl_jax.evaluation.datasets import (
    BENCHMARKS,
    HUB_BENCHMARKS,
    SHARED_BENCHMARKS,
    AdaRAGUEItem,
    BenchmarkItem,
    DataError,
    acc,
    acc_tok,
    benchmark_dir,
    load_benchmark,
)
from mdl_jax.evaluation.datasets.adarague import ADARAGUE_SPLITS
from mdl_jax.evaluation.datasets.hub import split_documents
from mdl_jax.evaluation.datasets.shared import conflictqa_memory_side_true

ROOT = benchmark_dir()
pytestmark = pytest.mark.skipif(ROOT is None or not (ROOT / "ramdocs").is_dir(),
                                reason="needs ../shared/data/benchmarks (or MDL_JAX_BENCHMARK_DIR)")


def _load(name, **kw):
    return load_benchmark(name, **kw)


# ------------------------------------------------------------------------------- counts from LABELS.md

def test_ramdocs_has_500_questions_and_the_stated_document_types():
    items = _load("ramdocs")
    assert len(items) == 500
    assert Counter(t for it in items for t in it.meta["doc_types"]) == {"correct": 1918, "misinfo": 307, "noise": 541}
    assert sum("misinfo" in it.meta["doc_types"] for it in items) == 243
    assert sum("noise" in it.meta["doc_types"] for it in items) == 337
    assert sum(it.meta["ambiguous"] for it in items) == 400
    # conflict = misinformation beside a correct document; the two misinformation-only sets are not adopted
    assert sum(it.has_conflict for it in items) == 241
    assert all(it.should_adopt is None for it in items if it.has_conflict)
    assert all(it.should_adopt is False and it.should_abstain for it in items if "correct" not in it.meta["doc_types"])


def test_selfaware_has_2337_answerable_and_1032_unanswerable_questions_with_no_memory():
    items = _load("selfaware")
    assert Counter(it.should_abstain for it in items) == {False: 2337, True: 1032}
    assert all(it.memories == () and it.condition == "no_memory" for it in items)
    assert all(it.answers == () for it in items if it.should_abstain)


def test_retrievalqa_gold_in_context_decides_adopt_or_abstain():
    items = _load("retrievalqa_gpt4")
    assert len(items) == 250
    assert Counter(it.meta["data_source"] for it in items) == {s: 50 for s in
                                                               ("realtimeqa", "freshqa", "toolqa", "popqa", "triviaqa")}
    # LABELS.md counts 151 of 250 "by normalized substring" without stating the text compared; SQuAD
    # normalisation against each memory ("<title>: <text>") finds 153
    hits = sum(it.should_adopt for it in items)
    assert hits == 153 and abs(hits - 151) <= 2
    assert all(it.should_abstain == (not it.should_adopt) for it in items)


def test_nomiracl_has_250_relevant_and_250_non_relevant_sets_of_ten_passages():
    items = _load("nomiracl_en")
    assert Counter(it.condition for it in items) == {"relevant": 250, "non_relevant": 250}
    assert len({it.group for it in items}) == 500  # the two subsets share no query
    assert all(len(it.memories) == 10 == len(it.meta["docids"]) for it in items)
    assert all(it.question and "CONTEXTS" not in it.question and "QUESTION" not in it.question for it in items)
    assert not any("OUTPUT:" in m or m.startswith("[") for it in items for m in it.memories)
    assert all(it.should_abstain == (it.condition == "non_relevant") != it.should_adopt for it in items)
    assert _load("nomiracl_en", split="non_relevant") == [it for it in items if it.condition == "non_relevant"]


def test_conflictqa_has_6628_rows_over_eight_files_three_sets_each():
    items = _load("conflictqa_strategyqa")
    both = [it for it in items if it.condition == "both"]
    assert len(both) == 6628 and len(items) == 3 * 6628
    assert len({it.meta["model"] for it in both}) == 8
    assert all(it.has_conflict and len(it.memories) == 2 for it in both)
    # the negation check; LABELS.md's quick check found 851/356/38 (chatgpt) and 66/576/56 (llama2-7b)
    by = Counter((it.meta["model"], it.meta["memory_true"]) for it in both)
    assert (by["chatgpt", True], by["chatgpt", False], by["chatgpt", None]) == (856, 358, 31)
    assert (by["llama2-7b", True], by["llama2-7b", False], by["llama2-7b", None]) == (67, 580, 51)
    # the counter side is adopted exactly where the memory side is not
    trio = {}
    for it in items:
        trio.setdefault(it.qid.rsplit(":", 1)[0], {})[it.condition] = it
    for t in trio.values():
        m, c = t["memory"].should_adopt, t["counter"].should_adopt
        assert (m is None and c is None) or m == (not c)
        assert t["both"].group == t["memory"].group == t["counter"].group


def test_conflictqa_polarity_rule():
    assert conflictqa_memory_side_true("Yes, it is.", "It is not.", "True") is True
    assert conflictqa_memory_side_true("It isn't.", "It is.", "True") is False
    assert conflictqa_memory_side_true("It is.", "It is too.", "False") is None


def test_conflictnq_has_451_questions_real_fake_and_mixed():
    items = _load("conflictnq")
    real = [it for it in items if it.condition == "real"]
    assert Counter(it.meta["split"] for it in real) == {"test": 226, "val": 225}
    by = {c: [it for it in items if it.condition == c] for c in ("real", "fake", "mixed")}
    assert all(len(it.memories) == 1 and it.should_adopt for it in by["real"])
    assert all(len(it.memories) == 5 and it.should_adopt is False for it in by["fake"])
    assert all(len(it.memories) == 6 and it.has_conflict and it.should_adopt is None for it in by["mixed"])
    assert all(it.answers[0] != it.wrong_answers[0] for it in real)


def test_poisonedrag_has_three_times_100_questions_of_five_poisoned_passages():
    items = _load("poisonedrag_adv")
    assert Counter(it.meta["source"] for it in items) == {"nq": 100, "hotpotqa": 100, "msmarco": 100}
    assert all(len(it.memories) == 5 and it.should_adopt is False for it in items)
    # the crafted passages assert the wrong answer
    assert sum(any(it.wrong_answers[0].lower() in m.lower() for m in it.memories) for it in items) > 250


def test_rgb_has_100_questions_and_four_memory_sets_each():
    items = _load("rgb_en_fact")
    assert len({it.group for it in items}) == 100 and len(items) == 400
    assert Counter(it.condition for it in items) == {"true": 100, "swapped": 100, "mixed": 100, "noise": 100}
    for it in items:
        kinds = Counter(it.meta["memory_kinds"])
        assert len(it.memories) <= 10
        if it.condition == "true":
            assert "swapped" not in kinds and it.should_adopt
        elif it.condition == "swapped":
            assert "true" not in kinds and it.should_adopt is False
        elif it.condition == "mixed":
            assert kinds["true"] and kinds["swapped"] and it.has_conflict
        else:
            assert set(kinds) <= {"noise"}
            # a noise snippet that names the answer leaves the set's labels open
            assert it.should_abstain is (None if it.meta["answer_in_noise"] else True)
    assert sum(it.meta["answer_in_noise"] for it in items if it.condition == "noise") == 1
    # the swapped snippets assert the fake answer, the true ones the answer
    sw = [it for it in items if it.condition == "swapped"]
    assert sum(any(it.wrong_answers[0] in m for m, k in zip(it.memories, it.meta["memory_kinds"]) if k == "swapped")
               for it in sw) >= 95


def test_rgb_equal_gives_every_set_of_a_question_the_same_size():
    """``rgb_en_fact_equal``: the four sets of a question hold as many memories as its noise snippets, so a
    gate cannot rank them by counting; the labels are ``rgb_en_fact``'s, condition by condition."""
    items = _load("rgb_en_fact_equal")
    base = {it.qid.split(":", 1)[1]: it for it in _load("rgb_en_fact")}
    rows = {str(r["id"]): r for r in map(json.loads, (ROOT / "rgb_en_fact" / "en_fact.json").open())}
    by: dict[str, list] = {}
    for it in items:
        by.setdefault(it.group, []).append(it)
    assert len(by) == 100
    for group, sets in by.items():
        k = min(10, len(rows[group.split(":", 1)[1]]["negative"]))
        assert {len(it.memories) for it in sets} == {k}, group
        # a set of one memory cannot hold both answers: no mixed set there
        assert [it.condition for it in sets] == ["true", "swapped", "noise"] if k == 1 else ["true", "swapped", "mixed", "noise"]
    assert Counter(it.condition for it in items) == {"true": 100, "swapped": 100, "mixed": 96, "noise": 100}
    # the question keeps its group, so both readings put it on one side of the calibration split
    assert all(it.group == base[it.qid.split(":", 1)[1]].group for it in items)
    assert len({it.qid for it in items}) == len(items) and not {it.qid for it in items} & {it.qid for it in base.values()}
    for it in items:
        kinds = Counter(it.meta["memory_kinds"])
        old = base[it.qid.split(":", 1)[1]]
        # the same label rule: where the same noise snippets stand in the set, the same labels
        if it.meta["answer_in_noise"] == old.meta["answer_in_noise"]:
            assert (it.should_adopt, it.should_abstain, it.has_conflict) == (
                old.should_adopt, old.should_abstain, old.has_conflict), it.qid
        if it.condition == "mixed":
            assert kinds["true"] and kinds["swapped"] and it.has_conflict
        elif it.condition == "noise":
            # every noise snippet already fits under ten: the noise set is rgb_en_fact's, in its order
            assert it.memories == old.memories
        else:
            assert kinds[it.condition] >= 1 and set(kinds) <= {it.condition, "noise"}


def _rgb_file(folder: Path, **row) -> Path:
    base = {"id": 7, "query": "Who?", "answer": ["Ann"], "fakeanswer": "Bob", "positive": ["Ann did it."],
            "positive_wrong": ["Bob did it."], "negative": ["Noise one.", "Noise two."]}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "en_fact.json").write_text(json.dumps(base) + "\n" + json.dumps({**base, "id": 8, **row}) + "\n",
                                         encoding="utf-8")
    return folder


@pytest.mark.parametrize("name", ["rgb_en_fact", "rgb_en_fact_equal"])
def test_an_rgb_question_without_true_snippets_is_a_data_error_naming_the_line(tmp_path, name):
    # its "true" set would hold noise only, labelled should_adopt True; its "mixed" set no answer, labelled a conflict
    folder = _rgb_file(tmp_path, positive=["  "], positive_wrong=[""])
    with pytest.raises(DataError, match=r"en_fact\.json, line 2: positive: no true snippet"):
        load_benchmark(name, path=folder)


def test_rgbs_equal_reading_of_a_question_without_noise_snippets_is_a_data_error_naming_the_line(tmp_path):
    # every set of the question would be empty: a "true" set of no memories labelled should_adopt True
    folder = _rgb_file(tmp_path, negative=[" "])
    assert [len(it.memories) for it in load_benchmark("rgb_en_fact", path=folder)][4:] == [1, 1, 2, 0]
    with pytest.raises(DataError, match=r"en_fact\.json, line 2: negative: no noise snippet"):
        load_benchmark("rgb_en_fact_equal", path=folder)


# ------------------------------------------------------------------------------- every data set

@pytest.mark.parametrize("name", [n for n in SHARED_BENCHMARKS if n not in ("conflictqa_strategyqa", "adarague_llama8b")])
def test_memory_sets_are_rebuilt_identically_on_two_loads(name):
    a, b = _load(name), _load(name)
    assert a == b and a is not b
    assert [it.memories for it in a] == [it.memories for it in b]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["conflictqa_strategyqa", "adarague_llama8b"])
def test_the_large_sets_are_rebuilt_identically_on_two_loads(name):
    assert _load(name) == _load(name)


@pytest.mark.parametrize("name", [n for n in SHARED_BENCHMARKS if n not in ("conflictqa_strategyqa", "adarague_llama8b")])
def test_items_are_well_formed_and_within_the_stated_cap(name):
    items = _load(name)
    spec = BENCHMARKS[name]
    assert items and all(isinstance(it, BenchmarkItem) and it.dataset == name for it in items)
    assert len({it.qid for it in items}) == len(items)
    assert max(len(it.memories) for it in items) <= spec.max_memories
    assert all(it.question and all(isinstance(m, str) and m for m in it.memories) for it in items)
    assert all(it.should_adopt in (True, False, None) and it.should_abstain in (True, False, None) for it in items)
    with pytest.raises(dataclasses.FrozenInstanceError):
        items[0].question = "x"
    with pytest.raises(TypeError):
        items[0].meta["new"] = 1


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_registry_entry_states_its_label_rule_and_licence(name):
    spec = BENCHMARKS[name]
    assert spec.licence and spec.source
    assert "should_" in spec.label_rule or "has_conflict" in spec.label_rule, name
    assert "Args:" not in spec.label_rule


def test_limit_reads_the_first_questions_with_all_their_memory_sets():
    full = _load("rgb_en_fact")
    three = _load("rgb_en_fact", limit=3)
    assert len({it.group for it in three}) == 3 and three == full[:12]
    assert _load("conflictnq", limit=2, split="val") == _load("conflictnq", split="val")[:6]


@pytest.mark.parametrize("name", ["nomiracl_en", "selfaware", "poisonedrag_adv", "conflictnq",
                                  "conflictqa_strategyqa"])
def test_a_limited_read_takes_every_split_in_turn(name):
    """A smoke test's limit sees each split (and both of SelfAware's blocks), not only the first one's rows."""
    parts = {"nomiracl_en": lambda it: it.condition, "selfaware": lambda it: it.should_abstain,
             "poisonedrag_adv": lambda it: it.meta["source"], "conflictnq": lambda it: it.meta["split"],
             "conflictqa_strategyqa": lambda it: it.meta["model"]}[name]
    full = _load(name)
    limited = _load(name, limit=16)
    assert {parts(it) for it in limited} == {parts(it) for it in full}
    assert all(it in full for it in limited)


def test_split_selects_one_part():
    assert {it.meta["source"] for it in _load("poisonedrag_adv", split="msmarco")} == {"msmarco"}
    assert {it.meta["model"] for it in _load("conflictqa_strategyqa", split="palm2", limit=5)} == {"palm2"}


# ------------------------------------------------------------------------------- errors and paths

def test_an_unknown_name_is_a_value_error_listing_the_known_names():
    with pytest.raises(ValueError, match=r"name: expected one of \[.*'ramdocs'.*\], got 'ramdoc'"):
        load_benchmark("ramdoc")
    with pytest.raises(ValueError, match="name:"):
        load_benchmark(3)


@pytest.mark.parametrize(("limit", "err"), [(0, ValueError), (-2, ValueError), ("3", TypeError), (True, TypeError),
                                            (2.0, TypeError)])
def test_a_bad_limit_names_the_argument(limit, err):
    with pytest.raises(err, match="limit: expected a positive int or None"):
        load_benchmark("ramdocs", limit=limit)


def test_a_bad_split_names_the_argument_and_the_known_splits():
    with pytest.raises(ValueError, match=r"split: expected one of \['nq', 'hotpotqa', 'msmarco'\]"):
        load_benchmark("poisonedrag_adv", split="trec")
    with pytest.raises(ValueError, match=r"split: expected None \(it has one split\)"):
        load_benchmark("ramdocs", split="test")
    with pytest.raises(TypeError, match="split:"):
        load_benchmark("conflictnq", split=1)


def test_a_missing_path_is_a_data_error_naming_it(tmp_path):
    with pytest.raises(DataError, match="path: .*nowhere not found"):
        load_benchmark("ramdocs", path=tmp_path / "nowhere")
    with pytest.raises(DataError, match=r"RAMDocs_test\.jsonl: file not found"):
        load_benchmark("ramdocs", path=tmp_path)


def test_path_and_environment_override_the_shared_copy(tmp_path, monkeypatch):
    folder = tmp_path / "ramdocs"
    folder.mkdir()
    lines = (ROOT / "ramdocs" / "RAMDocs_test.jsonl").read_text(encoding="utf-8").split("\n")[:3]
    (folder / "RAMDocs_test.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert load_benchmark("ramdocs", path=folder) == _load("ramdocs", limit=3)
    monkeypatch.setenv("MDL_JAX_BENCHMARK_DIR", str(tmp_path))
    assert len(load_benchmark("ramdocs")) == 3
    with pytest.raises(DataError, match=r"no local copy .*MDL_JAX_BENCHMARK_DIR.*Source: github\.com/chen700564/RGB"):
        load_benchmark("rgb_en_fact")


def test_a_malformed_line_is_a_data_error_naming_file_and_line(tmp_path):
    good = (ROOT / "ramdocs" / "RAMDocs_test.jsonl").read_text(encoding="utf-8").split("\n")[0]
    (tmp_path / "RAMDocs_test.jsonl").write_text(good + "\n{not json\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"RAMDocs_test\.jsonl, line 2: malformed JSON"):
        load_benchmark("ramdocs", path=tmp_path)
    row = json.loads(good)
    del row["gold_answers"]
    (tmp_path / "RAMDocs_test.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 1: missing field 'gold_answers'"):
        load_benchmark("ramdocs", path=tmp_path)


def test_json_nested_past_pythons_stack_is_a_data_error_naming_the_file(tmp_path):
    """A JSON value nested 100,000 deep raised RecursionError out of the readers: a traceback."""
    from mdl_jax.evaluation.datasets.files import iter_jsonl, read_json

    deep = "[" * 100_000 + "]" * 100_000
    good = (ROOT / "ramdocs" / "RAMDocs_test.jsonl").read_text(encoding="utf-8").split("\n")[0]
    (tmp_path / "RAMDocs_test.jsonl").write_text(good + "\n" + deep + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"RAMDocs_test\.jsonl, line 2: JSON nested too deeply"):
        list(iter_jsonl(tmp_path / "RAMDocs_test.jsonl"))
    with pytest.raises(DataError, match=r"RAMDocs_test\.jsonl, line 2: JSON nested too deeply"):
        load_benchmark("ramdocs", path=tmp_path)
    (tmp_path / "doc.json").write_text(deep, encoding="utf-8")
    with pytest.raises(DataError, match=r"doc\.json: JSON nested too deeply"):
        read_json(tmp_path / "doc.json")


def test_the_pipeline_loader_keeps_its_public_names():
    from mdl_repro.pipeline import data

    assert data.DataError is DataError
    assert data.ENV_DATA_DIR == "MDL_JAX_DATA_DIR" and callable(data.default_data_dir)


# ------------------------------------------------------------------------------- AdaRAGUE

# REPORT.md's table: Acc for no / one / multi retrieval, and tok for no / one
REPORT = {
    "nq_test": (.448, .490, .474, .446, .496), "squad_test": (.182, .316, .274, .176, .312),
    "trivia_test": (.638, .616, .616, .636, .610), "hotpotqa_test": (.286, .408, .440, .286, .410),
    "2wikimultihopqa_test": (.322, .386, .462, .318, .374), "musique_test": (.110, .106, .140, .106, .100),
    "nq_dev_500": (.388, .454, .466, .390, .456), "squad_dev_500": (.178, .290, .286, .178, .288),
    "trivia_dev_500": (.678, .680, .678, .676, .678), "hotpotqa_dev_500": (.298, .404, .474, .296, .398),
    "2wikimultihopqa_dev_500": (.282, .346, .458, .282, .344), "musique_dev_500": (.104, .130, .176, .102, .130),
}


def _rates(items):
    n = len(items)
    return tuple(round(sum(f(getattr(it, f"answer_{k}_retrieval"), it.answers) for it in items) / n, 3)
                 for f, k in ((acc, "no"), (acc, "one"), (acc, "multi"), (acc_tok, "no"), (acc_tok, "one")))


def test_adarague_hotpotqa_test_acc_equals_the_report():
    items = _load("adarague_llama8b", split="hotpotqa_test")
    assert len(items) == 500 and all(isinstance(it, AdaRAGUEItem) for it in items)
    assert _rates(items) == REPORT["hotpotqa_test"]
    assert all(it.passages and 4 <= len(it.memories) <= 15 for it in items)
    assert all(it.classifier_option in "ABC" and abs(sum(it.classifier_probas) - 1) < 1e-3 for it in items)
    assert all(isinstance(it.wtr_giveup, bool) and it.ircot_steps >= 1 for it in items)
    assert all("csv_rag_one_retrieve" in it.meta for it in items)
    # the label: retrieval helps where the one-retrieval answer alone is right (REPORT.md's +R / -R: 86 / 25)
    assert (sum(it.should_adopt is True for it in items), sum(it.should_adopt is False for it in items)) == (86, 25)


@pytest.mark.parametrize("split", ADARAGUE_SPLITS)
def test_adarague_acc_equals_the_report_on_every_file(split):
    items = _load("adarague_llama8b", split=split)
    assert len(items) == 500
    assert _rates(items) == REPORT[split]
    test = split.endswith("_test")
    assert all((it.classifier_option is not None) == test and (it.wtr_giveup is not None) == test for it in items)
    has_passages = split in ("hotpotqa_test", "2wikimultihopqa_test")
    assert all(bool(it.passages) == has_passages for it in items)


def test_acc_is_a_normalised_substring_and_tok_a_token_span():
    assert acc("The answer is: Paris.", ["paris"]) == 1
    assert acc("Parisian", ["Paris"]) == 1 and acc_tok("Parisian", ["Paris"]) == 0
    assert acc("Lyon", ["Paris", "the"]) == 0  # an article-only gold normalises to "" and never matches
    assert acc_tok("He was born in New York City", ["new york"]) == 1
    with pytest.raises(TypeError, match="prediction: expected a string"):
        acc(None, ["x"])


# ------------------------------------------------------------------------------- hub-only, on fixtures

def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_lone_surrogate_in_a_json_array_names_its_record(tmp_path):
    """A lone surrogate escape in the third record of a .json array was refused naming only the file,
    with no way to find it among thousands; it names the record, as every other error of a record does,
    and a surrogate pair (an emoji as ensure_ascii writes it) still reads as its character."""
    from mdl_jax.evaluation.datasets.files import read_records

    path = tmp_path / "test.json"
    path.write_text('[{"q": "a \\ud83d\\ude00"}, {"q": "b"}, {"q": [{"\\udc00": "c"}]}]')
    with pytest.raises(DataError, match=r"test\.json, record 2: a string holds a lone surrogate \('\\udc00'"):
        read_records(path)
    path.write_text('[{"q": "a \\ud83d\\ude00"}]')
    assert read_records(path) == [(f"{path}, record 0", {"q": "a \U0001f600"})]


def _selfaware(folder: Path, examples_json: str) -> Path:
    """A SelfAware.json as the upstream file is laid out (one indented document) holding ``examples_json``."""
    folder.mkdir(exist_ok=True)
    (folder / "SelfAware.json").write_text('{\n  "example": [\n' + examples_json + '\n  ]\n}\n')
    return folder


def _ramdocs_with_a_repeated_key(folder):
    good = (ROOT / "ramdocs" / "RAMDocs_test.jsonl").read_text(encoding="utf-8").split("\n")[0]
    (folder / "RAMDocs_test.jsonl").write_text(good + '\n{"question": "q", "question": "r"}\n')


_EXAMPLE = '    {"question_id": %d, "question": "%s", "answer": ["a"], "answerable": true, "source": "s"}'


@pytest.mark.parametrize("name, write, where", [
    # a JSONL file: the file, the line and the key
    ("ramdocs", _ramdocs_with_a_repeated_key, r"RAMDocs_test\.jsonl, line 2: question: "),
    # one document: PoisonedRAG's questions keyed by id, the id stated twice
    ("poisonedrag_adv", lambda t: [(t / f"{s}.json").write_text(
        '{"test1": {"question": "q"},\n "test1": {"question": "r"}}' if s == "nq" else "{}")
        for s in ("nq", "hotpotqa", "msmarco")], r"nq\.json: test1: "),
    ("selfaware", lambda t: _selfaware(t, (_EXAMPLE % (1, "q"))[:-1] + ', "answer": ["b"]}'),
     r"SelfAware\.json: answer: "),
])
def test_a_key_stated_twice_in_a_data_file_is_a_data_error_naming_it(tmp_path, name, write, where):
    """JSON keeps the last of a key stated twice in one object, so the first value was lost silently (a
    second question under one id in PoisonedRAG, an answer replaced): refused, as in a config file."""
    write(tmp_path)
    with pytest.raises(DataError, match=where + r"stated twice in one object \(JSON would keep the last"):
        load_benchmark(name, path=tmp_path)


def test_a_key_stated_twice_in_a_users_hub_export_or_its_metadata_is_a_data_error(tmp_path):
    from mdl_jax.evaluation.datasets.files import read_records
    from mdl_jax.evaluation.datasets.hub import abstentionbench_items

    for suffix, text, where in ((".json", '[{"q": "a"}, {"q": "b", "q": "c"}]', r"x\.json: q: "),
                                (".jsonl", '{"q": "a"}\n{"q": "b", "q": "c"}\n', r"x\.jsonl, line 2: q: ")):
        (tmp_path / f"x{suffix}").write_text(text)
        with pytest.raises(DataError, match=where + "stated twice"):
            read_records(tmp_path / f"x{suffix}")
    row = {"should_abstain": True, "question": "q", "metadata_json": '{"a": 1, "a": 2}'}
    with pytest.raises(DataError, match=r"^x, record 0: metadata_json: a: stated twice"):
        abstentionbench_items([("s", "x, record 0", row)])


@pytest.mark.parametrize("escapes, at", [
    ("\\ud800", 37),                       # alone
    ("\\udc00 after \\ud83d\\ude00", 37),  # a low half alone, before a pair
    ("\\ud83d\\ude00 then \\ud800", 55),    # a pair, then one alone
    ("\\ud800\\ud83d\\ude00", 37),         # a high half followed by a pair
    ("\\\\\\ud800", 39),                   # after an escaped backslash
])
def test_a_lone_surrogate_in_one_json_document_names_its_line_and_column(tmp_path, escapes, at):
    """SelfAware.json and PoisonedRAG's files are each one document of thousands of lines: a lone
    surrogate escape in one was named by the file alone; it names the line and the column, as the
    JSONL readers name the line. Paired halves and escaped backslashes are text, and read."""
    rows = ",\n".join(_EXAMPLE % (i, "fine") for i in range(2))
    _selfaware(tmp_path, rows + ",\n" + _EXAMPLE % (2, escapes))
    with pytest.raises(DataError, match=rf"SelfAware\.json, line 5, column {at}: a string holds a "
                                        r"lone surrogate \('\\ud[8c]00'\)"):
        load_benchmark("selfaware", path=tmp_path)
    for text in ("\\ud83d\\ude00 \\\\ud800", "\\\\\\\\ud800"):  # a pair; escaped backslashes before "ud800"
        _selfaware(tmp_path, rows + ",\n" + _EXAMPLE % (2, text))
        assert len(load_benchmark("selfaware", path=tmp_path)) == 3


def test_a_one_document_file_with_paired_escapes_only_is_not_searched_escape_by_escape(tmp_path, monkeypatch):
    """A file written with json.dump's ensure_ascii holds every emoji as two escapes: the search that
    names a lone one's line and column walked each pair in Python, many times the parse, for
    files that hold none. The decoded strings are checked first; the search runs for a file with one."""
    from mdl_jax.evaluation.datasets import files

    def searched(text):
        raise AssertionError("searched escape by escape")

    rows = ",\n".join(_EXAMPLE % (i, "\\ud83d\\ude00" * 20) for i in range(50))
    _selfaware(tmp_path, rows)
    monkeypatch.setattr(files, "_lone_escape", searched)
    assert [it.question for it in load_benchmark("selfaware", path=tmp_path)][:1] == ["\U0001f600" * 20]


def test_a_key_stated_twice_in_a_json_lines_file_named_json_names_its_line(tmp_path):
    """A hub export named .json may hold one object per line; its repeated key was named by the file
    alone where it stood on the first line (the file is first read as one document), by its line
    elsewhere."""
    from mdl_jax.evaluation.datasets.files import read_records

    path = tmp_path / "x.json"
    for text, line in (('{"q": "a", "q": "b"}\n{"q": "c"}\n', 1), ('{"q": "a"}\n{"q": "b", "q": "c"}\n', 2)):
        path.write_text(text)
        with pytest.raises(DataError, match=rf"x\.json, line {line}: q: stated twice"):
            read_records(path)
    path.write_text('{"q": "a",\n "q": "b"}\n')   # one document over two lines: the key, no line
    with pytest.raises(DataError, match=r"x\.json: q: stated twice"):
        read_records(path)


def test_json_nested_past_pythons_stack_in_a_hub_export_or_its_metadata_is_a_data_error(tmp_path):
    """A .json export, and AbstentionBench's metadata_json, nested deeper than Python's stack ended in
    a RecursionError's traceback: a DataError naming the file or the row, as a .jsonl line's is."""
    from mdl_jax.evaluation.datasets.files import read_records
    from mdl_jax.evaluation.datasets.hub import abstentionbench_items

    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "x.json").write_text(deep)
    with pytest.raises(DataError, match=r"x\.json: JSON nested too deeply"):
        read_records(tmp_path / "x.json")
    row = {"should_abstain": True, "question": "q", "metadata_json": deep}
    with pytest.raises(DataError, match=r"^x, record 0: metadata_json: JSON nested too deeply"):
        abstentionbench_items([("s", "x, record 0", row)])


def test_a_byte_order_mark_inside_a_json_lines_file_is_named(tmp_path):
    """Two files joined by cat, the second with a byte-order mark: json.loads named the mark on its
    line; the repeated-key reader said only "Expecting value"."""
    from mdl_jax.evaluation.datasets.files import iter_jsonl

    path = tmp_path / "x.jsonl"
    path.write_text('{"q": "a"}\n\ufeff{"q": "b"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"x\.jsonl, line 2: malformed JSON \(Unexpected UTF-8 BOM"):
        list(iter_jsonl(path))


def test_faitheval_fixture_from_the_hub_schema(tmp_path):
    _jsonl(tmp_path / "unanswerable.jsonl", [
        {"qid": "u1", "question": "Who wrote it?", "context": "A text about something else.", "answers": ["Ann"]}])
    _jsonl(tmp_path / "inconsistent.jsonl", [
        {"qid": "i1", "question": "Where was he born?",
         "context": "Document: He was born in Oslo.\nDocument: He was born in Bergen.", "answers": ["Oslo", "Bergen"]}])
    _jsonl(tmp_path / "counterfactual.jsonl", [
        {"id": "c1", "question": "What is the moon made of?", "context": "The moon is made of marshmallows.",
         "choices": {"label": ["A", "B"], "text": ["rock", "marshmallows"]}, "answerKey": "B", "num of options": 2}])
    items = load_benchmark("faitheval", path=tmp_path)
    assert [it.condition for it in items] == ["unanswerable", "inconsistent", "counterfactual"]
    un, inc, cf = items
    assert un.should_abstain and un.should_adopt is False and un.meta["original_answers"] == ("Ann",)
    assert inc.has_conflict and inc.memories == ("He was born in Oslo.", "He was born in Bergen.")
    assert cf.should_adopt is False and cf.wrong_answers == ("marshmallows",)
    assert load_benchmark("faitheval", path=tmp_path / "inconsistent.jsonl", split="inconsistent") == [inc]
    with pytest.raises(DataError, match="pass split="):
        load_benchmark("faitheval", path=tmp_path / "inconsistent.jsonl")
    with pytest.raises(DataError, match=r"answerKey 'C'"):
        _jsonl(tmp_path / "counterfactual.jsonl", [{"id": "c", "question": "q", "context": "c",
                                                    "choices": {"label": ["A"], "text": ["a"]}, "answerKey": "C"}])
        load_benchmark("faitheval", path=tmp_path, split="counterfactual")


def test_faitheval_rows_sharing_a_hub_id_are_each_their_own_question(tmp_path):
    """The hub's ids are its own: two rows of one split under one id were two items with one qid, which
    load_benchmark refuses (a user's gate scores are joined on it); the second gets the id's count."""
    row = {"question": "Who wrote it?", "context": "A text about something else.", "answers": ["Ann"]}
    _jsonl(tmp_path / "unanswerable.jsonl", [{"qid": "u1", **row}, {"qid": "u1", **row, "question": "Who?"},
                                             {"qid": "u2", **row}])
    items = load_benchmark("faitheval", path=tmp_path, split="unanswerable")
    assert [it.qid for it in items] == ["faitheval:unanswerable:u1:unanswerable",
                                        "faitheval:unanswerable:u1#2:unanswerable",
                                        "faitheval:unanswerable:u2:unanswerable"]
    assert items[1].question == "Who?" and len({it.group for it in items}) == 3


def test_faitheval_count_suffix_never_repeats_an_id_the_split_holds(tmp_path):
    """A hub id of the form "<id>#2" beside two rows of "<id>": the second "<id>" was counted to "<id>#2",
    the qid of another row, and load_benchmark refused the set; the count skips ids the split holds."""
    row = {"question": "Who wrote it?", "context": "A text about something else.", "answers": ["Ann"]}
    for ids, want in ((["u1", "u1", "u1#2"], ["u1", "u1#2", "u1#2#2"]),
                      (["u1#2", "u1", "u1"], ["u1#2", "u1", "u1#3"])):
        _jsonl(tmp_path / "unanswerable.jsonl", [{"qid": i, **row} for i in ids])
        items = load_benchmark("faitheval", path=tmp_path, split="unanswerable")
        assert [it.qid for it in items] == [f"faitheval:unanswerable:{i}:unanswerable" for i in want]


def test_faitheval_context_without_markers_is_one_memory():
    assert split_documents("One passage only.") == ("One passage only.",)


def test_clasheval_fixture_from_the_hub_schema(tmp_path):
    rows = [{"question": "Max daily dose of X?", "context_original": "Up to 4 g a day.", "context_mod": f"Up to {g} g a day.",
             "answer_original": "4 g", "answer_mod": f"{g} g", "mod_type": "dose", "dataset": "drugs"} for g in (8, 40)]
    rows.append({**rows[0], "question": "Year of Y?", "context_original": "In 1990.", "context_mod": "In 1990.",
                 "answer_original": "1990", "answer_mod": "1990", "dataset": "dates"})
    items = load_benchmark("clasheval", path=_jsonl(tmp_path / "train.jsonl", rows))
    assert [it.condition for it in items] == ["original", "modified", "modified", "original", "modified"]
    assert items[0].should_adopt and items[1].should_adopt is False and items[1].wrong_answers == ("8 g",)
    assert items[0].group == items[1].group == items[2].group != items[3].group
    assert items[4].should_adopt is True  # the perturbation left the answer as it was
    assert len({it.qid for it in items}) == 5


def test_conflictbank_fixture_from_the_hub_schema(tmp_path):
    row = {"subject": "Q1", "relation": "P19", "question": "Where was Ann born?",
           "options": ["Oslo", "Bergen", "Unsure", "Paris"], "correct_option": "A", "uncertain_option": "C",
           "replace_option": "B", "default_claim": "Ann was born in Oslo.", "default_evidence": "Records: Oslo.",
           "misinformation_conflict_claim": "...", "misinformation_conflict_evidence": "Records: Bergen.",
           "temporal_conflict_claim": "...", "temporal_conflict_evidence": "In 2030 records: Bergen.",
           "semantic_conflict_claim": "...", "semantic_conflict_evidence": "Ann (the ship) was built in Bergen."}
    items = load_benchmark("conflictbank", path=_jsonl(tmp_path / "cb.jsonl", [row]))
    assert [it.condition for it in items] == ["default", "misinformation", "temporal", "semantic", "all"]
    assert items[0].should_adopt and items[0].answers == ("Oslo",) and items[0].wrong_answers == ("Bergen",)
    assert all(it.should_adopt is False for it in items[1:4])
    assert items[4].has_conflict and sorted(items[4].memories) == sorted(it.memories[0] for it in items[:4])
    bad = {k: v for k, v in row.items() if k != "temporal_conflict_evidence"}
    with pytest.raises(DataError, match="line 1: missing field 'temporal_conflict_evidence'"):
        load_benchmark("conflictbank", path=_jsonl(tmp_path / "bad.jsonl", [bad]))


def test_abstentionbench_fixture_from_the_hub_schema(tmp_path):
    _jsonl(tmp_path / "falseqa.jsonl", [
        {"question": "Why is the sun cold?", "reference_answers": None, "should_abstain": True,
         "metadata_json": json.dumps({"source": "falseqa"})},
        {"question": "Why is the sky blue?", "reference_answers": ["Rayleigh scattering"], "should_abstain": False,
         "metadata_json": "{}"}])
    _jsonl(tmp_path / "squad2.jsonl", [
        {"question": "Context: ... Question: who?", "reference_answers": [], "should_abstain": True, "metadata_json": ""}])
    items = load_benchmark("abstentionbench", path=tmp_path)
    assert [(it.meta["subset"], it.should_abstain) for it in items] == [("falseqa", True), ("falseqa", False),
                                                                         ("squad2", True)]
    assert items[1].answers == ("Rayleigh scattering",) and items[0].meta["source"] == "falseqa"
    assert load_benchmark("abstentionbench", path=tmp_path, split="squad2", limit=1) == items[2:]
    _jsonl(tmp_path / "bad.jsonl", [{"question": "q", "should_abstain": "yes"}])
    with pytest.raises(DataError, match=r"bad\.jsonl, line 1: should_abstain: expected bool"):
        load_benchmark("abstentionbench", path=tmp_path / "bad.jsonl")


def test_hub_only_benchmarks_have_a_hub_reader_and_no_local_folder():
    assert set(HUB_BENCHMARKS) == {"clasheval", "faitheval", "conflictbank", "abstentionbench"}
    assert all(BENCHMARKS[n].hub is not None and not BENCHMARKS[n].folder for n in HUB_BENCHMARKS)
    assert all(BENCHMARKS[n].folder == n for n in SHARED_BENCHMARKS)


def test_a_file_where_a_folder_is_expected_is_named(tmp_path):
    with pytest.raises(DataError, match=r"path: .*RAMDocs_test\.jsonl is a file; expected the folder"):
        load_benchmark("ramdocs", path=ROOT / "ramdocs" / "RAMDocs_test.jsonl")


def test_registering_refuses_a_taken_name_and_a_non_spec():
    from mdl_jax.evaluation.datasets import BenchmarkSpec, register_benchmark, unregister_benchmark

    with pytest.raises(ValueError, match="spec.name: 'ramdocs' is already registered"):
        register_benchmark(dataclasses.replace(BENCHMARKS["ramdocs"]))
    with pytest.raises(TypeError, match="spec: expected a BenchmarkSpec"):
        register_benchmark({"name": "x"})
    spec = register_benchmark(BenchmarkSpec("ramdocs_copy", BENCHMARKS["ramdocs"].read, "ramdocs", "MIT", "test"))
    try:
        assert load_benchmark("ramdocs_copy", limit=2) == _load("ramdocs", limit=2)
        assert spec.label_rule == BENCHMARKS["ramdocs"].label_rule
    finally:
        unregister_benchmark("ramdocs_copy")
    assert "ramdocs_copy" not in BENCHMARKS
    with pytest.raises(ValueError, match="name: expected one of"):
        unregister_benchmark("ramdocs_copy")


def test_meta_is_read_only_all_the_way_down():
    it = _load("nomiracl_en", limit=1)[0]
    with pytest.raises(TypeError):
        it.meta["baselines"]["gpt-4-azure"] = "x"
    assert isinstance(it.meta["docids"], tuple)


def _blank_question_file(tmp_path: Path, name: str, field: str = "question") -> tuple[str, Path]:
    """A copy of a shared benchmark file's first two lines, the second line's question whitespace only;
    (benchmark, path to load)."""
    assert ROOT is not None
    src = {"ramdocs": ROOT / "ramdocs" / "RAMDocs_test.jsonl",
           "adarague_llama8b": ROOT / "adarague_llama8b" / "joined" / "nq_test.jsonl"}[name]
    rows = [json.loads(line) for line in src.read_text(encoding="utf-8").split("\n")[:2]]
    rows[1][field] = " \t\n "
    dst = tmp_path / src.relative_to(ROOT / name)
    dst.parent.mkdir(parents=True, exist_ok=True)
    _jsonl(dst, rows)
    return name, tmp_path


@pytest.mark.parametrize("name", ["ramdocs", "adarague_llama8b"])
def test_a_whitespace_only_question_is_a_data_error_naming_file_and_line(tmp_path, name):
    name, path = _blank_question_file(tmp_path, name)
    split = "nq_test" if name == "adarague_llama8b" else None
    with pytest.raises(DataError, match=r"\.jsonl, line 2: question: expected a non-blank string"):
        load_benchmark(name, path=path, split=split)
    assert len(load_benchmark(name, path=path, split=split, limit=1)) >= 1  # the good first line still loads


def test_a_whitespace_only_question_in_a_users_hub_export_names_file_and_line(tmp_path):
    _jsonl(tmp_path / "falseqa.jsonl", [
        {"question": "Why is the sun cold?", "reference_answers": None, "should_abstain": True, "metadata_json": ""},
        {"question": "   ", "reference_answers": None, "should_abstain": True, "metadata_json": ""}])
    with pytest.raises(DataError, match=r"falseqa\.jsonl, line 2: question: expected a non-blank string"):
        load_benchmark("abstentionbench", path=tmp_path / "falseqa.jsonl")
    _jsonl(tmp_path / "unanswerable.jsonl", [{"qid": "q1", "question": "", "context": "c", "answers": []}])
    with pytest.raises(DataError, match=r"unanswerable\.jsonl, line 1: question: expected a non-blank string"):
        load_benchmark("faitheval", path=tmp_path, split="unanswerable")


def test_a_nomiracl_prompt_with_a_blank_question_names_the_record():
    from mdl_jax.evaluation.datasets.shared import parse_nomiracl_prompt

    prompt = "QUESTION:\n  \n\nCONTEXTS:\n[1] T: a passage\n\nOUTPUT:"
    with pytest.raises(DataError, match=r"^f\.jsonl, line 7: prompt: expected a non-blank question"):
        parse_nomiracl_prompt(prompt, 1, "f.jsonl, line 7")
    assert parse_nomiracl_prompt(prompt.replace("  ", "who?"), 1, "w") == ("who?", ("T: a passage",))


def test_a_null_classifier_probability_is_a_data_error_naming_file_and_line(tmp_path):
    src = ROOT / "adarague_llama8b" / "joined" / "nq_test.jsonl"
    row = json.loads(src.read_text(encoding="utf-8").split("\n")[0])
    row.setdefault("extra", {}).setdefault("adaptive_rag_classifier", {})["probas_ABC"] = [0.2, None, 0.5]
    (tmp_path / "joined").mkdir()
    _jsonl(tmp_path / "joined" / "nq_test.jsonl", [row])
    with pytest.raises(DataError, match=r"nq_test\.jsonl, line 1: extra\.adaptive_rag_classifier\.probas_ABC"):
        load_benchmark("adarague_llama8b", path=tmp_path, split="nq_test")


@pytest.mark.slow  # a fresh Python process importing `datasets`
def test_the_paper_sets_offline_without_a_local_copy_are_one_error_naming_where_to_point(tmp_path):
    # The hub really is unreachable (HF_HUB_OFFLINE): what a user without a network and without
    # ../shared/data meets, and the message must tell them what to pass. This checkout has the shared
    # copy beside it, so the lookup is told it found none (a fake for the failure path only).
    import os
    import subprocess
    import sys

    code = ("from mdl_jax.evaluation.datasets import paper_sets\n"
            "from mdl_jax.evaluation.datasets.files import DataError\n"
            "paper_sets.find_local = lambda dataset, data_dir: None\n"
            "try:\n    paper_sets.load('truthfulqa')\n"
            "except DataError as e:\n    print('DataError:', e)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("MDL_JAX_DATA_DIR", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith("DataError: truthfulqa: no local copy") and "--data-dir" in line, line
    assert "MDL_JAX_DATA_DIR" in line and "TruthfulQA.csv" in line, line


def _reader_returning(got):
    def read(path, split=None, limit=None):
        """A user's reader.

        Label rule:
            should_adopt as given.
        """
        return got

    return read


def _mine(qid="q1:a", **kw):
    fields = {"dataset": "mine", "qid": qid, "group": "q1", "question": "Q?", "memories": ("m",),
              "condition": "a", "should_adopt": True, **kw}
    return BenchmarkItem(**fields)


BAD_READS = [
    (None, TypeError, "NoneType;"),
    ("abc", TypeError, "str;"),
    ({"q": 1}, TypeError, "dict;"),
    ([{"qid": "q"}], TypeError, r"items\[0\] of type dict"),
    ([_mine(memories="one memory")], ValueError, r"items\[0\]\.memories = 'one memory'; expected a tuple"),
    ([_mine(memories=("m", 3))], ValueError, r"items\[0\]\.memories"),
    ([_mine(qid=5)], ValueError, r"items\[0\]\.qid = 5; expected a string"),
    ([_mine(should_adopt="yes")], ValueError, r"items\[0\]\.should_adopt = 'yes'; expected True, False or None"),
    ([_mine(has_conflict=0.5)], ValueError, r"items\[0\]\.has_conflict"),
    ([_mine(), _mine()], ValueError, r"items\[1\] with the qid 'q1:a' of items\[0\]"),
]


@pytest.mark.parametrize(("got", "err", "words"), BAD_READS, ids=[w for _, _, w in BAD_READS])
def test_what_a_users_reader_returns_is_checked_naming_the_benchmark_and_the_item(tmp_path, got, err, words):
    from mdl_jax.evaluation.datasets import BenchmarkSpec, register_benchmark, unregister_benchmark

    register_benchmark(BenchmarkSpec("mine_checked", _reader_returning(got), "", "CC0", "test"))
    try:
        with pytest.raises(err, match=rf"benchmark 'mine_checked': its reader returned .*{words}"):
            load_benchmark("mine_checked", path=tmp_path)
        register_benchmark(BenchmarkSpec("mine_checked", _reader_returning(x for x in [_mine()]), "", "CC0",
                                         "test"), replace=True)
        assert load_benchmark("mine_checked", path=tmp_path) == [_mine()]
    finally:
        unregister_benchmark("mine_checked")


def test_a_users_reader_may_give_labels_as_numpy_bools(tmp_path):
    """A reader built on pandas or Parquet gives its labels as np.True_ / np.False_: they are booleans,
    scored as True and False, and were refused as 'no bool'."""
    from mdl_jax.evaluation.datasets import BenchmarkSpec, register_benchmark, unregister_benchmark

    got = [_mine(should_adopt=np.True_, has_conflict=np.False_), _mine("q2:a", should_adopt=np.bool_(False))]
    register_benchmark(BenchmarkSpec("mine_np_bools", _reader_returning(got), "", "CC0", "test"))
    try:
        items = load_benchmark("mine_np_bools", path=tmp_path)
        assert [bool(it.should_adopt) for it in items] == [True, False]
    finally:
        unregister_benchmark("mine_np_bools")
