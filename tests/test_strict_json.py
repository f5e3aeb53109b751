"""``mdl_jax.strict_json``: the one strict-JSON reader. NaN, Infinity and numbers past a double's range
are refused, nesting is bounded whether Python's parser or the walk finds it, and what is not JSON at
all keeps ``json``'s own message; ``mdl-jax gate``'s rows and the servers' bodies say the same thing
for the same text, since both read through it."""

import json

import pytest

from mdl_jax.gate import reading
from mdl_jax.serving import protocol
from mdl_jax.strict_json import DuplicateKeyError, StrictJSONError, loads, loads_unique, nested_deeper


@pytest.mark.parametrize("text, why", [
    ('{"x": NaN}', "NaN is not JSON (strict JSON has no NaN or Infinity)"),
    ('[1, Infinity]', "Infinity is not JSON"),
    ('-Infinity', "-Infinity is not JSON"),
    ('{"x": 1e999}', "the number 1e999 is past a double's range"),
    ('[-1e400]', "the number -1e400 is past a double's range"),
])
def test_nan_infinity_and_numbers_past_a_double_are_refused(text, why):
    with pytest.raises(StrictJSONError, match=why.replace("(", r"\(").replace(")", r"\)")):
        loads(text, max_depth=64)


def test_finite_numbers_and_big_integers_read_as_json_reads_them():
    text = '{"a": 0.1, "b": -0.0, "c": 5e-324, "d": 1.7976931348623157e308, "e": 123456789012345678901234567890}'
    assert repr(loads(text, max_depth=8)) == repr(json.loads(text))


@pytest.mark.parametrize("depth", [1, 2, 63, 64])
def test_nesting_up_to_the_bound_is_read(depth):
    text = "[" * depth + "]" * depth
    assert loads(text, max_depth=64) == json.loads(text)
    assert not nested_deeper(json.loads(text), text, 64)


@pytest.mark.parametrize("text", [
    "[" * 65 + "]" * 65,                                  # found by the walk
    '{"a": ' * 65 + "1" + "}" * 65,                       # objects count as lists do
    "[" * 100_000 + "]" * 100_000,                        # past Python's parser: its RecursionError
])
def test_nesting_past_the_bound_is_refused_whoever_finds_it(text):
    with pytest.raises(StrictJSONError, match="^nested deeper than 64 levels$"):
        loads(text, max_depth=64)


def test_nesting_at_the_bound_is_read_where_the_text_holds_more_brackets_than_the_bound():
    text = '[[["[[[["]]]'   # three levels, seven brackets: the walk runs and finds level 3 allowed
    assert loads(text, max_depth=3) == json.loads(text)


def test_utf8_bytes_count_objects_as_nesting_as_text_does():
    text = '{"a": ' * 65 + "1" + "}" * 65
    assert nested_deeper(json.loads(text), text.encode(), 64) and nested_deeper(json.loads(text), text, 64)


def test_the_bound_is_named_when_the_caller_names_it():
    with pytest.raises(StrictJSONError, match="^nested deeper than MAX_JSON_DEPTH = 3 levels$"):
        loads("[[[[]]]]", max_depth=3, depth_name="MAX_JSON_DEPTH")


def test_brackets_inside_strings_do_not_count_as_nesting():
    text = json.dumps(["[" * 500, {"k": "{" * 500}])
    assert loads(text, max_depth=3) == json.loads(text)


def test_text_that_is_not_json_keeps_jsons_own_error():
    with pytest.raises(json.JSONDecodeError) as e:
        loads("{torn", max_depth=64)
    assert not isinstance(e.value, StrictJSONError)


@pytest.mark.parametrize("blob", [b'{"x": NaN}', b'{"x": 1e999}'])
def test_the_gate_and_the_servers_refuse_the_same_number_in_the_same_words(blob):
    """One definition: a JSONL row and a request body holding the same number get the same reason."""
    with pytest.raises(StrictJSONError) as served:
        protocol.strict_json(blob)
    bad = reading.decode_line(blob + b"\n")
    assert isinstance(bad, reading.Bad)
    assert bad.why == f"not a JSON object ({served.value})"


def test_the_servers_bound_is_their_limit_and_the_gates_its_own():
    deep = b"[" * 65 + b"]" * 65
    with pytest.raises(StrictJSONError, match=f"nested deeper than {protocol.LIMITS.max_json_depth} levels"):
        protocol.strict_json(deep)
    assert protocol.strict_json(deep, max_depth=65) == json.loads(deep)
    assert reading.strict_json(deep.decode()) == json.loads(deep)  # the gate's bound: MAX_JSON_DEPTH = 128
    with pytest.raises(StrictJSONError, match="MAX_JSON_DEPTH = 128"):
        reading.strict_json("[" * 129 + "]" * 129)


def test_a_key_stated_twice_in_one_object_is_named_and_the_same_key_in_two_objects_is_not():
    """The files' reader (config files, data files) refuses what ``json`` would keep the last of."""
    text = '{"a": {"k": 1, "j": 2, "k": 3}, "b": [{"k": 1}, {"k": 2}]}'
    with pytest.raises(DuplicateKeyError, match=r"^k: stated twice in one object") as e:
        loads_unique(text)
    assert e.value.key == "k"
    assert loads_unique('[{"k": 1}, {"k": 2}, {"a": {"k": 3}, "k": 4}]') == json.loads(
        '[{"k": 1}, {"k": 2}, {"a": {"k": 3}, "k": 4}]')
    with pytest.raises(json.JSONDecodeError):
        loads_unique("{torn")


@pytest.mark.parametrize("text", ["\ufeff{}", '{"a": 1}', "[1, 2.5, null]", '"\\ud83d\\ude00"', " 7 ", "{torn", ""])
def test_the_files_reader_reads_and_refuses_what_json_loads_does(text):
    """``loads_unique`` is documented as reading as ``json.loads`` reads: a byte-order mark too, which
    ``json.loads`` names ("Unexpected UTF-8 BOM") and the decoder alone calls "Expecting value"."""
    try:
        want: object = json.loads(text)
    except json.JSONDecodeError as e:
        with pytest.raises(json.JSONDecodeError) as got:
            loads_unique(text)
        assert (got.value.msg, got.value.pos) == (e.msg, e.pos)
    else:
        assert loads_unique(text) == want


@pytest.mark.parametrize("key, shown", [("", "''"), ("a\nb", "'a\\nb'"), (" q", "' q'"),
                                        ("k" * 5000, "'" + "k" * 100 + "'…")])
def test_a_repeated_key_that_would_not_read_plainly_is_quoted_and_a_long_one_cut(key, shown):
    """The key was written as it is: an empty one read ": stated twice", a newline split the one line,
    and a key of megabytes made a message of megabytes."""
    text = json.dumps(key)
    with pytest.raises(DuplicateKeyError) as e:
        loads_unique(f"{{{text}: 1, {text}: 2}}")
    assert str(e.value).startswith(shown + ": stated twice in one object") and e.value.key == key
    assert len(str(e.value)) < 300
