"""Property-based tests (hypothesis) of what the package promises for ANY input.

For every draw of dtypes (float16/32/64, bfloat16, ints, bool, complex, Python scalars), shapes and
values (NaN, ±inf, subnormals, -0.0, 0, 1, 1 ± ulp), configs (valid and invalid fields) and label
types: the result is a valid Decision (Calibration, probabilities) without NaN, or a ValueError /
TypeError whose message starts with the name of an argument that is actually bad. Which arguments are
bad is decided here, by a reference written from the documented rules, never by the implementation.
The records reader and the data loaders are fuzzed with torn, foreign and mis-encoded lines.

Budget: the "ci" profile (tests/conftest.py, the default) runs 25 derandomized examples per test;
HYPOTHESIS_PROFILE=thorough runs 500 fresh ones.
"""

import json
import math
import tempfile
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import example, given  # noqa: E402 - after the importorskip above
from hypothesis import strategies as st  # noqa: E402 - after the importorskip above

from mdl_jax import Calibration, MDLConfig, calibrate, checked_decide, decide, soft_decide  # noqa: E402 - after the importorskip above
from mdl_jax.controller.config import NUMERIC_FIELDS  # noqa: E402 - after the importorskip above
from mdl_repro.pipeline import data, records  # noqa: E402 - after the importorskip above

NAMES = ("M", "R", "A")
F32 = np.float32
VALID_SPECIAL = [0.0, -0.0, 1.0, 0.5, float(np.nextafter(1.0, 0.0)), 5e-324, 1e-45, 1e-8, 1e-39,
                 float(np.nextafter(F32(1), F32(0)))]
INVALID_SPECIAL = [math.nan, math.inf, -math.inf, float(np.nextafter(1.0, 2.0)),
                   float(np.nextafter(F32(1), F32(2))), -1e-45, -5e-324, 2.0, -1.0, 1e30, -1e30]
FLOAT_DTYPES = [np.float16, np.float32, np.float64, jnp.bfloat16]
INT_VALUES = {np.int8: [0, 1, -1, 2, 127], np.int32: [0, 1, -1, 2, 2**31 - 1], np.uint8: [0, 1, 2, 255]}
SHAPES = [(), (0,), (1,), (3,), (2, 3)]


def _unit_floats(valid: bool):
    pool = VALID_SPECIAL if valid else INVALID_SPECIAL
    return st.one_of(st.floats(0.0, 1.0), st.sampled_from(pool)) if valid else st.sampled_from(pool)


# Float kinds are listed more than once: most draws should reach the controller itself.
KINDS = ["py_float", "py_float", *FLOAT_DTYPES, *FLOAT_DTYPES, "py_int", *INT_VALUES, "py_bool", np.bool_,
         np.complex64]


@st.composite
def signals(draw, kinds=KINDS, shapes=SHAPES, valid_weight=3):
    """One signal: a Python scalar or an array of any listed dtype and shape; mostly valid values
    (a valid draw exercises the decision itself), sometimes (1 in valid_weight + 1) one bad element."""
    kind = draw(st.sampled_from(kinds))
    valid = draw(st.sampled_from([True] * valid_weight + [False]))
    if kind == "py_float":
        return draw(_unit_floats(valid))
    if kind == "py_int":
        return draw(st.sampled_from([0, 1] if valid else [-1, 2, 10**20]))
    if kind == "py_bool":
        return draw(st.booleans())
    shape = draw(st.sampled_from(shapes))
    n = int(np.prod(shape))
    if kind in INT_VALUES:
        vals = draw(st.lists(st.sampled_from([0, 1] if valid else INT_VALUES[kind]), min_size=n, max_size=n))
    elif kind is np.bool_:
        vals = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    elif kind is np.complex64:
        vals = [complex(v, draw(st.sampled_from([0.0, 0.5]))) for v in
                draw(st.lists(_unit_floats(True), min_size=n, max_size=n))]
    else:
        vals = draw(st.lists(_unit_floats(True), min_size=n, max_size=n))
        if not valid and n:
            vals[draw(st.integers(0, n - 1))] = draw(_unit_floats(False))
    with np.errstate(over="ignore", under="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.array(vals, dtype=kind).reshape(shape)


@st.composite
def triples(draw, kinds=KINDS, shapes=SHAPES):
    """(M, R, A): one shared shape, each signal sometimes a scalar, rarely a mismatched shape."""
    shape = draw(st.sampled_from(shapes))
    per = [draw(st.sampled_from([[shape]] * 6 + [[()], shapes])) for _ in NAMES]
    return tuple(draw(signals(kinds, sh)) for sh in per)


def _dtype_bad(x) -> bool:
    if isinstance(x, (bool, np.bool_)):
        return True
    if isinstance(x, int) and not -2**31 <= x < 2**31:
        return True  # not representable as a JAX number (int32 without x64): named, never wrapped
    dt = np.asarray(x).dtype
    return dt == np.bool_ or dt.kind == "c"


def _values_bad(x) -> bool:
    f = np.asarray(x).astype(np.float64)
    return bool(np.any(~((f >= 0) & (f <= 1))))


def _as_jax_sees(x) -> np.ndarray:
    """The values as the compiled controller sees them (float64 → float32 without x64)."""
    return np.asarray(jnp.asarray(x)).astype(np.float64)


def _shape_bad(xs) -> set:
    full = [np.shape(x) for x in xs if np.shape(x) != ()]
    if len(set(full)) <= 1:
        return set()
    return {n for n, x in zip(NAMES, xs) if np.shape(x) != ()}


def _broadcast_shape(xs) -> tuple:
    return next((np.shape(x) for x in xs if np.shape(x) != ()), ())


def expected_bad(xs, *, values: bool) -> set:
    """The arguments a correct implementation may name (empty: it must not raise)."""
    bad = {n for n, x in zip(NAMES, xs) if _dtype_bad(x)}
    if values:
        bad |= {n for n, x in zip(NAMES, xs) if not _dtype_bad(x) and _values_bad(x)}
    return bad | _shape_bad(xs)


def _named(err: Exception) -> str:
    return str(err).split(":")[0]


def assert_valid_decision(out, shape):
    assert out.action.shape == shape and out.C_final.shape == shape
    assert out.v_meta.shape == shape + (16,) and out.energies.shape == shape + (3,)
    for name, field in zip(out._fields, out):
        assert not np.any(np.isnan(np.asarray(field, np.float64))), name
    a = np.asarray(out.action)
    assert np.all((a >= 0) & (a <= 3))
    c = np.asarray(out.C, np.float64)
    assert np.all((c >= 0) & (c <= 1))


# --- decide / checked_decide / soft_decide -------------------------------------------------------

@given(triples())
def test_decide_gives_a_nan_free_decision_or_names_a_bad_argument(xs):
    bad = expected_bad(xs, values=True)
    if bad:
        with pytest.raises((ValueError, TypeError)) as e:
            decide(*xs)
        assert _named(e.value) in bad, (str(e.value), bad)
    else:
        assert_valid_decision(decide(*xs), _broadcast_shape(xs))


@given(triples())
def test_unvalidated_decide_checks_dtype_and_shape_and_opts_out_on_nan(xs):
    bad = expected_bad(xs, values=False)
    if bad:
        with pytest.raises((ValueError, TypeError)) as e:
            decide(*xs, validate=False)
        assert _named(e.value) in bad, (str(e.value), bad)
        return
    out = decide(*xs, validate=False)
    shape = _broadcast_shape(xs)
    assert out.action.shape == shape and out.v_meta.shape == shape + (16,)
    nan = np.zeros(shape, bool)
    for x in xs:
        nan = nan | np.isnan(np.broadcast_to(_as_jax_sees(x), shape))
    assert np.all(np.asarray(out.action)[nan] == 3)  # Action.OPT_OUT


_ARRAY_KINDS = [k for k in KINDS if not isinstance(k, str)]


@given(triples(kinds=_ARRAY_KINDS, shapes=[(), (3,), (3, 1), (2, 3)]))
@pytest.mark.slow
def test_decide_inside_a_callers_jit_follows_the_same_dtype_and_shape_rules(xs):
    bad = expected_bad(xs, values=False)
    f = jax.jit(lambda m, r, a: decide(m, r, a))
    if bad:
        with pytest.raises((ValueError, TypeError)) as e:
            f(*xs)
        assert _named(e.value) in bad, (str(e.value), bad)
    elif not any(_values_bad(_as_jax_sees(x)) for x in xs):
        assert_valid_decision(f(*xs), _broadcast_shape(xs))


@given(triples())
def test_checked_decide_reports_the_first_bad_argument_or_a_nan_free_decision(xs):
    bad = expected_bad(xs, values=False)
    if bad:
        with pytest.raises((ValueError, TypeError)) as e:
            checked_decide(*xs)
        assert _named(e.value) in bad, (str(e.value), bad)
        return
    err, out = checked_decide(*xs)
    value_bad = [n for n, x in zip(NAMES, xs) if _values_bad(_as_jax_sees(x))]
    if value_bad:
        assert err.get() is not None and err.get().startswith(f"{value_bad[0]}: expected"), err.get()
    else:
        assert err.get() is None, err.get()
        assert_valid_decision(out, _broadcast_shape(xs))


TEMPERATURES = [0.02, 0.5, 1.0, 1e-3] * 3 + [0.0, -0.1, math.nan, math.inf, -math.inf]


@given(triples(), st.sampled_from(TEMPERATURES))
def test_soft_decide_gives_a_distribution_or_names_a_bad_argument(xs, t):
    bad = expected_bad(xs, values=True) | ({"temperature"} if not (math.isfinite(t) and t > 0) else set())
    if bad:
        with pytest.raises((ValueError, TypeError)) as e:
            soft_decide(*xs, temperature=t)
        assert _named(e.value) in bad, (str(e.value), bad)
        return
    out = soft_decide(*xs, temperature=t)
    p = np.asarray(out, np.float64)
    assert p.shape == _broadcast_shape(xs) + (4,)
    assert np.all(np.isfinite(p))
    tol = 1e-2 if out.dtype.itemsize < 4 else 1e-5  # float16 / bfloat16 round the differences
    assert np.all(p >= -tol) and np.allclose(p.sum(-1), 1.0, atol=tol)


# --- calibrate -----------------------------------------------------------------------------------

LABEL_KINDS = ["bool", "int", "float", "scalar", "half", "nan", "complex", "text", "short"]


@st.composite
def calibration_split(draw):
    n = draw(st.sampled_from([0, 1, 2, 5, 5, 5, 5, 5]))
    sig = [draw(signals(kinds=["py_float", np.float16, np.float32, np.float32, np.float64, jnp.bfloat16, np.int32],
                        shapes=[(n,)] * 9 + [()], valid_weight=12)) for _ in range(3)]
    kind = draw(st.sampled_from(["bool", "int", "float"] * 2 + LABEL_KINDS))
    y = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
    labels = {"bool": y, "int": y.astype(np.int64), "float": y.astype(np.float32), "scalar": 1,
              "half": np.where(y, 1.0, 0.5), "nan": np.where(y, 1.0, np.nan), "complex": y.astype(np.complex64),
              "text": np.where(y, "yes", "no"), "short": y[:-1]}[kind]
    return sig, labels


def _labels_bad(y) -> bool:
    arr = np.asarray(y)
    if arr.dtype == np.bool_:
        return False
    if arr.dtype.kind not in "iuf":
        return True
    return bool(np.any((arr != 0) & (arr != 1)))


_SPLIT = tuple(np.linspace(0.1, 0.9, 5, dtype=F32) for _ in NAMES)


# Always run, whatever the budget: valid signals with each kind of bad label.
@example(split=(_SPLIT, np.array([1, 0, 0.5, 1, 0])))
@example(split=(_SPLIT, np.array([1, 0, np.nan, 1, 0])))
@example(split=(_SPLIT, np.ones(5, np.complex64)))
@example(split=(_SPLIT, 1))
@example(split=(_SPLIT, np.array([True, False, True, True, False])))
@given(calibration_split())
def test_calibrate_gives_ordered_thresholds_or_names_a_bad_argument(split):
    (M, R, A), y = split
    xs = (M, R, A, y)
    names = ("M", "R", "A", "adopt")
    bad = {n for n, x in zip(names[:3], xs) if _dtype_bad(x) or _values_bad(x)}
    bad |= {"adopt"} if _labels_bad(y) else set()
    not_1d = {n for n, x in zip(names, xs) if np.ndim(x) != 1}
    bad |= not_1d
    if not not_1d and len({np.shape(x) for x in xs}) > 1:
        bad |= {n for n, x in zip(names, xs) if np.shape(x) != np.shape(M)}
    if np.shape(M) in ((0,), (1,)):
        bad |= {"M"}
    if bad:
        with pytest.raises((ValueError, TypeError)) as e:
            calibrate(M, R, A, y, grid_size=101)
        assert _named(e.value) in bad, (str(e.value), bad)
        return
    cal = calibrate(M, R, A, y, grid_size=101)
    assert isinstance(cal, Calibration)
    th = cal.config.thresholds
    assert all(math.isfinite(t) and 0 <= t <= 1 for t in th) and th[0] >= th[1] >= th[2]
    assert math.isfinite(cal.config.n_min) and cal.config.n_max > cal.config.n_min
    assert 0 <= cal.best_agreement <= 1 and cal.best_agreement == float(np.max(cal.agreement))


# --- MDLConfig -----------------------------------------------------------------------------------

NAN, INF = math.nan, math.inf
FIELD_VALUES = {
    "sigma": [0.2, 0.05, 1.0, 3.0, F32(0.1), 0.0, -0.1, NAN, INF, "0.2", True, None],
    "eps_c": [0.1, 0.0, 0.05, 0.3, 0.6, -0.1, NAN, -INF, 1j],
    "gains": [(1.0, 0.7, 0.5), (0.5, 0.5, 0.5), (2.0, 1.0, 0.4), (0.0, 0.0, 0.0), np.array([1.0, 0.7, 0.5]),
              (1.0, -0.7, 0.5), (NAN, 0.7, 0.5), (1.0, 0.7), ("1", "0.7", "0.5")],
    "g_A_coeffs": [(0.5, 0.5), (0.0, 1.0), (-1.0, 2.0), (0.5, NAN), (0.5,)],
    "gate_coeffs": [(0.3, 0.7), (1.0, 0.0), (0.0, 0.0), (INF, 0.7), (True, False)],
    "thresholds": [(0.6, 0.4, 0.2), (1.0, 1.0, 1.0), (0.0, 0.0, 0.0), (0.9, 0.5, 0.0), np.array([0.7, 0.3, 0.1]),
                   (0.2, 0.4, 0.6), (1.2, 0.4, 0.2), (0.6, 0.4, -0.1), (0.6, NAN, 0.2), (0.6, 0.4)],
    "bias": [0.0, -3.0, 0.5, "vector", NAN, INF, None],
    "n_min": [1.25, 0.0, -1.0, 2.0, NAN, -INF],
    "n_max": [3.28, 4.0, 1.5, 2.0, INF, NAN],
}
# valid structures first: they are drawn far more often (see config_kwargs), so the numeric rules
# are reached in most draws
STRUCTURE = [(16, (5, 5, 6)), (16, (4, 7, 5)), (8, (2, 3, 3))]
BAD_STRUCTURE = [(16, [5, 5, 6]), (16, (5, 5, 5)), (16, (0, 10, 6)), (0, (5, 5, 6)), (True, (5, 5, 6))]
SEEDS = [42, 0, 7]
BAD_SEEDS = [-1, 1.5, True]


def _real(v):
    """The reference's reading of a numeric field: a float64 array, or None if not real numbers."""
    try:
        arr = np.asarray(v)
    except (TypeError, ValueError):
        return None
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iuf":
        return None
    return arr.astype(np.float64)


def _is_int(x):
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def config_violations(kw: dict) -> set:
    """The documented domain of every field (MDLConfig's docstring), re-stated."""
    D, dims, seed = kw["D"], kw["dims"], kw["qr_seed"]
    if not (_is_int(D) and D > 0):
        return {"D"}
    bad = set()
    if not (isinstance(dims, tuple) and len(dims) == 3 and all(_is_int(d) and d > 0 for d in dims)
            and sum(dims) == D):
        bad.add("dims")
    if not (_is_int(seed) and seed >= 0):
        bad.add("qr_seed")
    v = {}
    for f in NUMERIC_FIELDS:
        arr = _real(kw[f])
        size = {"gains": 3, "thresholds": 3, "g_A_coeffs": 2, "gate_coeffs": 2}.get(f)
        if arr is None or (size and arr.shape[-1:] != (size,)) or not np.all(np.isfinite(arr)):
            bad.add(f)
        else:
            v[f] = arr
    rules = [
        ({"sigma"}, lambda: np.all(v["sigma"] > 0)),
        ({"gains"}, lambda: np.all(v["gains"] >= 0)),
        ({"eps_c"}, lambda: np.all(v["eps_c"] >= 0)),
        ({"eps_c", "gains"}, lambda: np.all((v["eps_c"] == 0) | (v["eps_c"] < v["gains"].min(-1)))),
        ({"thresholds"}, lambda: np.all((v["thresholds"] >= 0) & (v["thresholds"] <= 1))
         and np.all(np.diff(v["thresholds"], axis=-1) <= 0)),
        ({"n_min", "n_max"}, lambda: np.all(v["n_max"] > v["n_min"])),
    ]
    for fields, holds in rules:
        if all(f in v for f in fields) and not holds():
            bad |= fields
    return bad


@st.composite
def config_kwargs(draw):
    D, dims = draw(st.sampled_from(STRUCTURE * 6 + BAD_STRUCTURE))
    kw = {"D": D, "dims": dims, "qr_seed": draw(st.sampled_from(SEEDS * 6 + BAD_SEEDS))}
    base = MDLConfig()
    for f in NUMERIC_FIELDS:
        # most fields keep their default, so a draw usually breaks at most one rule
        v = draw(st.sampled_from(FIELD_VALUES[f])) if draw(st.integers(0, 3)) == 0 else getattr(base, f)
        kw[f] = np.linspace(-0.2, 0.2, D if _is_int(D) else 16) if isinstance(v, str) and v == "vector" else v
    return kw


GRID = np.array(np.meshgrid(*[[0.0, 0.5, 1.0]] * 3, indexing="ij"), F32).reshape(3, -1)


@given(config_kwargs())
def test_config_is_valid_and_nan_free_or_names_an_offending_field(kw):
    bad = config_violations(kw)
    if bad:
        with pytest.raises(ValueError) as e:
            MDLConfig(**kw)
        assert _named(e.value) in bad, (str(e.value), bad)
        return
    cfg = MDLConfig(**kw)
    out = decide(*GRID, cfg)
    for name, field in zip(out._fields, out):
        assert np.all(np.isfinite(np.asarray(field))), name


@given(st.sampled_from(["sigma", "eps_c", "n_max", "bias"]), st.integers(1, 4), st.data())
def test_batched_config_names_the_field_and_the_first_bad_config(field, K, draws):
    pool = {"sigma": [0.2, 0.1, 0.0, NAN], "eps_c": [0.1, 0.0, 0.6, -0.1], "n_max": [3.28, 2.0, 1.0, INF],
            "bias": [0.0, 0.3, NAN, -INF]}[field]
    vals = np.array(draws.draw(st.lists(st.sampled_from(pool), min_size=K, max_size=K)))
    defaults = {f: getattr(MDLConfig(), f) for f in NUMERIC_FIELDS}
    per_config = [config_violations({**defaults, "D": 16, "dims": (5, 5, 6), "qr_seed": 42, field: v})
                  for v in vals]
    bad_at = [k for k, b in enumerate(per_config) if b]
    if bad_at:
        with pytest.raises(ValueError, match=rf"^{field}: ") as e:
            MDLConfig(**{field: vals})
        assert f"index ({bad_at[0]},)" in str(e.value), str(e.value)  # the first bad config, any reason
    else:
        MDLConfig(**{field: vals})


# --- records and data loaders: torn, foreign and mis-encoded lines -------------------------------

FOREIGN = [b"null", b"[1, 2]", b"3", b"-1e999", b'"text"', b"true", b'{"a": 1}', b'{"dataset": "x"}',
           b'{"dataset": [1], "qid": 1, "seed": 0, "system": "B3"}', (b'{"dataset": "t", "qid": {}, "seed": 0, '
                                                                     b'"system": "B3"}'), "{\"dataset\": \"é\"}".encode("latin-1"), b"\xff\xfe\xfd", b"{\"qid\": 1,"]

record_st = st.fixed_dictionaries({
    "dataset": st.sampled_from(["truthfulqa", "halueval"]), "qid": st.integers(0, 5),
    "seed": st.integers(0, 2), "system": st.sampled_from(["B1", "B3", "MDL"]),
    "answer": st.text(max_size=8), "failed": st.booleans()})


@given(st.lists(record_st, max_size=6), st.lists(st.one_of(st.sampled_from(FOREIGN), st.binary(max_size=12)),
                                                  max_size=4), st.data())
def test_records_load_never_raises_and_keeps_every_complete_record(recs, foreign, draws):
    lines = [json.dumps(r, sort_keys=True, ensure_ascii=False).encode() for r in recs]
    junk = [b.replace(b"\n", b" ") for b in foreign]
    body = lines + junk
    order = draws.draw(st.permutations(range(len(body))))
    blob = b"".join(body[i] + b"\n" for i in order)
    tear = draws.draw(st.integers(0, len(blob)))  # may fall inside a multi-byte character
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "records.jsonl"
        p.write_bytes(blob[:tear])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the skip warning is the point
            got = records.load(p)
    complete = [recs[i] for i in order[:] if i < len(recs)
                and blob.find(lines[i] + b"\n") + len(lines[i]) + 1 <= tear]
    for r in complete:
        k = records.key(r)
        assert k in got
        best = [x for x in recs if records.key(x) == k]
        assert got[k].get("failed") is False or all(x.get("failed") for x in best if x in complete)
    assert set(got) <= {records.key(r) for r in recs}


HALU_LINE = {"knowledge": "k é", "question": "q?", "right_answer": "r", "hallucinated_answer": "h"}
TQA = ("Type,Category,Question,Best Answer,Correct Answers,Incorrect Answers,Source\n"
       "Adversarial,Misconceptions,Q1?,B,C1; C2,I1,S\n"
       'Adversarial,Misc,"Q2, quoted?",B,C,"I1; I2",S\n')


def _mutate(draw, blob: bytes, kind: str) -> bytes:
    pos = draw(st.integers(0, len(blob)))
    if kind == "tear":
        return blob[:pos]
    if kind == "insert":
        extra = draw(st.one_of(st.binary(max_size=8), st.sampled_from(FOREIGN + [b"\n", b",", b'"'])))
        return blob[:pos] + extra + blob[pos:]
    if kind == "latin1":
        return blob.decode("utf-8").encode("latin-1", errors="replace")
    if kind == "header":
        first = blob.split(b"\n", 1)[0] + b"\n"
        return blob + first
    if kind == "field" and blob.startswith(b"{"):  # JSONL: a null / number / list / blank value
        rec = json.loads(blob.split(b"\n", 1)[0])
        rec[draw(st.sampled_from(sorted(rec)))] = draw(st.sampled_from([None, 3, 1.5, [], ["x", 1], "", "  ", {}]))
        return json.dumps(rec).encode() + b"\n" + blob.split(b"\n", 1)[1]
    if kind == "field":  # CSV: a blank field in the first data row
        head, row, rest = blob.split(b"\n", 2)
        cells = row.split(b",")
        cells[draw(st.integers(0, len(cells) - 1))] = draw(st.sampled_from([b"", b"  "]))
        return b"\n".join([head, b",".join(cells), rest])
    return blob


@given(st.sampled_from(["tear", "insert", "insert", "latin1", "header", "field", "field", "none"]),
       st.sampled_from(["halueval", "truthfulqa"]), st.data())
def test_data_loaders_load_items_or_raise_a_data_error_naming_the_file(kind, ds, draws):
    name = "halueval_qa.jsonl" if ds == "halueval" else "TruthfulQA.csv"
    good = (json.dumps(HALU_LINE, ensure_ascii=False) + "\n") * 2 if ds == "halueval" else TQA
    blob = _mutate(draws.draw, good.encode(), kind)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / name).write_bytes(blob)
        try:
            items = data.load(ds, d)
        except data.DataError as e:
            assert str(e).startswith(str(Path(d) / name)), str(e)
            assert "\n" not in str(e)
            return
    assert items and all(it.question and it.correct and all(it.correct) for it in items)
    if ds == "truthfulqa":
        assert all(it.category for it in items)
    if kind == "none":
        assert len(items) == 2
