"""``mdl-jax gate``'s JSONL reading: a line decodes to what ``json`` gives, orjson or not (the same
value, the same types, the same message for a bad line); the part reader yields the row reader's rows,
cut at the part boundaries, from any part; a run resumed without ``--chunk-size`` keeps the size its
parts were cut at.

Every run uses ``tests.gate_embedders:hashed`` (deterministic vectors, no model to load)."""

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mdl_jax.cli import main
from mdl_jax.gate import files, reading

EMBED = ["--embedder", "tests.gate_embedders:hashed", "--no-progress"]

TRICKY = [
    b'{"query": "q", "memories": ["a", "b"]}\n',
    b'{"n": 12345678901234567890}\n',             # past 64 bits: json keeps the int, orjson a float
    b'{"n": -9223372036854775809}\n',
    b'{"n": 9223372036854775807, "m": 1e400}\n',  # int64's max; a float past double's range: inf
    b'{"x": NaN, "y": -Infinity}\n',              # json reads them, orjson refuses
    b'{"s": "\\ud800"}\n',                         # a lone surrogate: a bad row, named
    b'{"s": "\\ud83d\\ude00 caf\\u00e9"}\n',       # a surrogate pair and an escape: text
    b'{"a": 1, "a": 2}\n',                         # the last duplicate wins in both
    b'\xef\xbb\xbf{"bom": 1}\n',                   # a byte-order mark
    b'{"bad": \xff}\n',                            # not UTF-8
    b'{torn\n',
    b'[1, 2.5, "x", null, true]\n',                # not an object: parse_row says so later
    b'"just a string"\n',
    b'{"deep": ' + b'[' * 600 + b']' * 600 + b'}\n',
    b'{"deep": ' + b'{"a": ' * 200 + b'1' + b'}' * 200 + b'}\n',   # objects nest as lists do
    b'{"f": 0.1, "g": 1.0, "h": -0.0, "i": 5e-324}\n',
]


def _as_json_alone(raw, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(reading, "orjson", None)
        return reading.decode_line(raw)


def _same(a, b) -> bool:
    if isinstance(a, reading.Bad) or isinstance(b, reading.Bad):
        return isinstance(a, reading.Bad) and isinstance(b, reading.Bad) and a.why == b.why
    return repr(a) == repr(b)  # repr tells 1 from 1.0 and True from 1, and shows nan


@pytest.mark.parametrize("raw", TRICKY, ids=range(len(TRICKY)))
def test_a_line_decodes_to_what_json_alone_gives(raw, monkeypatch):
    got, want = reading.decode_line(raw), _as_json_alone(raw, monkeypatch)
    assert _same(got, want), (raw[:80], got, want)


def test_orjson_is_the_parser_in_use_where_installed():
    pytest.importorskip("orjson")
    assert reading.orjson is not None  # else the test above compares json with itself


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12)


@given(value=st.dictionaries(st.text(max_size=8), json_values, max_size=5), ascii_only=st.booleans())
def test_any_json_object_decodes_to_what_json_alone_gives(value, ascii_only):
    raw = (json.dumps(value, ensure_ascii=ascii_only) + "\n").encode("utf-8", "surrogatepass")
    got = reading.decode_line(raw)
    orjson, reading.orjson = reading.orjson, None
    try:
        want = reading.decode_line(raw)
    finally:
        reading.orjson = orjson
    assert _same(got, want)


def _rows_of(reader):
    return [(i, w, v.why if isinstance(v, reading.Bad) else repr(v)) for i, v, w in reader]


@pytest.mark.parametrize("C", [1, 2, 3, 7])
def test_the_parts_hold_the_row_readers_rows_cut_at_part_boundaries_from_any_part(tmp_path, C):
    lines = [b'{"i": %d}\n' % i if i % 4 else b'   \n' for i in range(11)]  # blank lines counted
    lines[5] = b"{torn\n"
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(lines) + b'{"last": "no newline"}')
    n_parts = -(-12 // C)
    for k in range(n_parts + 1):
        parts = list(reading.jsonl_parts(path, k, C))
        assert len(parts) == n_parts - k  # a part of blank lines only is still a part (it stays empty)
        for j, part in enumerate(parts):
            assert all((k + j) * C <= i < (k + j + 1) * C for i, _, _ in part)
        flat = [r for part in parts for r in part]
        assert _rows_of(flat) == _rows_of(reading.read_jsonl(path, k * C))


def _rows(n):
    return [{"id": i, "query": f"is thing {i} safe?",
             "memories": [f"thing {i} is safe", f"thing {i} is not safe", f"thing {i} is blue"]}
            for i in range(n)]


def test_a_run_resumed_without_chunk_size_keeps_the_size_its_parts_were_cut_at(tmp_path, monkeypatch):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in _rows(9)))
    ref, out = tmp_path / "ref.jsonl", tmp_path / "out.jsonl"
    assert main(["gate", str(src), "--out", str(ref), "--chunk-size", "2", *EMBED]) == 0
    decide, calls = files._decide_chunk, []

    def dies_on_the_third_part(*a):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # a Ctrl-C mid-run: the two parts on disk stay for the rerun
        return decide(*a)

    monkeypatch.setattr(files, "_decide_chunk", dies_on_the_third_part)
    with pytest.raises(KeyboardInterrupt):
        main(["gate", str(src), "--out", str(out), "--chunk-size", "2", *EMBED])
    manifest = json.loads(Path(f"{out}.parts/manifest.json").read_text())
    assert len(manifest["parts"]) == 2 and manifest["args"]["chunk_size"] == 2
    monkeypatch.setattr(files, "_decide_chunk", decide)
    assert main(["gate", str(src), "--out", str(out), *EMBED]) == 0  # no --chunk-size: resumes at 2
    assert out.read_text() == ref.read_text()


def test_a_new_run_without_chunk_size_cuts_parts_of_CHUNK_SIZE(tmp_path, monkeypatch):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in _rows(5)))
    seen = []
    parts = files.jsonl_parts
    monkeypatch.setattr(files, "jsonl_parts", lambda p, k, C: (seen.append(C), parts(p, k, C))[1])
    assert main(["gate", str(src), "--out", str(tmp_path / "o.parquet"), *EMBED]) == 0
    assert seen == [files.CHUNK_SIZE]


@pytest.mark.parametrize("row, why", [
    ({"query": "\u3000 ", "memories": ["a"]}, "field 'query'"),            # Unicode blank: not a query
    ({"query": "q", "memories": ["a", "\u00a0"]}, "field 'memories'[1]"),   # a blank memory
    ({"query": "q", "memories": ["a", 3]}, "field 'memories'[1]"),
    ({"query": "q", "memories": "a"}, "field 'memories'"),
    ({"query": "", "memories": []}, "field 'query'"),
    ({"memories": ["a"]}, "field 'query': missing"),
])
def test_a_bad_row_is_refused_by_the_common_rows_fast_path_too(row, why):
    args = files.RowFields(query_field="query", memories_field="memories", category_field=None,
                           risk_field=None, kind="jsonl")
    with pytest.raises(files.GateInputError, match=why.replace("[", r"\[").replace("]", r"\]")):
        files.parse_row(row, args)


def test_the_common_rows_fast_path_returns_what_the_general_path_does():
    row = {"query": "is it safe?", "memories": ["it is safe", {"text": "it is not"}], "cat": "Health"}
    plain = {"query": "is it safe?", "memories": ["it is safe", "it is not"]}
    fast = files.RowFields(query_field="query", memories_field="memories", category_field=None,
                           risk_field=None, kind="jsonl")
    general = dataclasses.replace(fast, category_field="cat")
    assert files.parse_row(plain, fast) == ("is it safe?", ["it is safe", "it is not"], None, None)
    assert files.parse_row(row, general) == ("is it safe?", ["it is safe", "it is not"], "Health", None)
    assert files.parse_row(row, fast) == ("is it safe?", ["it is safe", "it is not"], None, None)


def test_a_line_of_exactly_max_line_bytes_is_read_and_one_byte_more_is_a_bad_row(tmp_path, monkeypatch):
    monkeypatch.setattr(reading, "MAX_LINE_BYTES", 64)
    ok, too = (json.dumps({"query": "q", "memories": ["x" * k]}) for k in (32, 33))
    assert (len(ok), len(too)) == (64, 65)
    path = tmp_path / "in.jsonl"
    path.write_text(f"{ok}\n{too}\n{ok}\n")
    rows = list(reading.read_jsonl(path, 0))
    assert [(i, w) for i, _, w in rows] == [(0, "line 1"), (1, "line 2"), (2, "line 3")]
    assert rows[0][1] == rows[2][1] == json.loads(ok)
    assert isinstance(rows[1][1], reading.Bad) and "longer than MAX_LINE_BYTES = 64 bytes" in rows[1][1].why


def test_a_csv_rows_risk_cell_is_read_as_a_number():
    from mdl_jax.gate.job import RowFields

    fields = RowFields(query_field="query", memories_field="memories", category_field=None,
                               risk_field="risk", kind="csv")
    assert reading.parse_row({"query": "q", "memories": '["a"]', "risk": "0.25"}, fields) == ("q", ["a"], None, 0.25)


def test_a_blank_line_is_counted_but_is_no_row(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"query": "a"}\n\n   \n{"query": "b"}\n')
    assert [(i, v, w) for i, v, w in reading.read_jsonl(path, 0)] == [
        (0, {"query": "a"}, "line 1"), (3, {"query": "b"}, "line 4")]
