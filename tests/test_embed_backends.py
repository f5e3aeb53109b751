"""The embedding backends: ONNX Runtime's vectors match torch's (the bundled MiniLM, exported offline once
and cached by content), int8 and OpenVINO bfloat16 stay within their stated parity, each backend keeps
its own cache key, and bad settings are one clear error."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from mdl_jax.signals.embeddings import Embedder, ModelLoadError

TEXTS = ["Is it safe to eat raw cookie dough?", "Raw flour can carry E. coli.",
         "What happens if you swallow gum?", "It passes through the digestive system in days.",
         "Who wrote the Declaration of Independence?", "Thomas Jefferson drafted it in 1776, " * 40]


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory):
    """A cache folder whose export folder has a symlink planted at the names a naive exporter would
    write through; the graph is exported into it once for the whole module."""
    from mdl_jax.signals import onnx_encoder

    cache = tmp_path_factory.mktemp("onnx-cache")
    path = Embedder(backend="onnx").load_path
    folder = cache / "onnx" / f"{Path(path).name}-{onnx_encoder.folder_hash(Path(path))}"
    folder.mkdir(parents=True)
    victim = cache / "victim.txt"
    victim.write_text("keep me")
    for name in ("model.onnx.tmp", "model.int8.onnx.tmp"):
        (folder / name).symlink_to(victim)
    onnx_encoder.export(path, cache)
    return cache


@pytest.mark.slow
def test_onnx_vectors_equal_torchs_to_float32_rounding(onnx_cache):
    ref = Embedder(cache_dir=onnx_cache).embed(TEXTS)
    got = Embedder(cache_dir=onnx_cache, backend="onnx").embed(TEXTS)  # the long text is truncated alike
    cos = (ref * got).sum(1)
    assert cos.min() >= 0.9999, cos
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)


@pytest.mark.slow
def test_onnx_batches_cut_by_tokens_and_run_on_threads_give_each_text_its_own_vector(onnx_cache, monkeypatch):
    """Texts of many lengths, cut into several token-bounded batches run on two threads at once: each
    vector comes back at its text's place and equals that text encoded alone (padding only), and the
    token ids are the tokenizer's own."""
    from mdl_jax.signals import onnx_encoder

    enc = Embedder(cache_dir=onnx_cache, backend="onnx").model
    texts = [f"Fact {i}: " + "the river runs north past the old mill " * (i % 7) for i in range(40)]
    texts += ["", "naïve café ü", TEXTS[-1]]  # empty, non-ASCII, longer than max_seq_length
    ids, types = enc._token_ids(texts)
    want = enc.tokenizer(texts, truncation=True, max_length=enc.max_seq_length)
    assert ids == want["input_ids"] and types == want["token_type_ids"]
    monkeypatch.setattr(onnx_encoder, "TOKENS_PER_BATCH", 64)  # many batches
    assert enc.threads >= 1
    monkeypatch.setattr(enc, "threads", 2)
    together = enc.encode(texts, batch_size=8)
    alone = np.concatenate([enc.encode([t]) for t in texts])
    assert together.shape == (len(texts), 384)
    assert ((together * alone).sum(1)).min() >= 0.99999


@pytest.mark.slow
def test_int8_is_within_its_stated_parity(onnx_cache):
    ref = Embedder(cache_dir=onnx_cache).embed(TEXTS)
    got = Embedder(cache_dir=onnx_cache, backend="onnx-int8").embed(TEXTS)
    assert (ref * got).sum(1).min() >= 0.95  # documented: per-channel dynamic int8, min cosine ≈ 0.97


def _wait_or_fail(pid: int, seconds: float, why: str) -> None:
    """Reap a forked child; one that runs past ``seconds`` is killed and fails the test (instead of
    stalling the suite on a hang)."""
    for _ in range(int(seconds * 10)):
        if os.waitpid(pid, os.WNOHANG)[0]:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(why)


def _in_forked_child(fn, seconds: float = 120) -> dict:
    """``fn()``'s dict, computed in a forked child and sent back through a pipe as JSON (an exception
    there: ``{"error": "unexpected ..."}``); the child leaves through ``os._exit`` (no teardown of the
    parent's runtimes), and one that runs past ``seconds`` is killed and fails the test."""
    import json

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            msg = json.dumps(fn())
        except BaseException as err:  # noqa: BLE001 - anything the child meets goes back to the test
            msg = json.dumps({"error": "unexpected " + repr(err)})
        with os.fdopen(w, "w") as f:
            f.write(msg)
        os._exit(0)
    os.close(w)
    _wait_or_fail(pid, seconds, "the forked child hung")
    with os.fdopen(r) as f:
        return json.loads(f.read())


def _bf16_cpu() -> bool:
    from mdl_jax.signals.onnx_encoder import bf16_supported

    try:
        return bf16_supported()
    except ImportError:
        return False


needs_bf16 = pytest.mark.skipif(not _bf16_cpu(), reason="openvino not installed, or no bfloat16 on this CPU "
                                                       "(the backend refuses there: see the next test)")


@pytest.mark.slow
@needs_bf16
def test_openvino_bf16_is_within_its_stated_parity_and_its_batches_and_threads_change_nothing(onnx_cache,
                                                                                             monkeypatch):
    """bfloat16 products: cosine to torch's ≥ 0.9999 (0.99995 on the bundled data); the texts cut into
    many token-bounded batches run on two threads give each text the vector of the same batches run on
    one thread, bit for bit, at its own place; its own cache key."""
    from mdl_jax.signals import onnx_encoder

    ref = Embedder(cache_dir=onnx_cache).embed(TEXTS)
    e = Embedder(cache_dir=onnx_cache, backend="openvino-bf16")
    assert e.model_id.endswith(f"#openvino-bf16@{onnx_encoder.cpu_bf16_kind()}")  # keyed per CPU kind
    got = e.embed(TEXTS)
    assert (ref * got).sum(1).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)
    enc = e.model
    texts = [f"Fact {i}: " + "the river runs north past the old mill " * (i % 7) for i in range(30)] + [""]
    monkeypatch.setattr(onnx_encoder, "TOKENS_PER_BATCH", 64)
    monkeypatch.setattr(enc, "threads", 2)
    two = enc.encode(texts, batch_size=8)
    monkeypatch.setattr(enc, "threads", 1)
    one = enc.encode(texts, batch_size=8)
    np.testing.assert_array_equal(two, one)
    alone = np.concatenate([enc.encode([t]) for t in texts])
    assert ((two * alone).sum(1)).min() >= 0.9999  # padding only (and bfloat16 rounding)
    # a forked child gets a clear error, not OpenVINO's hang (its threads do not survive a fork)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only Python, then _exit (no teardown of the parent's objects)
        try:
            enc.encode(["x"])
            msg = b"no error"
        except RuntimeError as err:
            msg = str(err).encode()
        os.write(w, msg[:500])
        os._exit(0)
    os.close(w)
    _wait_or_fail(pid, 60, "the forked child hung in encode")
    with os.fdopen(r, "rb") as f:
        assert b"cannot run in its forked child" in f.read()


@needs_bf16
def test_openvino_gives_a_text_the_same_vector_in_any_batch(onnx_cache):
    """Each text is padded to its own token bucket, whatever it is batched with, so its bfloat16 vector
    is the same bits alone, among all the texts and in another order (4 of these 60 texts moved in their
    last bits when a batch padded them to a longer neighbour's width). Measured on AVX512-BF16; AMX's
    tiles may order a batch's rows otherwise, so there only the parity of the test above is claimed."""
    from mdl_jax.signals import onnx_encoder

    if onnx_encoder.cpu_bf16_kind() != "avx512_bf16":
        pytest.skip("the same bits in any batch are measured on AVX512-BF16 CPUs only")
    enc = Embedder(cache_dir=onnx_cache, backend="openvino-bf16").model
    words = ("the river runs north past the old mill where farmers bring grain in autumn and children "
             "swim in summer").split()
    texts = [f"Fact {i}: " + " ".join(words[j % len(words)] for j in range(i * 3 % 97)) for i in range(60)]
    alone = np.concatenate([enc.encode([t]) for t in texts])
    np.testing.assert_array_equal(enc.encode(texts), alone)
    shuffled = np.random.default_rng(0).permutation(len(texts))
    np.testing.assert_array_equal(enc.encode([texts[k] for k in shuffled]), alone[shuffled])


def test_openvino_bf16_refuses_a_cpu_without_bfloat16_and_names_the_alternative(tmp_path, monkeypatch):
    """Where OpenVINO reports no bfloat16 (an AVX2-only CPU), it would run float32, slower than ONNX
    Runtime: the backend says so before exporting anything. (The CPU's answer is faked: this machine's
    may have bfloat16.)"""
    ov = pytest.importorskip("openvino")
    from mdl_jax.signals import onnx_encoder

    monkeypatch.setattr(onnx_encoder, "_SESSIONS", {})  # not the encoder an earlier test loaded
    monkeypatch.setattr(ov.Core, "get_property", lambda self, dev, name: ["FP32", "INT8", "EXPORT_IMPORT"])
    e = Embedder(cache_dir=tmp_path, backend="openvino-bf16")
    with pytest.raises(ModelLoadError, match="needs a CPU with bfloat16 support .* Use backend 'onnx'"):
        e.embed(["x"])
    assert not list(tmp_path.rglob("*.onnx"))  # refused before the export


@pytest.mark.slow
def test_the_graph_is_exported_once_and_never_through_a_planted_name(onnx_cache):
    from mdl_jax.signals import onnx_encoder

    path = Embedder(backend="onnx").load_path
    g = onnx_encoder.export(path, onnx_cache)
    assert g.is_file() and not g.is_symlink() and (onnx_cache / "victim.txt").read_text() == "keep me"
    before = g.stat().st_mtime_ns
    assert onnx_encoder.export(path, onnx_cache) == g and g.stat().st_mtime_ns == before  # cached
    assert {p.name for p in g.parent.glob("*.tmp")} <= {"model.onnx.tmp", "model.int8.onnx.tmp"}  # only ours


def test_an_export_folder_planted_as_a_symlink_is_refused_not_written_through(tmp_path, monkeypatch):
    from mdl_jax.signals import onnx_encoder

    path = Embedder(backend="onnx").load_path
    victim = tmp_path / "victim"
    victim.mkdir()
    onnx_dir = tmp_path / "cache" / "onnx"
    onnx_dir.mkdir(parents=True)
    (onnx_dir / f"{Path(path).name}-{onnx_encoder.folder_hash(Path(path))}").symlink_to(victim)
    with pytest.raises(ValueError, match="cache_dir: .* is a symbolic link or not a folder"):
        onnx_encoder.export(path, tmp_path / "cache")
    onnx_dir.rename(tmp_path / "cache" / "old")
    onnx_dir.symlink_to(victim)  # the folder above it, planted too
    monkeypatch.setattr(onnx_encoder, "_SESSIONS", {})  # not an encoder an earlier test loaded
    with pytest.raises(ModelLoadError, match="backend 'onnx' .*symbolic link"):
        Embedder(cache_dir=tmp_path / "cache", backend="onnx").embed(["x"])
    assert not list(victim.iterdir())  # nothing written where the links point


def test_a_group_writable_export_folder_is_made_ours_alone(tmp_path):
    from mdl_jax._paths import own_folder

    d = tmp_path / "g"
    d.mkdir()
    d.chmod(0o775)  # as an older version made it under umask 002
    assert own_folder(d, what="cache_dir") == d and (d.stat().st_mode & 0o777) == 0o755
    old = os.umask(0o002)  # the folders it makes, parents included, are ours alone under any umask
    try:
        own_folder(tmp_path / "p" / "q", what="cache_dir")
    finally:
        os.umask(old)
    assert [(tmp_path / x).stat().st_mode & 0o777 for x in ("p", "p/q")] == [0o700, 0o700]
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="cache_dir: cannot create the folder"):
        own_folder(tmp_path / "f" / "sub", what="cache_dir")


@pytest.mark.slow
def test_a_damaged_cached_graph_is_exported_again_once(onnx_cache, tmp_path, monkeypatch):
    """A truncated model.onnx (disk damage: ours are written whole) warns and is exported again, and
    the vectors are the good graph's. (ONNX Runtime only: OpenVINO's failed compile takes the same
    ``except`` in OnnxEncoder.__init__, and each export costs the suite ~9 s.)"""
    import shutil

    from mdl_jax.signals import onnx_encoder

    backend = "onnx"
    monkeypatch.setattr(onnx_encoder, "_SESSIONS", {})
    good = Embedder(cache_dir=onnx_cache, backend=backend).embed(TEXTS[:3])
    shutil.copytree(onnx_cache / "onnx", tmp_path / "onnx")
    graph = next((tmp_path / "onnx").rglob("model.onnx"))
    size = graph.stat().st_size
    graph.write_bytes(graph.read_bytes()[: size // 3])
    monkeypatch.setattr(onnx_encoder, "_SESSIONS", {})
    with pytest.warns(RuntimeWarning, match="is damaged .* exporting it again"):
        got = Embedder(cache_dir=tmp_path, backend=backend).embed(TEXTS[:3])  # a new embedding cache
    assert graph.stat().st_size == size
    np.testing.assert_array_equal(got, good)


def _rotted_copy(onnx_cache, tmp_path):
    """A copy of the exported graphs whose model.onnx has bits flipped in its weights, its size kept:
    the lowest exponent bit of 256 float32 values, each then half or twice what it was."""
    import shutil

    shutil.copytree(onnx_cache / "onnx", tmp_path / "onnx")
    graph = next((tmp_path / "onnx").rglob("model.onnx"))
    data = bytearray(graph.read_bytes())
    at = (len(data) * 3 // 5) & ~3
    for k in range(256):
        data[at + 4 * k + 3] ^= 0x00 if data[at + 4 * k + 3] in (0x00, 0x80) else 0x01  # (zeros stay zeros)
    graph.write_bytes(bytes(data))
    return graph


@pytest.mark.slow
def test_a_graph_damaged_with_its_size_kept_fails_its_digest_and_is_exported_again(onnx_cache, tmp_path,
                                                                                   monkeypatch):
    """Bit rot in the weights leaves a graph that parses and loads (``damaged`` cannot see it) and
    gives wrong vectors: the digest recorded at export catches it, and the graph is exported again."""
    from mdl_jax.signals import onnx_encoder

    monkeypatch.setattr(onnx_encoder, "_SESSIONS", {})
    good = Embedder(cache_dir=onnx_cache, backend="onnx").embed(TEXTS[:3])
    graph = _rotted_copy(onnx_cache, tmp_path)
    size = graph.stat().st_size
    assert not onnx_encoder.damaged(graph)
    monkeypatch.setattr(onnx_encoder, "_SESSIONS", {})
    with pytest.warns(RuntimeWarning, match=rf"the exported graph {graph} is damaged \(its sha256 .* is not the "
                                            r"digest recorded at export, .*\); exporting it again"):
        got = Embedder(cache_dir=tmp_path, backend="onnx").embed(TEXTS[:3])  # a new embedding cache
    np.testing.assert_array_equal(got, good)
    assert graph.stat().st_size == size and onnx_encoder.digest_fault(graph) is None


@pytest.mark.slow
def test_a_graph_that_fails_its_digest_where_it_cannot_be_exported_again_is_an_error_naming_it(onnx_cache,
                                                                                               tmp_path):
    import subprocess

    from mdl_jax.signals import onnx_encoder

    graph = _rotted_copy(onnx_cache, tmp_path)
    folder = graph.parent
    if os.geteuid() != 0:
        folder.chmod(0o555)
        undo = lambda: folder.chmod(0o755)  # noqa: E731
    elif subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0:
        undo = lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)  # noqa: E731
    else:
        pytest.skip("running as root on a file system without chattr +i: no folder is read-only to root")
    try:
        with pytest.raises(ValueError, match=rf"the exported graph {graph} is damaged .*, and it cannot be "
                                             r"exported again \((PermissionError|OutputError)"), \
                pytest.warns(RuntimeWarning, match="exporting it again"):  # (tried, and refused)
            onnx_encoder.export(Embedder(backend="onnx").load_path, tmp_path)
    finally:
        undo()
    (folder / "model.onnx.sha256").unlink()  # a graph with no digest is not taken on trust either
    assert onnx_encoder.digest_fault(graph) == "has no digest recorded at export"


def test_importing_onnx_runtime_through_mdl_jax_writes_no_telemetry(tmp_path):
    """``import onnxruntime`` writes a device id and an event queue under ~/.cache; the gate imports it
    (its default backend on most CPUs) with its telemetry off, and leaves the environment as it was."""
    import subprocess
    import sys

    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "id.onnx")
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "ORT_DISABLE_TELEMETRY")}
    env["HOME"] = str(tmp_path / "home")
    code = ("import os, sys, numpy as np; from mdl_jax.signals.onnx_encoder import import_onnxruntime; "
            "ort = import_onnxruntime(); s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider']); "
            "s.run(None, {'x': np.ones(1, np.float32)}); print('ORT_DISABLE_TELEMETRY' in os.environ)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "id.onnx")], capture_output=True, text=True,
                         timeout=120, env=env, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("*"))
    # the control, in a home of its own: a plain import writes them where this build of ONNX Runtime has
    # telemetry at all (some builds write nothing: then the check above could not fail, and we say so)
    control = dict(env, HOME=str(tmp_path / "control"))
    subprocess.run([sys.executable, "-c", "import onnxruntime"], timeout=120, env=control, check=True)
    if not (tmp_path / "control" / ".cache" / "Microsoft" / "DeveloperTools" / ".onnxruntime" / "deviceid").exists():
        pytest.skip("this build of ONNX Runtime writes no telemetry on import: nothing to turn off")


@pytest.mark.slow
def test_a_runtime_failure_on_a_whole_graph_is_raised_and_the_graph_left_alone(onnx_cache, monkeypatch):
    """Only a damaged file is exported again: a failure of the runtime itself (out of memory here,
    faked: a failure path) is the error the user sees, and the cached graph is not rewritten."""
    import onnxruntime

    from mdl_jax.signals import onnx_encoder

    graph = next((onnx_cache / "onnx").rglob("model.onnx"))
    before = graph.stat().st_mtime_ns

    def no_memory(*a, **kw):
        raise MemoryError("faked: no memory for the session")

    monkeypatch.setattr(onnx_encoder, "_SESSIONS", {})
    monkeypatch.setattr(onnxruntime, "InferenceSession", no_memory)
    with pytest.raises(MemoryError, match="faked"):
        Embedder(cache_dir=onnx_cache, backend="onnx").embed(["x"])
    assert graph.stat().st_mtime_ns == before and not onnx_encoder.damaged(graph)
    # what protobuf parses without an error but is no model: an empty file, one cut between fields
    cut = onnx_cache / "cut.onnx"
    for n in (0, 19):
        cut.write_bytes(graph.read_bytes()[:n])
        assert onnx_encoder.damaged(cut), n


@pytest.mark.slow
def test_a_missing_runtime_names_its_extra_and_leaves_the_cached_graph_alone(onnx_cache, monkeypatch):
    import sys

    from mdl_jax.signals import onnx_encoder

    graph = next((onnx_cache / "onnx").rglob("model.onnx"))
    size = graph.stat().st_size
    monkeypatch.setattr(onnx_encoder, "_SESSIONS", {})
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    with pytest.raises(ModelLoadError, match=r"needs onnxruntime, not installed: pip install 'mdl-jax\[onnx\]'"):
        Embedder(cache_dir=onnx_cache, backend="onnx").embed(["x"])
    assert graph.stat().st_size == size  # not taken for a damaged graph


@pytest.mark.slow
def test_each_backend_keeps_its_own_cache_key(onnx_cache, tmp_path):
    a = Embedder(cache_dir=tmp_path, backend="torch")
    b = Embedder(cache_dir=tmp_path, backend="onnx")
    assert a.model_id != b.model_id and b.model_id.endswith("#onnx")
    a.embed(TEXTS[:2])
    b.embed(TEXTS[:2])
    assert b.n_embedded == 2 and b.n_cached == 0  # torch's vectors were not reused for onnx


def test_bad_backend_settings_are_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"backend: expected one of \['torch', 'onnx', 'onnx-int8', 'openvino-bf16', 'auto'\]"):
        Embedder(cache_dir=tmp_path, backend="tensorrt")
    with pytest.raises(ValueError, match="runs on the CPU"):
        Embedder(cache_dir=tmp_path, backend="onnx", device="cuda")
    from mdl_jax.signals import onnx_encoder

    with pytest.raises(ValueError, match="needs a local model folder"):
        onnx_encoder.export("org/not-a-folder", tmp_path)
    bad = tmp_path / "not-a-model"
    bad.mkdir()
    e = Embedder(str(bad), cache_dir=tmp_path, backend="onnx")
    with pytest.raises(ModelLoadError, match="backend 'onnx'"):
        e.embed(["x"])
    assert not list(tmp_path.rglob("*.onnx")) and not list(tmp_path.rglob("*.tmp"))  # nothing half-written


# -- "auto": the gate's default backend ---------------------------------------------------------------

def _auto_pick() -> str:
    """What "auto" should run on this machine: OpenVINO bfloat16 where the CPU has it, else ONNX Runtime."""
    return "openvino-bf16" if _bf16_cpu() else "onnx"


@pytest.mark.slow
def test_auto_runs_the_fastest_backend_within_the_parity_and_the_gates_actions_equal_torchs(onnx_cache, embedder):
    """The gate's default: OpenVINO bfloat16 on a CPU with bfloat16, else ONNX Runtime, deciding as torch's
    vectors do on bundled TruthfulQA + HaluEval rows (the torch side: the session's embedder), its
    signals within float32 rounding of torch's (ONNX Runtime) or bfloat16's (OpenVINO)."""
    pytest.importorskip("onnxruntime")
    from mdl_jax.gate import MemoryGate
    from mdl_repro.pipeline import data
    from mdl_repro.pipeline.stores import StoreConfig, build_stores

    gate = MemoryGate(cache_dir=onnx_cache)  # embedder and embed_backend left at their defaults
    rows = [(s.item.question, s.texts) for ds in ("truthfulqa", "halueval")
            for s in build_stores(data.load(ds, limit=40), StoreConfig(seed=0))]
    got = gate.columns([q for q, _ in rows], [m for _, m in rows])
    assert gate.embedder.requested_backend == "auto" and gate.embedder.backend == _auto_pick()  # after loading
    assert f"#{_auto_pick()}" in gate.embedder.model_id
    want = MemoryGate(embedder=embedder).columns([q for q, _ in rows], [m for _, m in rows])
    assert (got["action"] == want["action"]).all()
    atol = 1e-5 if _auto_pick() == "onnx" else 2e-3  # bfloat16 keeps 8 bits of mantissa
    for k in ("M", "R", "phi", "C_final"):
        np.testing.assert_allclose(got[k], want[k], atol=atol, err_msg=k)


def test_auto_runs_openvino_on_bfloat16_cpus_onnx_elsewhere_and_torch_without_them(tmp_path, monkeypatch):
    """And torch on a GPU, for a model it cannot export, and where neither runtime is installed."""
    import importlib.util

    from mdl_jax.signals import embeddings, onnx_encoder

    assert Embedder(cache_dir=tmp_path, backend="auto", device="cuda").backend == "torch"
    assert Embedder("org/a-hub-name", cache_dir=tmp_path, backend="auto").backend == "torch"  # not a folder
    lasttoken = tmp_path / "lasttoken-model"
    (lasttoken / "1_Pooling").mkdir(parents=True)
    (lasttoken / "modules.json").write_text('[{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]')
    (lasttoken / "1_Pooling" / "config.json").write_text('{"pooling_mode_lasttoken": true}')
    assert embeddings.auto_backend(str(lasttoken)) == "torch"  # a pooling the exporter does not reproduce
    real = importlib.util.find_spec
    missing: set[str] = set()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in missing else real(name, *a))
    monkeypatch.setattr(onnx_encoder, "cpu_bf16_kind", lambda: "avx512_bf16")  # a CPU with bfloat16
    monkeypatch.setattr(embeddings, "_AUTO_FAILED", set())
    path = Embedder(cache_dir=tmp_path).load_path
    if real("openvino") is not None:
        assert embeddings.auto_backend(path) == "openvino-bf16"
    missing.add("openvino")
    assert embeddings.auto_backend(path) == "onnx"  # bfloat16 here, but no OpenVINO
    missing.discard("openvino")
    monkeypatch.setattr(onnx_encoder, "cpu_bf16_kind", lambda: None)  # a CPU without bfloat16
    assert embeddings.auto_backend(path) == "onnx"
    missing.add("onnxruntime")
    e = Embedder(cache_dir=tmp_path, backend="auto")
    assert (e.requested_backend, e.backend, e.model_id) == ("auto", "torch", "sentence-transformers/all-MiniLM-L6-v2")


@pytest.mark.parametrize("first", ["onnx", "openvino-bf16"])
def test_auto_ends_at_once_on_a_model_folder_at_fault_and_tries_no_other_backend(tmp_path, monkeypatch, first):
    """A folder without its vocabulary was loaded by every backend in turn (a warning each) before the
    one error every backend gives it: the fault is the folder's, so the first backend's is the error."""
    import warnings

    pytest.importorskip("onnxruntime")
    from mdl_jax.signals import embeddings, onnx_encoder

    src = Path(Embedder().load_path)
    folder = tmp_path / "model"
    folder.mkdir()
    for f in src.iterdir():
        if f.name not in ("vocab.txt", "tokenizer.json"):
            (folder / f.name).symlink_to(f, target_is_directory=f.is_dir())
    if first == "openvino-bf16":
        pytest.importorskip("openvino")
        if onnx_encoder.cpu_bf16_kind() is None:
            pytest.skip("OpenVINO runs bfloat16 only on a CPU with AMX or AVX512-BF16")
    else:
        monkeypatch.setattr(onnx_encoder, "cpu_bf16_kind", lambda: None)  # the chain: onnx, then torch
    monkeypatch.setattr(embeddings, "_AUTO_FAILED", set())
    tried = []
    real_load, real_torch = onnx_encoder.load, embeddings.load_model
    monkeypatch.setattr(onnx_encoder, "load", lambda path, cache, backend, *a: (tried.append(backend),
                                                                               real_load(path, cache, backend, *a))[1])
    monkeypatch.setattr(embeddings, "load_model", lambda *a: (tried.append("torch"), real_torch(*a))[1])
    e = Embedder(str(folder), cache_dir=tmp_path / "cache", backend="auto")
    assert e.backend == first
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with pytest.raises(ModelLoadError, match=r"^embedder: the model .* its tokenizer knows 5 tokens"):
            e.embed(["a text"])
    assert tried == [first], tried
    assert not [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
    assert e.backend == first and not embeddings._AUTO_FAILED


@pytest.mark.slow
def test_auto_falls_back_to_torch_with_a_warning_when_the_onnx_load_fails(tmp_path, monkeypatch, embedder):
    """A failure to export or load (faked here: the failure path) costs a warning, not the gate: the
    vectors are torch's, cached under torch's key, and the next Embedder does not try again."""
    pytest.importorskip("onnxruntime")
    from mdl_jax.signals import embeddings, onnx_encoder

    def broken(*a, **k):
        raise RuntimeError("exporter: an operator it cannot convert")

    monkeypatch.setattr(onnx_encoder, "load", broken)
    monkeypatch.setattr(onnx_encoder, "cpu_bf16_kind", lambda: None)  # the chain here: onnx, then torch
    monkeypatch.setattr(embeddings, "_AUTO_FAILED", set())
    e = Embedder(cache_dir=tmp_path, backend="auto")
    assert e.backend == "onnx"
    # a vector under the onnx key from an earlier process (a stand-in, far from torch's): served while
    # "auto" is onnx, never beside torch's once it fell back
    planted = np.eye(384, dtype=np.float32)[:1]
    e.cache.put(e.model_id, TEXTS[3:4], planted)
    np.testing.assert_array_equal(e.embed(TEXTS[3:4]), planted)  # no load needed: the cache served it
    with pytest.warns(RuntimeWarning, match="backend 'auto' runs it with torch instead"):
        got = e.embed(TEXTS[:4])
    assert e.backend == "torch" and e.model_id == embedder.model_id
    np.testing.assert_allclose(got, embedder.embed(TEXTS[:4]), atol=1e-6)  # the planted row too
    np.testing.assert_allclose(e.embed(TEXTS[3:4]), embedder.embed(TEXTS[3:4]), atol=1e-6)  # and remembered
    again = Embedder(cache_dir=tmp_path)  # torch's key: what the fallback wrote is served from the cache
    again.embed(TEXTS[:4])
    assert (again.n_embedded, again.n_cached) == (0, 4)
    assert Embedder(cache_dir=tmp_path, backend="auto").backend == "torch"


@pytest.mark.slow
def test_auto_falls_back_from_openvino_to_onnx_with_a_warning_when_openvino_fails(onnx_cache, tmp_path,
                                                                                  monkeypatch):
    """On a CPU with bfloat16 (declared here, so the test runs on any CPU), an OpenVINO that fails to
    load (faked: the failure path) leaves "auto" on ONNX Runtime, not torch: ONNX Runtime's vectors,
    under its key."""
    import importlib.util

    pytest.importorskip("onnxruntime")
    from mdl_jax.signals import embeddings, onnx_encoder

    real = onnx_encoder.load

    def no_openvino(path, cache, backend, model_id=None):
        if backend == "openvino-bf16":
            raise RuntimeError("openvino: the CPU plugin failed to compile")
        return real(path, onnx_cache, backend, model_id)

    monkeypatch.setattr(onnx_encoder, "load", no_openvino)
    monkeypatch.setattr(onnx_encoder, "cpu_bf16_kind", lambda: "avx512_bf16")
    monkeypatch.setattr(embeddings, "_AUTO_FAILED", set())
    real_spec = importlib.util.find_spec  # openvino "installed", so this runs where it is not
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "openvino" else real_spec(name, *a))
    e = Embedder(cache_dir=tmp_path, backend="auto")
    assert e.backend == "openvino-bf16"
    with pytest.warns(RuntimeWarning, match="backend 'auto' runs it with onnx instead"):
        got = e.embed(TEXTS[:3])
    assert e.backend == "onnx" and e.model_id.endswith("#onnx")
    np.testing.assert_array_equal(got, Embedder(cache_dir=tmp_path, backend="onnx").embed(TEXTS[:3]))
    assert Embedder(cache_dir=tmp_path, backend="auto").backend == "onnx"  # not tried again in this process


class _FailsAtInference:
    """An encoder that loaded and then fails at inference (the failure path: an OpenVINO that compiled
    but cannot run a shape); ``good`` calls succeed first, returning a stand-in vector far from any
    real one."""

    def __init__(self, good: int = 0):
        self.good = good

    def encode(self, texts, **kw):
        if self.good > 0:
            self.good -= 1
            return np.tile(np.eye(384, dtype=np.float32)[:1], (len(texts), 1))
        raise RuntimeError("openvino: Exception from src/inference: cannot infer this shape")


def _a_bf16_cpu_with_openvino(monkeypatch) -> None:
    """A CPU declared to have bfloat16 and openvino declared installed (so this runs where neither is),
    with no backend marked failed in this process yet."""
    import importlib.util

    from mdl_jax.signals import embeddings, onnx_encoder

    monkeypatch.setattr(onnx_encoder, "cpu_bf16_kind", lambda: "avx512_bf16")
    monkeypatch.setattr(embeddings, "_AUTO_FAILED", set())
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "openvino" else real(name, *a))


def _openvino_fails_at_inference(monkeypatch, onnx_cache, good: int = 0, on_onnx_load=None):
    """"auto" on a CPU declared to have bfloat16, whose OpenVINO encoder is ``_FailsAtInference(good)``
    and whose ONNX Runtime encoder is the real one (``on_onnx_load`` is called as it loads)."""

    from mdl_jax.signals import onnx_encoder

    real = onnx_encoder.load

    def load(path, cache, backend, model_id=None):
        if backend == "openvino-bf16":
            return _FailsAtInference(good)
        if on_onnx_load is not None:
            on_onnx_load()
        return real(path, onnx_cache, backend, model_id)

    monkeypatch.setattr(onnx_encoder, "load", load)
    _a_bf16_cpu_with_openvino(monkeypatch)


@pytest.mark.slow
def test_auto_goes_on_with_onnx_when_openvino_fails_at_inference_and_counts_each_text_once(onnx_cache, tmp_path,
                                                                                            monkeypatch):
    """A runtime that loads and then fails to infer costs "auto" a warning, not the call: the call's
    vectors are all ONNX Runtime's (a vector cached under OpenVINO's key before is not served beside
    them), and ``n_embedded`` / ``n_cached`` count each text once although the call ran twice."""
    pytest.importorskip("onnxruntime")
    _openvino_fails_at_inference(monkeypatch, onnx_cache)
    e = Embedder(cache_dir=tmp_path, backend="auto")
    assert e.backend == "openvino-bf16"
    e.cache.put(e.model_id, TEXTS[:1], np.eye(384, dtype=np.float32)[1:2])  # from an earlier process
    with pytest.warns(RuntimeWarning, match="cannot infer this shape; backend 'auto' runs it with onnx instead"):
        got = e.embed(TEXTS[:3])
    assert e.backend == "onnx" and e.backend_id == "onnx"
    np.testing.assert_array_equal(got, Embedder(cache_dir=onnx_cache, backend="onnx").embed(TEXTS[:3]))
    assert (e.n_embedded, e.n_cached) == (3, 0)  # before: (3, 3), the second run counting the first's texts
    e.embed(TEXTS[:3])
    assert (e.n_embedded, e.n_cached) == (3, 3)
    pinned = Embedder(cache_dir=tmp_path, backend="openvino-bf16")  # not "auto": its failure is the caller's
    pinned._model = _FailsAtInference()
    with pytest.raises(RuntimeError, match="cannot infer this shape"):
        pinned.embed(["a text nobody embedded"])


@pytest.mark.slow
def test_a_call_that_begins_after_a_switch_gets_no_remembered_vector_of_the_old_backend(onnx_cache, tmp_path,
                                                                                         monkeypatch):
    """Thread B's call begins after thread A's call switched "auto" from OpenVINO to ONNX Runtime, and
    before A's call is over: B must not get the vector A's Embedder remembered from OpenVINO (the
    switch forgets them; before, only A's rerun did, after B could have read one)."""
    import threading

    pytest.importorskip("onnxruntime")
    got: dict = {}
    e = None

    def during_the_switch():  # runs in A, after the switch, while the ONNX Runtime encoder loads
        if "thread" in got:
            # a later ONNX Runtime load in this test (the reference Embedder below, when no earlier
            # test of the process loaded that encoder) is not the switch: B ran once already
            return
        b = threading.Thread(target=lambda: got.setdefault("b", e.embed(TEXTS[:1])))
        b.start()
        b.join(1.0)  # a remembered vector comes back in microseconds; one to encode waits for this load
        got["b_done_during_load"] = not b.is_alive()
        got["thread"] = b

    _openvino_fails_at_inference(monkeypatch, onnx_cache, good=1, on_onnx_load=during_the_switch)
    e = Embedder(cache_dir=tmp_path, backend="auto")
    e.embed(TEXTS[:1])  # OpenVINO (the stand-in) embeds and remembers it
    with pytest.warns(RuntimeWarning, match="runs it with onnx instead"):
        e.embed(TEXTS[1:2])  # OpenVINO fails: the switch, and B's call in the middle of it
    got["thread"].join(60)
    want = Embedder(cache_dir=onnx_cache, backend="onnx").embed(TEXTS[:1])
    assert not got["b_done_during_load"]
    np.testing.assert_array_equal(got["b"], want)
    np.testing.assert_array_equal(e.embed(TEXTS[:1]), want)


@pytest.mark.slow
@needs_bf16
def test_auto_goes_on_with_onnx_in_a_forked_child_of_an_openvino_process(onnx_cache, tmp_path):
    """OpenVINO cannot run in a forked child; "auto" there warns once and embeds with ONNX Runtime (its
    vectors, its key) instead of raising or hanging."""
    import warnings

    e = Embedder(cache_dir=tmp_path, backend="auto")
    e.embed(TEXTS[:2])
    assert e.backend == "openvino-bf16"

    def child():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            v = e.embed(TEXTS[2:4])
            # a new auto Embedder made in the child gets the parent's encoder from the process-wide
            # cache: it too goes on with ONNX Runtime, from its first call
            fresh = Embedder(cache_dir=tmp_path / "fresh", backend="auto")
            fresh.embed(["a text only the child embeds"])
        return {"backend": e.backend, "key": e.model_id, "vec": v.tolist(), "fresh": fresh.backend,
                "warned": [str(c.message) for c in caught]}

    got = _in_forked_child(child)
    assert "error" not in got, got
    assert got["backend"] == "onnx" and got["key"].endswith("#onnx")
    assert got["fresh"] == "onnx"
    assert any("cannot run in this forked child" in m for m in got["warned"])
    want = Embedder(cache_dir=onnx_cache, backend="onnx").embed(TEXTS[2:4])
    np.testing.assert_allclose(np.array(got["vec"], np.float32), want, atol=1e-6)


@pytest.mark.slow
@needs_bf16
def test_a_forked_child_of_an_openvino_process_without_onnx_runtime_gets_a_clear_error_not_a_crash(onnx_cache,
                                                                                                  tmp_path):
    """In a forked child of an OpenVINO process with no usable ONNX Runtime, "auto" has no backend that
    can run: torch segfaults there (or hangs), as OpenVINO itself does. The call raises ModelLoadError
    naming the ways out; before, it went back to OpenVINO (and earlier still, to torch)."""
    import importlib.util

    e = Embedder(cache_dir=tmp_path, backend="auto")
    e.embed(TEXTS[:2])
    assert e.backend == "openvino-bf16"

    def child():
        real = importlib.util.find_spec  # ONNX Runtime not installed, in this child alone
        importlib.util.find_spec = lambda name, *a: None if name == "onnxruntime" else real(name, *a)
        try:
            e.embed(TEXTS[2:4])
            return {"error": None, "backend": e.backend}
        except ModelLoadError as err:
            return {"error": str(err), "backend": e.backend}

    got = _in_forked_child(child)
    assert got["error"] and "a forked child of a process that ran OpenVINO" in got["error"] and "'spawn'" in got["error"], got
    assert got["backend"] == "openvino-bf16"  # no switch to a backend that cannot run either


@pytest.mark.slow
@needs_bf16
def test_a_processs_first_openvino_infer_runs_alone_and_later_ones_in_parallel(onnx_cache, monkeypatch):
    """OpenVINO's binding deadlocks when threads make a process's first infer at once (its statics'
    init guards against the GIL: a fresh process with 8 threads on its first infers hung in 2 of 24
    runs before, 0 of 48 after): the first request and infer run under ``_OV_FIRST_INFER``, the rest not."""
    from mdl_jax.signals import onnx_encoder

    enc = Embedder(cache_dir=onnx_cache, backend="openvino-bf16").model
    monkeypatch.setattr(onnx_encoder, "_OV_INFERRED", False)  # as in a fresh process
    held, run = [], enc._ov_run

    def spy(feed):
        held.append(onnx_encoder._OV_FIRST_INFER.locked())
        return run(feed)

    monkeypatch.setattr(enc, "_ov_run", spy)
    feed = {k: np.ones((1, 8), np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
    first, second = enc._infer(dict(feed)), enc._infer(dict(feed))
    assert held == [True, False] and onnx_encoder._OV_INFERRED
    np.testing.assert_array_equal(first, second)


def test_openvinos_batches_are_bucketed_to_a_bounded_set_of_shapes_and_onnx_runtimes_are_exact():
    """OpenVINO keeps kernels per input shape: every (rows, tokens) shape its batching makes for texts
    of 1..256 tokens, in runs of any length, is one of at most ``shape_bound()`` (148), each batch
    holds its texts and at most TOKENS_PER_BATCH padded tokens, a text gets at most 25% more tokens, and
    a batch holds the texts of one bucket. ONNX Runtime's batches stay at their texts' exact shapes."""
    from types import SimpleNamespace

    from mdl_jax.signals.onnx_encoder import TOKENS_PER_BATCH, OnnxEncoder, bucket_tokens, shape_bound

    assert [bucket_tokens(n) for n in (1, 2, 8, 9, 16, 17, 20, 21, 33, 200, 256)] == [1, 2, 8, 10, 16, 20, 20, 24, 40, 224, 256]
    assert all(n <= bucket_tokens(n) <= 1.25 * n for n in range(1, 1025))
    ov = SimpleNamespace(runtime="openvino-bf16", max_seq_length=256)
    ort = SimpleNamespace(runtime="onnxruntime", max_seq_length=256)
    rng = np.random.default_rng(0)
    shapes = set()
    for n in list(range(1, 257)):
        for count in (1, 2, 3, 5, 7, 31, 64, 65, 200):
            lengths = [n] * count
            for rows, L, R in OnnxEncoder.plan(ov, lengths):
                shapes.add((R, L))
                assert L >= max(lengths[k] for k in rows) and R >= len(rows) and R * L <= max(TOKENS_PER_BATCH, L)
    for _ in range(50):  # mixed lengths, as real texts come
        lengths = list(rng.integers(2, 257, size=int(rng.integers(1, 300))))
        plan = OnnxEncoder.plan(ov, lengths)
        assert sorted(k for rows, _, _ in plan for k in rows) == list(range(len(lengths)))
        shapes.update((R, L) for _, L, R in plan)
        for rows, L, R in OnnxEncoder.plan(ort, lengths):
            assert (L, R) == (max(lengths[k] for k in rows), len(rows))
        # a bucketed batch holds one bucket's texts: none is padded to a longer neighbour's width
        assert all(bucket_tokens(int(lengths[k])) == L for rows, L, _ in plan for k in rows)
    assert len(shapes) <= shape_bound() == 148


@pytest.mark.slow
@needs_bf16
def test_openvinos_bucketed_batches_give_the_vectors_of_exact_ones_to_bfloat16_rounding(onnx_cache, monkeypatch):
    from mdl_jax.signals import onnx_encoder

    enc = Embedder(cache_dir=onnx_cache, backend="openvino-bf16").model
    texts = [f"Fact {i}: " + "the river runs north past the old mill " * (i % 9) for i in range(45)] + TEXTS
    bucketed = enc.encode(texts)
    exact_plan = onnx_encoder.OnnxEncoder.plan
    monkeypatch.setattr(enc, "plan", lambda lengths, bs=64: exact_plan(enc, lengths, bs, bucketed=False))
    exact = enc.encode(texts)
    assert (bucketed * exact).sum(1).min() >= 0.9999


@pytest.mark.slow
def test_importing_openvino_through_mdl_jax_sends_no_telemetry(tmp_path):
    """``import openvino`` writes ~/intel/openvino_ga_cid and sends a usage event unless its user opted
    out; the gate loads it by default, so it is imported with its telemetry package unimportable."""
    import subprocess
    import sys

    pytest.importorskip("openvino")
    code = ("import sys; from mdl_jax.signals.onnx_encoder import import_openvino; ov = import_openvino(); "
            "ov.Core(); print('openvino_telemetry' in sys.modules, sys.modules.get('openvino_telemetry', 0) is None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]  # not imported, and nothing left blocking it
    assert not (tmp_path / "intel").exists()
    # the control: a plain import does write it (else this test could not fail)
    subprocess.run([sys.executable, "-c", "import openvino"], timeout=120, env={**os.environ, "HOME": str(tmp_path),
                   "CI": "", "no_proxy": "*", "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9"})
    assert (tmp_path / "intel").exists()


def test_a_bad_embed_backend_is_one_error_naming_it(tmp_path):
    from mdl_jax.gate import MemoryGate

    with pytest.raises(ValueError, match=r"embed_backend: expected one of \['torch', 'onnx'"):
        MemoryGate(cache_dir=tmp_path, embed_backend="tensorrt")
    with pytest.raises(ValueError, match="embed_backend: applies to a named embedder"):
        MemoryGate(embedder=lambda t: np.ones((len(t), 4)), embed_backend="torch")
    pytest.importorskip("ray")
    from mdl_jax.integrations.ray_data import MemoryGateBatch

    with pytest.raises(ValueError, match="embed_backend: 'onnx' runs on the CPU; device='cuda'"):
        MemoryGateBatch(device="cuda", embed_backend="onnx")


def _pipeline(folder, modules=("Transformer", "Pooling"), pooling=None, st=None, bert=None):
    """A model folder's sentence-transformers configs alone (what the ONNX path checks), no weights."""
    import json

    folder.mkdir()
    mods = [{"idx": i, "name": str(i), "path": "" if m == "Transformer" else f"{i}_{m}",
             "type": f"sentence_transformers.models.{m}"} for i, m in enumerate(modules)]
    (folder / "modules.json").write_text(json.dumps(mods))
    for m in mods[1:]:
        (folder / m["path"]).mkdir()
        (folder / m["path"] / "config.json").write_text(json.dumps(pooling if m["path"].endswith("Pooling") else {}))
    for name, cfg in (("config_sentence_transformers.json", st), ("sentence_bert_config.json", bert)):
        if cfg is not None:
            (folder / name).write_text(json.dumps(cfg))
    return folder


def test_onnx_refuses_a_pipeline_it_would_not_reproduce_and_auto_runs_torch_for_it(tmp_path):
    """The ONNX path does a Transformer, one mean / CLS pooling and Normalize: anything else would give
    vectors unlike torch's (a Dense layer's output dimension, a second pooling, a prompt), so
    backend "onnx" refuses it by name and "auto" leaves it to torch."""
    from mdl_jax.signals import onnx_encoder
    from mdl_jax.signals.embeddings import auto_backend

    pytest.importorskip("onnxruntime")
    mean = {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}
    ok = {"old flags, + Normalize": _pipeline(tmp_path / "a", ("Transformer", "Pooling", "Normalize"), mean),
          "sentence-transformers 6 format": _pipeline(tmp_path / "b", pooling={"pooling_mode": "cls",
                                                                                "include_prompt": True})}
    assert [onnx_encoder.model_pooling(f) for f in ok.values()] == ["mean", "cls"]
    assert all(auto_backend(str(f)) == _auto_pick() for f in ok.values())
    refused = {"has a Dense module": _pipeline(tmp_path / "c", ("Transformer", "Pooling", "Dense"), mean),
               r"pools by \['mean', 'max_tokens'\]": _pipeline(
                   tmp_path / "d", pooling={**mean, "pooling_mode_max_tokens": True}),
               "pools by \\['lasttoken'\\]": _pipeline(tmp_path / "e", pooling={"pooling_mode": "lasttoken"}),
               "sets a default prompt": _pipeline(tmp_path / "f", pooling=mean, st={"default_prompt_name": "query"}),
               r"lower-cases its texts": _pipeline(tmp_path / "g", pooling=mean, bert={"do_lower_case": True})}
    for why, folder in refused.items():
        with pytest.raises(ValueError, match=why):
            onnx_encoder.model_pooling(folder)
        assert auto_backend(str(folder)) == "torch", why


def test_the_onnx_path_truncates_where_sentence_transformers_does(tmp_path):
    """Its config's max_seq_length; else the smaller of the tokenizer's model_max_length (1e30 when none
    is stated) and the model's position embeddings."""
    import json
    from types import SimpleNamespace

    from mdl_jax.signals.model_folder import max_seq_length

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    assert max_seq_length(tmp_path, SimpleNamespace(model_max_length=int(1e30))) == 512
    assert max_seq_length(tmp_path, SimpleNamespace(model_max_length=2048)) == 512
    assert max_seq_length(tmp_path, SimpleNamespace(model_max_length=128)) == 128
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    assert max_seq_length(tmp_path, SimpleNamespace(model_max_length=int(1e30))) == 256


@pytest.mark.slow
def test_int8_mixed_probe_rewrite_keeps_the_graph_and_rounds_only_the_int8_channels(onnx_cache, tmp_path):
    """experiments.int8_mixed_probe's graph rewrite: with every input channel kept in float32 it gives
    the float32 graph's vectors (the int8 part is all zeros), with none it stays within per-token int8's
    error (its measured min cosine 0.98 on the bundled texts) and is not float32's, and the hybrid routes
    only all-long batches to int8."""
    from experiments.int8_mixed_probe import _linears, calibrate, hybrid, rewrite
    from mdl_jax.signals import onnx_encoder

    path = Embedder(backend="onnx").load_path
    fp32 = onnx_encoder.export(path, onnx_cache)
    enc = onnx_encoder.OnnxEncoder(path, onnx_cache)
    ref = enc.encode(TEXTS)
    amax = calibrate(fp32, enc._token_ids(TEXTS)[0])
    import onnx

    assert len(amax) == len(_linears(onnx.load(str(fp32)))) == 36  # Q, K, V, out, FFN in, FFN out × 6

    def vecs(k):
        e = onnx_encoder.OnnxEncoder(path, onnx_cache)
        e.graph = rewrite(fp32, amax, k, tmp_path / f"k{k}.onnx")
        e._open()
        return e, e.encode(TEXTS)

    _, all_fp32 = vecs(1536)  # ≥ every linear's input width: no channel is quantised
    assert (all_fp32 * ref).sum(1).min() >= 0.99999
    e0, int8 = vecs(0)
    cos = (int8 * ref).sum(1)
    assert 0.97 <= cos.min() and cos.max() < 0.999999  # rounded, and by no more than the scheme's error
    assert np.isfinite(int8).all()
    h = hybrid(onnx_encoder.OnnxEncoder(path, onnx_cache), e0, min_tokens=10_000)  # nothing is long enough
    np.testing.assert_allclose(h.encode(TEXTS), ref, atol=1e-6)
    h = hybrid(onnx_encoder.OnnxEncoder(path, onnx_cache), e0, min_tokens=1)  # everything is
    np.testing.assert_allclose(h.encode(TEXTS), int8, atol=1e-6)


# -- "auto" when a backend fails: every backend faked (the failure paths), one distinct vector each -------

_WHICH = {"openvino-bf16": 0, "onnx": 1, "torch": 2}


class _Fake:
    """A backend's encoder: unit vector e_i of its backend i; ``fail(texts)`` True raises ``exc``."""

    def __init__(self, backend, fail=lambda texts: False, exc=RuntimeError):
        self.backend, self.fail, self.exc = backend, fail, exc

    def encode(self, texts, **kw):
        if self.fail(texts):
            raise self.exc(f"{self.backend}: cannot infer this batch")
        return np.tile(np.eye(384, dtype=np.float32)[_WHICH[self.backend]], (len(texts), 1))


def _fake_backends(monkeypatch, **fail):
    """"auto" on a CPU declared to have bfloat16, openvino declared installed; each backend a ``_Fake``
    failing where ``fail[backend](texts)`` says."""

    from mdl_jax.signals import embeddings, onnx_encoder

    fakes = {b: _Fake(b, fail.get(b.replace("-", "_"), lambda texts: False)) for b in _WHICH}
    monkeypatch.setattr(onnx_encoder, "load", lambda path, cache, backend, model_id=None: fakes[backend])
    monkeypatch.setattr(embeddings, "load_model", lambda path, device, model_id=None: fakes["torch"])
    _a_bf16_cpu_with_openvino(monkeypatch)
    return fakes


def _which(vecs) -> set[str]:
    return {list(_WHICH)[int(np.argmax(v))] for v in vecs}


def test_a_call_whose_rerun_switches_again_returns_and_remembers_the_last_backends_vectors_alone(tmp_path,
                                                                                                  monkeypatch):
    """OpenVINO fails on one text, ONNX Runtime (the rerun) on the other: the call ends on torch, and every
    vector it returns or remembers is torch's (before: one rerun only, so ONNX Runtime's and torch's mixed)."""
    _fake_backends(monkeypatch, openvino_bf16=lambda t: "new" in " ".join(t), onnx=lambda t: "old" in " ".join(t))
    e = Embedder(cache_dir=tmp_path, backend="auto")
    e.embed(["old"])  # OpenVINO's, cached under its key
    e._memory.clear()  # (as in a new process)
    with pytest.warns(RuntimeWarning):
        out = e.embed(["old", "new"])
    assert e.backend == "torch" and _which(out) == {"torch"}
    assert _which(e._memory.values()) == {"torch"} and _which(e.embed(["new"])) == {"torch"}


def test_counts_stay_one_per_text_when_a_switch_comes_in_a_later_batch_of_the_call(tmp_path, monkeypatch):
    """600 new texts go to the model in steps of 512: OpenVINO encodes the first, fails on the second; the
    call's vectors are all ONNX Runtime's, and ``n_embedded`` counts 600, not 1,112."""
    _fake_backends(monkeypatch, openvino_bf16=lambda t: any(x.startswith("short") for x in t))
    e = Embedder(cache_dir=tmp_path, backend="auto")
    texts = [f"a longer text number {i:04d}" for i in range(512)] + [f"short {i}" for i in range(88)]
    with pytest.warns(RuntimeWarning, match="runs it with onnx instead"):
        out = e.embed(texts)
    assert _which(out) == {"onnx"} and (e.n_embedded, e.n_cached) == (600, 0)


def test_a_memory_error_is_the_callers_and_switches_no_backend(tmp_path, monkeypatch):
    """Out of memory in OpenVINO's inference is raised as is: the next backend would need the memory too,
    and a transient shortage must not demote the process's backend for good."""
    _fake_backends(monkeypatch)
    e = Embedder(cache_dir=tmp_path, backend="auto")
    e._model = _Fake("openvino-bf16", lambda t: True, MemoryError)
    with pytest.raises(MemoryError):
        e.embed(["x"])
    assert e.backend == "openvino-bf16" and Embedder(cache_dir=tmp_path, backend="auto").backend == "openvino-bf16"


def test_a_pass_whose_rows_were_read_before_another_threads_switch_remembers_none_of_them(tmp_path, monkeypatch):
    """Thread A's pass has its OpenVINO rows when thread B switches the Embedder to ONNX Runtime (B's
    switch clears the remembered vectors). A must not write its rows into the memory after that, or a
    later call (A's own rerun first) would get OpenVINO's vectors under ONNX Runtime's key. The switch
    is made from inside A's encode: the interleaving a probe could reach only with a
    tracer, forced."""
    fakes = _fake_backends(monkeypatch)
    e = Embedder(cache_dir=tmp_path, backend="auto")
    ov = fakes["openvino-bf16"]

    class SwitchedMeanwhile:
        def encode(self, texts, **kw):
            out = ov.encode(texts, **kw)
            e._switch("onnx")  # B's switch, after A's rows were computed and before A remembers them
            return out

    e._model = SwitchedMeanwhile()
    out = e.embed(["a", "b"])
    assert e.backend == "onnx" and _which(out) == {"onnx"}  # the call ran again under the new key
    assert set(e._memory) == {"a", "b"} and _which(e._memory.values()) == {"onnx"}
    assert (e.n_embedded, e.n_cached) == (2, 0)


def test_the_model_property_returns_the_encoder_it_read_when_a_switch_lands_between_reads(tmp_path, monkeypatch):
    """``Embedder.model`` reads ``_model`` once: a switch by another thread right after the read (which
    sets ``_model`` to None) cannot make it return None (before, it tested one read and returned a
    second). Forced: the attribute's first read after arming switches it away."""
    fakes = _fake_backends(monkeypatch)

    class RacyReads(Embedder):
        armed = False

        @property
        def _model(self):
            m = self.__dict__.get("_m")
            if self.armed and m is not None:
                self.armed = False
                self.__dict__["_m"] = None  # what another thread's ``_switch`` does, just after this read
            return m

        @_model.setter
        def _model(self, m):
            self.__dict__["_m"] = m

    e = RacyReads(cache_dir=tmp_path, backend="auto")
    e._model = fakes["openvino-bf16"]
    e.armed = True
    assert e.model is fakes["openvino-bf16"] and e.__dict__["_m"] is None
    assert e.model is fakes["openvino-bf16"]  # the next read loads again (the fake's process cache)


def test_the_gateways_bounded_embedder_hands_over_at_inference_and_forgets_the_old_backends_vectors(tmp_path,
                                                                                                     monkeypatch):
    """The gateway keeps vectors in memory (``BoundedEmbedder``): it encodes through its source Embedder,
    so a backend failing at inference hands over there too, and a call after the switch gets none of the
    old backend's kept vectors."""
    from mdl_jax.serving.gateway import BoundedEmbedder

    _fake_backends(monkeypatch, openvino_bf16=lambda t: "b" in t)
    src = Embedder(cache_dir=tmp_path, backend="auto")
    b = BoundedEmbedder.like(src)
    assert _which(b.embed(["a"])) == {"openvino-bf16"}
    with pytest.warns(RuntimeWarning, match="runs it with onnx instead"):
        assert _which(b.embed(["a", "b"])) == {"onnx"}
    assert _which(b.embed(["a"])) == {"onnx"} and _which(b.cache.values()) == {"onnx"}


def test_auto_never_picks_torch_in_a_forked_child_of_an_openvino_process(tmp_path, monkeypatch):
    """Where an ancestor compiled an OpenVINO model (here: declared, as a fork leaves it), torch crashes and
    OpenVINO hangs: "auto" picks ONNX Runtime, and where that cannot run (not installed, or failing to
    load) raises ModelLoadError naming the ways out, for a new Embedder and for a fallback alike."""
    import importlib.util

    from mdl_jax.signals import embeddings, onnx_encoder

    _fake_backends(monkeypatch, onnx=lambda t: True)
    monkeypatch.setattr(onnx_encoder, "_OV_COMPILED_PID", os.getpid() + 1)  # an ancestor's
    assert onnx_encoder.forked_after_openvino()
    e = Embedder(cache_dir=tmp_path, backend="auto")
    assert e.backend == "onnx"  # never OpenVINO here
    with pytest.raises(ModelLoadError, match="no backend that can run in this process.*'spawn'"):
        e.embed(["x"])  # ONNX Runtime fails at inference: no torch after it
    monkeypatch.setattr(embeddings, "_AUTO_FAILED", set())
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    with pytest.raises(ModelLoadError, match="no backend that can run in this process"):
        Embedder(cache_dir=tmp_path, backend="auto")
    assert Embedder(cache_dir=tmp_path, backend="torch").backend == "torch"  # asked for by name: the caller's call


def test_the_emulated_parity_comparison_reports_what_the_two_dumps_differ_by(tmp_path, capsys):
    """``experiments.emulated_parity compare``: the cosines of matching rows, the vectors equal to the bit,
    the share of equal actions, and "met" only within the stated parity."""
    import json

    from experiments import emulated_parity

    rng = np.random.default_rng(0)
    v = rng.normal(size=(4, 384)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    w = v.copy()
    w[0] = (v[0] + 0.05 * v[1]) / np.linalg.norm(v[0] + 0.05 * v[1])  # one vector moved: cos ≈ 0.9988
    np.savez(tmp_path / "a.npz", **{"onnx/vecs": w, "onnx/actions": np.array([0, 1, 2, 3])})
    np.savez(tmp_path / "b.npz", **{"torch/vecs": v, "torch/actions": np.array([0, 1, 2, 2])})
    res = emulated_parity.compare(f"{tmp_path / 'a.npz'}:onnx", f"{tmp_path / 'b.npz'}:torch")
    assert res["n_texts"] == 4 and res["bit_equal_vectors"] == 3 and res["actions_equal"] == 0.75
    assert res["min_cos"] == pytest.approx(float(w[0] @ v[0]), abs=1e-6) and res["min_cos"] < 0.999
    out = capsys.readouterr().out
    assert "parity NOT met" in out and json.loads(out.splitlines()[-1]) == res
    assert emulated_parity.main(["compare", "no-colon.npz", "x"]) == 2  # bad arguments: the usage, exit 2


def _xgetbv_library(tmp_path, name: str, ecx: str = "0"):
    """A shared library of our own whose ``xcr0_low()`` returns XCR0's low half via ``xgetbv`` with ECX =
    ``ecx`` (a C expression); skips where that cannot be built and run (not x86-64, no OSXSAVE, no tools)."""
    import platform
    import shutil
    import subprocess

    cc = shutil.which("gcc") or shutil.which("cc") or shutil.which("g++")  # (CI may have g++ alone)
    if not (cc and shutil.which("objdump") and shutil.which("readelf")):
        pytest.skip("needs a C compiler, objdump and readelf")
    from mdl_jax.engines import native

    if platform.machine() != "x86_64" or not native.numpy_features().get("AVX"):  # (AVX: OSXSAVE and the OS's
        pytest.skip("xgetbv needs an x86-64 CPU with OSXSAVE")                      # YMM state, by CPUID)
    src = tmp_path / f"{name}.c"
    src.write_text("unsigned ecx_arg = 0;\nunsigned xcr0_low(void) { unsigned a, d; "
                   f"__asm__ volatile(\"xgetbv\" : \"=a\"(a), \"=d\"(d) : \"c\"({ecx})); return a; }}\n")
    so = tmp_path / f"lib{name}.so"
    subprocess.run([cc, "-x", "c", "-O2", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    return so


def test_the_avx2_proxy_makes_each_xgetbv_report_no_avx512_state_and_patches_once(tmp_path):
    """``experiments.avx2_proxy`` holds ONNX Runtime to its AVX2 kernels by making every ``xgetbv`` report
    XCR0 = x87 | SSE | AVX: checked on a library of our own, whose function returns XCR0's low half (7
    after the patch, whatever the CPU), with a second patch finding nothing left to change; an
    ``xgetbv`` whose ECX is not shown to be 0 just before it is refused, the library left as it was."""
    import ctypes
    import shutil

    from experiments import avx2_proxy

    so = _xgetbv_library(tmp_path, "x")
    assert ctypes.CDLL(str(so)).xcr0_low() & 0b11 == 0b11  # x87 and SSE state: every x86-64 OS saves them
    assert avx2_proxy.patch_library(so) == 1
    patched = tmp_path / "libx2.so"  # (a new name: the loader would return the library already loaded)
    shutil.copy(so, patched)
    assert ctypes.CDLL(str(patched)).xcr0_low() == 7
    assert avx2_proxy.patch_library(so) == 0  # idempotent: nothing left to patch
    other = _xgetbv_library(tmp_path, "y", ecx="ecx_arg")  # ECX from memory: not a read of XCR0 we can show
    before = other.read_bytes()
    with pytest.raises(ValueError, match="not shown to read XCR0"):
        avx2_proxy.patch_library(other)
    assert other.read_bytes() == before
    assert avx2_proxy.main(["nonsense"]) == 2


def test_the_avx2_proxy_copies_once_per_installed_package_and_refuses_planted_or_patched_names(tmp_path,
                                                                                              monkeypatch):
    """``avx2_proxy.patch``: the copy is made once and made again when the installed package changes; a
    symlink planted at its name is refused, never followed; a source that is itself a patched copy is
    named as such; a failed patch leaves no temporary copy behind. (The package here is a stand-in
    holding one library of our own.)"""
    import importlib.util
    import os

    from experiments import avx2_proxy

    pkg = tmp_path / "site" / "onnxruntime"
    (pkg / "capi").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    _xgetbv_library(tmp_path, "x").rename(pkg / "capi" / "libx.so")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        type("S", (), {"origin": str(pkg / "__init__.py")})() if name == "onnxruntime" else real(name, *a)))
    dest = tmp_path / "dest"
    target = avx2_proxy.patch(dest)
    marker = (target / ".avx2-proxy").read_text()
    assert "'libx.so': 1" in marker and avx2_proxy.patch_library(target / "capi" / "libx.so") == 0
    os.utime(target / "capi" / "libx.so", ns=(1, 1))  # (a change to the copy alone: not the stamp)
    assert avx2_proxy.patch(dest) == target and (target / ".avx2-proxy").read_text() == marker  # kept
    (pkg / "__init__.py").write_text("# another version\n")
    avx2_proxy.patch(dest)
    assert (target / "__init__.py").read_text() == "# another version\n"  # made again
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "onnxruntime").symlink_to(pkg)
    with pytest.raises(SystemExit, match="symlink or not this user's"):
        avx2_proxy.patch(planted)
    (pkg / "capi" / "libbad.so").write_bytes(b"not a library")
    (pkg / "__init__.py").write_text("# a third version\n")
    with pytest.raises(ValueError, match="libbad.so: objdump cannot read it"):
        avx2_proxy.patch(dest)
    assert [p.name for p in dest.iterdir() if p.name.startswith(".onnxruntime-")] == []  # nothing left behind
    (pkg / "capi" / "libbad.so").unlink()
    (pkg / ".avx2-proxy").write_text("a patched copy")
    with pytest.raises(SystemExit, match="already a patched copy"):
        avx2_proxy.patch(tmp_path / "dest2")


def test_the_avx2_proxy_refuses_a_host_it_cannot_hold_to_avx2(tmp_path):
    """A host with AVX-VNNI (ONNX Runtime picks those kernels from CPUID alone, which the patch cannot
    answer) or without AVX2 and FMA is refused with the reason; an AVX-512 host without them is fine."""
    from experiments import avx2_proxy

    def why(flags):
        (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        return avx2_proxy.host_refusal(str(tmp_path / "cpuinfo"))

    assert why("fpu sse2 avx avx2 fma avx512f avx512_vnni avx512_bf16") is None
    assert "avx_vnni" in why("avx avx2 fma avx_vnni avx512f")
    assert "no AVX2 and FMA" in why("sse2 avx")
    assert "cannot read" in avx2_proxy.host_refusal(str(tmp_path / "missing"))


@pytest.mark.slow
@needs_bf16
def test_eight_threads_on_real_runtimes_get_one_backends_vectors_per_call_across_a_switch(onnx_cache, monkeypatch):
    """The switch under load, on the real runtimes (the tests above force each interleaving with fakes):
    8 threads call one "auto" Embedder on OpenVINO bfloat16 while one OpenVINO inference fails, so it
    hands over to ONNX Runtime mid-run. Every call's vectors come from one backend, and afterwards the
    Embedder remembers none of OpenVINO's."""
    import random
    import threading

    from mdl_jax.signals import embeddings

    monkeypatch.setattr(embeddings, "_AUTO_FAILED", set())  # (another test may have failed OpenVINO here)
    words = "the a memory gate relevance risk query store answer model vector policy agent tool".split()
    rng = random.Random(0)
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 30))) + f" {i}" for i in range(1500)]
    e = Embedder(cache_dir=onnx_cache, backend="auto")
    assert e.backend == "openvino-bf16"
    ov = e.model
    seen, lock = [0], threading.Lock()

    class FailsOnce:  # OpenVINO's own encoder, whose sixth inference fails
        _ov_pid = getattr(ov, "_ov_pid", None)

        def encode(self, t, **kw):
            with lock:
                seen[0] += 1
                fail = seen[0] == 6
            if fail:
                raise RuntimeError("openvino: an inference failure, induced")
            return ov.encode(t, **kw)

    e._model = FailsOnce()
    results: list = []

    def worker(k):
        r = random.Random(k)
        for _ in range(10):
            batch = r.sample(texts, r.randint(1, 40))
            results.append((batch, e.embed(batch)))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    with pytest.warns(RuntimeWarning, match="induced; backend 'auto' runs it with onnx instead"):
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert e.backend == "onnx" and len(results) == 80
    every = sorted({t for b, _ in results for t in b})
    ort = dict(zip(every, Embedder(cache_dir=onnx_cache, backend="onnx").embed(every)))
    for batch, out in results:  # ONNX Runtime's vectors to the float32 rounding, or none of them
        is_ort = [float(np.abs(out[i] - ort[t]).max()) < 1e-5 for i, t in enumerate(batch)]
        assert all(is_ort) or not any(is_ort), "a call mixed the two backends' vectors"
    assert all(float(np.abs(v - ort[t]).max()) < 1e-5 for t, v in e._memory.items())
