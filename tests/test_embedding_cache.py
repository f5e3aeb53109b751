"""The embedding cache (``mdl_jax.signals.embedding_cache``): a damaged or foreign file set aside and
rebuilt, links and planted files not opened, a read-only cache read and not written."""


import numpy as np
import pytest

from mdl_jax.signals.embeddings import Embedder


def _filled_cache(folder, texts):
    """A cache folder holding the real MiniLM's vectors of ``texts`` after 2,000 rows of filler (so the
    texts' own rows sit in the file's second half), checkpointed into the one database file."""
    import sqlite3

    e = Embedder(cache_dir=folder)
    filler = [f"filler text number {i}" for i in range(2000)]
    e.cache.put(e.model_id, filler, np.random.default_rng(0).normal(size=(2000, 384)).astype(np.float32))
    vecs = e.embed(texts)
    e.cache.close()
    db = sqlite3.connect(folder / "embeddings.sqlite")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return vecs


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["random bytes", "cut in half"])
def test_a_damaged_cache_is_set_aside_with_a_warning_and_rebuilt(tmp_path, damage):
    import os

    texts = ["Is raw cookie dough safe to eat?", "Raw flour can carry E. coli", "Paris is in France"]
    want = _filled_cache(tmp_path, texts)
    db = tmp_path / "embeddings.sqlite"
    size = db.stat().st_size
    db.write_bytes(os.urandom(size) if damage == "random bytes" else db.read_bytes()[: size // 2])
    with pytest.warns(RuntimeWarning, match=rf"embedding cache {db} is damaged \(.*\); it was set aside as "
                                            r"embeddings\.sqlite\.corrupt-\d{8}T\d{6}Z-\d+ and a new cache"):
        e = Embedder(cache_dir=tmp_path)
        got = e.embed(texts)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert e.n_embedded == 3
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("embeddings.sqlite.corrupt-")]
    assert len(aside) == 1
    again = Embedder(cache_dir=tmp_path)  # the rebuilt cache serves what was embedded again
    np.testing.assert_array_equal(again.embed(texts), got)
    assert again.n_cached == 3 and again.n_embedded == 0


def test_a_cache_whose_pages_are_damaged_is_set_aside_by_the_read_that_meets_it(tmp_path):
    """Without a model: a file whose first page is whole opens, and the damage behind it is met by the
    first read, which sets it aside and finds nothing; the next write lands in a new file."""
    import warnings

    from mdl_jax.signals.embeddings import EmbeddingCache

    db = tmp_path / "embeddings.sqlite"
    c = EmbeddingCache(db)
    texts = [f"text {i}" for i in range(600)]
    c.put("m", texts, np.ones((600, 8), np.float32))
    c.close()  # (the last connection's close folds the WAL into the file)
    main = db.read_bytes()
    db.write_bytes(main[:4096] + bytes(len(main) - 4096))  # every page after the first zeroed, size kept
    c = EmbeddingCache(db)
    with pytest.warns(RuntimeWarning, match="is damaged .* set aside as embeddings.sqlite.corrupt-"):
        assert c.get("m", texts) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c.put("m", texts[:2], np.ones((2, 8), np.float32))
        assert len(c.get("m", texts)) == 2
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("embeddings.sqlite.corrupt-")]) == 1


def _foreign_database(folder):
    """Another program's SQLite file at ``folder/embeddings.sqlite``: tables ``emb`` and ``dims`` without
    the cache's columns, one row of its own."""
    import sqlite3

    db = folder / "embeddings.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE emb (id INTEGER PRIMARY KEY, payload TEXT)")
    con.execute("CREATE TABLE dims (id INTEGER)")
    con.execute("INSERT INTO emb (payload) VALUES ('theirs')")
    con.commit()
    con.close()
    return db


def test_a_file_by_the_caches_name_with_other_tables_is_set_aside_not_read_by_missing_columns(tmp_path):
    """Another program's database (or another format) at ``embeddings.sqlite``: its ``emb`` lacks the
    cache's columns, and a read failed with SQLite's "no such column"; it is set aside as a damaged file
    is (renamed, kept) and a new cache is built."""
    import sqlite3

    from mdl_jax.signals.embeddings import EmbeddingCache

    db = _foreign_database(tmp_path)
    with pytest.warns(RuntimeWarning, match=r"is damaged \(not the cache's tables: emb has the columns \(id, "
                                            r"payload\), expected \(model, key, vec\)\); it was set aside as"):
        c = EmbeddingCache(db)
    c.put("m", ["a"], np.ones((1, 4), np.float32))
    assert len(c.get("m", ["a"])) == 1
    c.close()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("embeddings.sqlite.corrupt-")]
    assert len(aside) == 1
    assert sqlite3.connect(aside[0]).execute("SELECT payload FROM emb").fetchall() == [("theirs",)]


def test_a_link_at_the_cache_file_or_a_planted_file_is_not_opened(tmp_path):
    """A symbolic link at ``embeddings.sqlite`` would have SQLite create or write a database wherever it
    points; another user's file in a folder others may write could hold any vectors. Neither is
    opened: the process caches in memory, with a warning that says why."""
    import os

    from mdl_jax.signals.embeddings import EmbeddingCache

    victim = tmp_path / "victim"
    victim.write_bytes(b"")
    for target in (victim, tmp_path / "made-elsewhere.db"):
        folder = tmp_path / f"cache-{target.name}"
        folder.mkdir()
        (folder / "embeddings.sqlite").symlink_to(target)
        with pytest.warns(RuntimeWarning, match="it is a symbolic link .*in memory only"):
            c = EmbeddingCache(folder / "embeddings.sqlite")
        c.put("m", ["hello"], np.ones((1, 4), np.float32))
        assert len(c.get("m", ["hello"])) == 1   # still a working cache, in memory
    assert victim.read_bytes() == b"" and not (tmp_path / "made-elsewhere.db").exists()
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return   # handing a file to another user takes root
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)   # like /tmp: anyone may create names in it
    planted = EmbeddingCache(shared / "embeddings.sqlite")
    planted.put("m", ["hello"], np.full((1, 4), 9.0, np.float32))
    planted.close()
    os.chown(shared / "embeddings.sqlite", 65534, 65534)
    with pytest.warns(RuntimeWarning, match="belongs to another user .* in a folder others may write"):
        c = EmbeddingCache(shared / "embeddings.sqlite")
    assert c.get("m", ["hello"]) == {}
    private = tmp_path / "private"   # only its owner (or we) could have put it there: read as it is
    private.mkdir(mode=0o755)
    (shared / "embeddings.sqlite").rename(private / "embeddings.sqlite")
    assert len(EmbeddingCache(private / "embeddings.sqlite").get("m", ["hello"])) == 1


def test_a_missing_cache_folder_is_made_private(tmp_path):
    import os

    from mdl_jax.signals.embeddings import EmbeddingCache

    old = os.umask(0)
    try:
        EmbeddingCache(tmp_path / "a" / "b" / "embeddings.sqlite").close()
    finally:
        os.umask(old)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700 and (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o700


def test_setting_a_damaged_cache_aside_never_sets_aside_the_one_rebuilt_in_its_place(tmp_path, monkeypatch):
    """Two processes meet the same damaged file: the first sets it aside and builds a new one; the
    second, whose open failed on the old file, must go on with the new one, not set it aside too (its
    rows would be lost)."""
    import warnings

    from mdl_jax.signals import embedding_cache as ec

    db = tmp_path / "embeddings.sqlite"
    db.write_bytes(b"not a database, " * 512)
    real_open = ec.EmbeddingCache._open_writable
    state = {"first": True}

    def open_then_lose_the_race(self):
        if state.pop("first", False):
            try:
                return real_open(self)
            except ec.sqlite3.DatabaseError:
                # meanwhile the other process sets the damaged file aside and builds a healthy one
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    other = ec.EmbeddingCache(tmp_path / "other.sqlite")
                other.put("m", ["kept"], np.ones((1, 4), np.float32))
                other.close()
                db.rename(tmp_path / "embeddings.sqlite.corrupt-by-the-other")
                (tmp_path / "other.sqlite").rename(db)
                raise
        return real_open(self)

    monkeypatch.setattr(ec.EmbeddingCache, "_open_writable", open_then_lose_the_race)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # nothing of ours is set aside: no warning
        c = ec.EmbeddingCache(db)
    assert len(c.get("m", ["kept"])) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if "corrupt" in p.name) == ["embeddings.sqlite.corrupt-by-the-other"]


def _read_only(folder):
    """Make ``folder`` unwritable to this process (as root, whom modes do not stop: immutable);
    returns the undo, or skips where neither can be done."""
    import os
    import subprocess

    if os.geteuid() != 0:
        os.chmod(folder, 0o555)
        return lambda: os.chmod(folder, 0o755)
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
        pytest.skip("running as root on a file system without chattr +i: no folder is read-only to root")
    return lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_read_only_file_by_the_caches_name_with_other_tables_is_not_read(tmp_path):
    from mdl_jax.signals.embeddings import EmbeddingCache

    db = _foreign_database(tmp_path)
    undo = _read_only(tmp_path)
    try:
        with pytest.warns(RuntimeWarning, match=r"is damaged \(not the cache's tables: .*\) and cannot be "
                                                r"written .*in memory only"):
            c = EmbeddingCache(db)
        assert c.get("m", ["a"]) == {}
        c.put("m", ["a"], np.ones((1, 4), np.float32))
        assert len(c.get("m", ["a"])) == 1
    finally:
        undo()


@pytest.mark.slow
def test_a_read_only_cache_is_read_and_not_written(tmp_path):
    texts = ["Is raw cookie dough safe to eat?", "Raw flour can carry E. coli"]
    want = _filled_cache(tmp_path, texts)
    before = sorted(p.name for p in tmp_path.iterdir())
    undo = _read_only(tmp_path)
    try:
        e = Embedder(cache_dir=tmp_path)
        assert e.cache.read_only
        np.testing.assert_array_equal(e.embed(texts), want)
        assert e.n_cached == 2 and e.n_embedded == 0
        with pytest.warns(RuntimeWarning, match=r"cannot be written \(read-only\): its vectors are read, and "
                                                r"the new ones are not stored"):
            new = e.embed(["A text that is not cached"])
        assert new.shape == (1, 384) and e.n_embedded == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == before
    finally:
        undo()
