"""Config files that cannot lie: what a file says is the config decide runs, or an error
naming the file and the field."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from mdl_jax import MDLConfig, decide, load_config, save_config
from mdl_jax.controller.config_file import MAX_BYTES, ConfigFileError, config_to_dict

ROOT = Path(__file__).resolve().parents[1]
M, R, A = np.random.default_rng(3).uniform(size=(3, 64)).astype(np.float32)


def _write(path: Path, d: dict) -> Path:
    path.write_text(json.dumps(d))
    return path


def test_cache_follows_content_when_a_same_size_file_keeps_its_mtime(tmp_path):
    # cp -p / rsync -t / tar x: other content, same size, same mtime. The config decide runs must be
    # the file's current content, not a cached parse of the old one.
    a = save_config(MDLConfig(thresholds=(0.7, 0.5, 0.3)), tmp_path / "a.json")
    b = save_config(MDLConfig(thresholds=(0.3, 0.2, 0.1)), tmp_path / "b.json")
    assert a.stat().st_size == b.stat().st_size
    target = tmp_path / "cfg.json"
    shutil.copy2(a, target)
    first = np.asarray(decide(M, R, A, target).action)
    st = target.stat()
    shutil.copy2(b, target)                                        # cp -p
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))          # mtime kept exactly
    assert target.stat().st_mtime_ns == st.st_mtime_ns and target.stat().st_size == st.st_size
    now = np.asarray(decide(M, R, A, target).action)
    np.testing.assert_array_equal(now, np.asarray(decide(M, R, A, load_config(b)).action))
    assert not np.array_equal(first, now)


@pytest.mark.parametrize("kind", ["dev_zero_link", "fifo", "directory", "too_large"])
def test_a_path_that_is_not_a_small_regular_file_is_refused_without_reading_it(tmp_path, kind):
    path = tmp_path / "c.json"
    if kind == "dev_zero_link":
        os.symlink("/dev/zero", path)           # would be read until memory runs out
        want = "not a regular file (a character device)"
    elif kind == "fifo":
        os.mkfifo(path)                         # would block forever waiting for a writer
        want = "not a regular file (a FIFO)"
    elif kind == "directory":
        path.mkdir()
        want = "not a regular file (a directory)"
    else:
        path.write_bytes(b" " * (MAX_BYTES + 1))
        want = f"a config file is at most {MAX_BYTES} bytes"
    result = {}

    def call():
        try:
            decide(0.5, 0.5, 0.5, path)
        except ConfigFileError as e:
            result["error"] = str(e)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "decide blocked on the path"
    assert result["error"].startswith(str(path)) and want in result["error"]
    with pytest.raises(ConfigFileError, match="not a regular file|at most"):
        load_config(path)


def _full() -> dict:
    return config_to_dict(MDLConfig(thresholds=(0.7, 0.5, 0.3)))


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["numeric"].pop("sigma"), r"numeric\.sigma: missing \(state it, or list it in \"defaults\""),
    (lambda d: d["static"].pop("qr_seed"), r"static\.qr_seed: missing"),
    (lambda d: d.pop("static"), r"static: expected an object"),
    (lambda d: d.__setitem__("sigma", d["numeric"].pop("sigma")), r"sigma: misplaced at the top level; it belongs under \"numeric\""),
    (lambda d: d["static"].__setitem__("sigma", d["numeric"].pop("sigma")), r"static\.sigma: misplaced; sigma belongs under \"numeric\""),
    (lambda d: d["numeric"].__setitem__("D", 16), r"numeric\.D: misplaced; D belongs under \"static\""),
    (lambda d: d.__setitem__("colour", 1), r"colour: not a key of a config file"),
    (lambda d: d.__setitem__("defaults", ["sigma"]), r"numeric\.sigma: stated and also listed in \"defaults\""),
    (lambda d: d.__setitem__("defaults", ["colour"]), r"defaults: colour: not a field"),
    (lambda d: d["numeric"].__setitem__("sigma", [0.2]), r"numeric\.sigma: expected a number, got \[0\.2\]"),
    (lambda d: d["numeric"].__setitem__("bias", [0.0] * 5), r"numeric\.bias: expected a number or a list of D=16 numbers"),
    (lambda d: d["numeric"].__setitem__("gains", [1.0, 0.7]), r"numeric\.gains: expected a list of 3 numbers"),
    (lambda d: d["numeric"].__setitem__("gate_coeffs", [[0.3, 0.7]]), r"numeric\.gate_coeffs: expected a list of 2 numbers"),
    (lambda d: d["numeric"].__setitem__("n_min", True), r"numeric\.n_min: expected a number, got true"),
    (lambda d: d["numeric"].__setitem__("gains", json.loads("[" * 5000 + "]" * 5000)), r"numeric\.gains: nested deeper than"),
    (lambda d: d["static"].__setitem__("dims", [5, 5, "6"]), r"static\.dims: expected a list of 3 ints"),
])
def test_a_file_that_does_not_state_the_config_exactly_is_an_error_naming_file_and_field(tmp_path, edit, match):
    d = _full()
    try:
        edit(d)
        text = json.dumps(d)
    except RecursionError:  # json.dumps cannot write it either: build the text by hand
        text = json.dumps(_full()).replace('"gains": [1.0, 0.7, 0.5]', '"gains": ' + "[" * 5000 + "]" * 5000)
    path = tmp_path / "c.json"
    path.write_text(text)
    for load in (load_config, lambda p: decide(M, R, A, p)):
        with pytest.raises(ConfigFileError, match=match) as e:
            load(path)
        assert str(e.value).startswith(str(path) + ": ")


def test_listed_defaults_are_the_paper_defaults_and_nothing_else(tmp_path):
    d = _full()
    for f in ("sigma", "bias"):
        d["numeric"].pop(f)
    d["static"] = {}
    d["defaults"] = ["sigma", "bias", *MDLConfig.__dataclass_fields__.keys() - set(_full()["numeric"])]
    cfg = load_config(_write(tmp_path / "c.json", d))
    assert cfg == MDLConfig(thresholds=(0.7, 0.5, 0.3))


def test_shipped_and_committed_config_files_load_to_the_configs_they_state():
    files = sorted(glob.glob(str(ROOT / "repro/mdl_repro/pipeline/resources/calibrated/*.json"))
                   + glob.glob(str(ROOT / "experiments/results/*/tuned/tuned-*.json")))
    assert len(files) >= 2
    for f in files:
        d = json.loads(Path(f).read_text())
        cfg = load_config(f)
        out = config_to_dict(cfg)
        assert out["numeric"] == d["numeric"] and out["static"] == d["static"], f


def test_save_config_then_load_config_round_trips_every_field(tmp_path):
    cfg = MDLConfig(sigma=0.15, eps_c=0.0, gains=(1.0, 0.0, 0.5), bias=tuple(np.linspace(-0.1, 0.1, 16)),
                    thresholds=(1.0, 0.5, 0.0), risk_inversion=False, subspaces="identity", qr_seed=7)
    back = load_config(save_config(cfg, tmp_path / "c.json"))
    assert dataclasses.asdict(back) == dataclasses.asdict(cfg)


def test_decide_rejects_a_config_batch_or_a_bias_of_the_wrong_length_naming_the_field():
    # A (5,) bias is a batch of five scalar biases to sweep, not one config: decide says so instead of
    # failing inside the controller with a broadcasting error.
    for cfg, field in ((MDLConfig(bias=(0.0,) * 5), "bias"), (MDLConfig(sigma=np.array([0.2])), "sigma")):
        with pytest.raises(ValueError, match=rf"^config\.{field}: expected one config's value"):
            decide(M, R, A, cfg)
    decide(M, R, A, MDLConfig(bias=(0.1,) * 16))  # one per component of v_meta is one config


def test_save_config_writes_nothing_that_load_config_would_refuse(tmp_path):
    from mdl_jax.controller.config_file import MAX_D

    for cfg, match in ((MDLConfig(bias=(0.1, 0.2)), r"^bias: expected a single config's shape, one of \[\(\), \(16,\)\]"),
                       (MDLConfig(D=MAX_D + 4, dims=(MAX_D // 2, MAX_D // 2, 4)), rf"^D: a config file holds D ≤ {MAX_D}")):
        with pytest.raises(ValueError, match=match):
            save_config(cfg, tmp_path / "c.json")
        assert not (tmp_path / "c.json").exists()
    big = MDLConfig(D=MAX_D, dims=(MAX_D // 2, MAX_D // 4, MAX_D // 4))   # the largest a file holds round-trips
    assert load_config(save_config(big, tmp_path / "big.json")) == big
    for cfg, note, err, match in ((MDLConfig(), 123, TypeError, r"^note: expected a string or None, got int"),
                                  (MDLConfig(), "x" * 2**20, ValueError, r"^save_config: not written, load_config would refuse"),
                                  (MDLConfig(qr_seed=10**900), None, ValueError, r"^save_config: .* a number of 901 characters")):
        with pytest.raises(err, match=match):
            save_config(cfg, tmp_path / "c.json", note=note)
        assert not (tmp_path / "c.json").exists()
    for folder in ("", ".", tmp_path):   # a folder is no file name: named, not an unnamed EBUSY from the rename
        with pytest.raises(OSError, match=r"^cannot write '.*': a folder; expected a file name$"):
            save_config(MDLConfig(), folder)
    with pytest.raises(TypeError, match=r"^path: expected a file path, got int$"):
        save_config(MDLConfig(), 3)
    numpy_ints = MDLConfig(D=np.int64(16), qr_seed=np.int64(3))   # NumPy ints are written as JSON ints
    assert load_config(save_config(numpy_ints, tmp_path / "n.json")) == MDLConfig(qr_seed=3)


# --- duplicate keys, a huge D, huge numbers, new content under an old size and mtime ------------------------


def _config_text(**static) -> str:
    from mdl_jax.controller.config_file import config_to_dict

    d = config_to_dict(MDLConfig())
    d["static"].update(static)
    return json.dumps(d, indent=1)


def _refused(tmp_path, text: str, match: str, capsys):
    from mdl_jax import load_config
    from mdl_jax.cli import main
    from mdl_jax.controller.config_file import ConfigFileError

    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(ConfigFileError, match=match):
        load_config(path)
    with pytest.raises(ConfigFileError, match=match):
        decide(0.5, 0.5, 0.5, str(path))
    records = tmp_path / "r.parquet"
    if not records.exists():
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"M": [0.5], "R": [0.5], "A": [0.5]}), records)
    assert main(["sweep", str(records), "--grid", "g_a=0.3", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdl-jax: error: sweep:") and len(err.splitlines()) == 1 and str(path) in err


@pytest.mark.parametrize("path", [None, 3, ["c.json"]])
def test_load_config_of_something_that_is_no_path_is_a_type_error_naming_path(path):
    with pytest.raises(TypeError, match=r"^path: expected a config file path, got "):
        load_config(path)


def test_a_duplicate_key_in_a_config_file_is_refused(tmp_path, capsys):
    text = _config_text().replace('"numeric": {', '"numeric": {\n  "thresholds": [0.9, 0.8, 0.7],', 1)
    assert json.loads(text)["numeric"]["thresholds"] == [0.6, 0.4, 0.2]   # JSON alone: the last wins
    _refused(tmp_path, text, r"thresholds: stated twice", capsys)


def test_a_config_file_d_over_max_d_is_refused(tmp_path, capsys):
    from mdl_jax.controller.config_file import MAX_D, config_from_bytes

    text = _config_text(D=4096, dims=[1000, 1000, 2096])
    assert len(text) < 2000
    _refused(tmp_path, text, rf"static\.D: 4096 is over .* {MAX_D}", capsys)
    # D = MAX_D itself loads
    assert config_from_bytes(_config_text(D=MAX_D, dims=[100, 100, MAX_D - 200]).encode()).D == MAX_D


def test_a_5000_digit_number_in_a_config_file_is_refused_naming_the_bound(tmp_path, capsys):
    text = _config_text().replace('"qr_seed": 42', '"qr_seed": ' + "4" * 5000)
    _refused(tmp_path, text, r"a number of 5,000 characters .* at most 800", capsys)
    text = _config_text().replace('"n_min": 2.179652452468872', '"n_min": 2.' + "1" * 5000)
    _refused(tmp_path, text, r"a number of 5,002 characters", capsys)


def test_a_config_file_replaced_with_its_size_and_mtime_kept_is_read_anew(tmp_path):
    from mdl_jax import save_config

    path = tmp_path / "c.json"
    hi, lo = MDLConfig(thresholds=(0.9, 0.8, 0.7)), MDLConfig(thresholds=(0.1, 0.0, 0.0))
    save_config(lo, path)
    text_lo = path.read_text()
    save_config(hi, path)
    st = os.stat(path)
    assert len(path.read_text()) == len(text_lo)
    x = np.full(3, 0.5, np.float32)
    assert int(decide(0.5, 0.5, 0.5, str(path)).action) == 3 and int(decide(x, x, x, str(path)).action[0]) == 3
    path.write_text(text_lo)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))   # cp -p / rsync -t / tar x
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    assert int(decide(0.5, 0.5, 0.5, str(path)).action) == 0 and int(decide(x, x, x, str(path)).action[0]) == 0
