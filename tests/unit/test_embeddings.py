"""The encoder's two runtimes: queries on ONNX Runtime (the model exported once into the cache),
documents on torch, and the same vectors from both."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hybridsearch.embeddings import MODEL_NAME, SHORT, UNUSED_DAYS, MiniLMEncoder, _onnx_session
from hybridsearch.errors import ConfigError

LONG = " ".join(f"word{i}" for i in range(600))  # over the model's 256 tokens
TEXTS = ["Brouwer fixed point theorem", "Aspirin inhibits the production of PGE2.",
         "what to read before the Gauss-Bonnet theorem", "C*-algebra", LONG]


@pytest.fixture(scope="module")
def torch_only() -> MiniLMEncoder:
    return MiniLMEncoder(runtime="torch")


@pytest.fixture(scope="module")
def made_export(tmp_path_factory) -> Path:
    """One ONNX export, made once for the tests whose point is not its making (about 5 s each)."""
    cache = tmp_path_factory.mktemp("made-export")
    MiniLMEncoder(cache=cache).encode(["x"], query=True)
    (kept,) = cache.iterdir()
    return kept


def keep(made: Path, cache: Path) -> Path:
    """A copy of the made export kept in `cache`, as a first encode there would leave it."""
    cache.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(made, cache / made.name))


def test_queries_run_on_onnxruntime_with_torchs_vectors(tmp_path, torch_only) -> None:
    enc = MiniLMEncoder(cache=tmp_path)
    got = enc.encode(TEXTS, query=True)  # a long text is truncated as torch truncates it
    assert enc.query_runtime == "onnxruntime"
    (kept,) = tmp_path.iterdir()  # exported once, kept in the cache, readable by other users
    assert kept.suffix == ".onnx" and kept.stat().st_mode & 0o777 == 0o644
    want = torch_only.encode(TEXTS, query=True)
    assert torch_only.query_runtime == "torch"
    assert got.shape == want.shape == (len(TEXTS), 384) and got.dtype == np.float32
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert (got * want).sum(axis=1).min() > 0.9999
    # one at a time (no padding) gives the same as in a padded request
    single = np.vstack([enc.encode([t], query=True) for t in TEXTS])
    assert (single * got).sum(axis=1).min() > 0.9999
    # documents, and a query request larger than SHORT, run on the same export, with torch's vectors
    assert (enc.encode(TEXTS) * want).sum(axis=1).min() > 0.9999 and enc.runtime == "onnxruntime"
    batch = [f"{t} {i}" for i in range(SHORT + 1) for t in TEXTS[:1]]
    assert (enc.encode(batch, query=True) * torch_only.encode(batch)).sum(axis=1).min() > 0.9999


def test_a_process_with_a_kept_export_never_imports_torch(tmp_path, made_export) -> None:
    keep(made_export, tmp_path)
    code = ("import sys; from pathlib import Path; from hybridsearch.embeddings import MiniLMEncoder; "
            f"e = MiniLMEncoder(cache=Path({str(tmp_path)!r})); v = e.encode(['Brouwer fixed point theorem'] * 40); "
            "print(e.runtime, v.shape, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["onnxruntime", "(40,", "384)", "False"], out.stderr[-2000:]


def test_the_int8_runtime_is_close_to_float32(tmp_path, torch_only) -> None:
    enc = MiniLMEncoder(cache=tmp_path, runtime="onnx-int8")
    got = enc.encode(TEXTS)
    assert enc.runtime == "onnxruntime-int8"
    agree = (got * torch_only.encode(TEXTS)).sum(axis=1)
    assert agree.min() > 0.97 and agree.max() < 0.99999  # close, and really another model


def test_a_kept_export_is_used_and_a_damaged_one_is_made_again(tmp_path, caplog, torch_only, made_export) -> None:
    kept = keep(made_export, tmp_path)
    before = kept.stat().st_ino
    again = MiniLMEncoder(cache=tmp_path)
    again.encode(["x"], query=True)
    assert again.query_runtime == "onnxruntime" and kept.stat().st_ino == before  # the same file, used again
    kept.write_bytes(b"not an onnx model")
    with caplog.at_level(logging.WARNING, logger="hybridsearch.embeddings"):
        mended = MiniLMEncoder(cache=tmp_path)
        vec = mended.encode(["Brouwer fixed point theorem"], query=True)
    assert f"ONNX Runtime cannot run the kept export {kept}" in caplog.text and "it is made again" in caplog.text
    assert mended.query_runtime == "onnxruntime" and kept.stat().st_size > 1_000_000
    assert [p.name for p in tmp_path.iterdir()] == [kept.name]  # no temporary file left
    assert float(vec[0] @ torch_only.encode(["Brouwer fixed point theorem"])[0]) > 0.9999


def test_without_the_exporter_queries_stay_on_torch(tmp_path, caplog, monkeypatch, torch_only) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)  # the ONNX package not installed
    with caplog.at_level(logging.WARNING, logger="hybridsearch.embeddings"):
        enc = MiniLMEncoder(cache=tmp_path)
        got = enc.encode(TEXTS[:2], query=True)
    assert enc.query_runtime == "torch" and list(tmp_path.iterdir()) == []
    assert "ONNX export failed" in caplog.text and "the model runs on torch" in caplog.text
    assert np.array_equal(got, torch_only.encode(TEXTS[:2]))


def test_the_torch_runtime_exports_nothing(tmp_path, torch_only) -> None:
    enc = MiniLMEncoder(cache=tmp_path, runtime="torch")
    assert np.array_equal(enc.encode(TEXTS[:1], query=True), torch_only.encode(TEXTS[:1]))
    assert enc.query_runtime == enc.runtime == "torch" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("runtime", ["torch", "auto"])
def test_by_default_a_texts_vector_does_not_depend_on_its_batch(runtime, torch_only, tmp_path, made_export) -> None:
    """The default precision (float32) on any CPU and runtime: a document embedded alone, or in a
    batch padded to a long neighbour, gets the same vector, so inline and worker ingests agree."""
    torch_only = torch_only if runtime == "torch" else MiniLMEncoder(cache=keep(made_export, tmp_path).parent)
    assert torch_only.encode(TEXTS[:1]) is not None and torch_only.precision == "float32"
    alone = np.vstack([torch_only.encode([t]) for t in TEXTS])
    batched = torch_only.encode(TEXTS, batch_size=len(TEXTS))
    assert np.abs(alone - batched).max() < 1e-5


def test_a_bfloat16_model_exports_float32_weights(tmp_path, torch_only) -> None:
    enc = MiniLMEncoder(cache=tmp_path, precision="bfloat16")
    doc = enc.encode(TEXTS[:1])  # torch, in bfloat16
    got = enc.encode(TEXTS, query=True)
    assert enc.query_runtime == "onnxruntime"  # from a float32 copy: agrees with float32 torch
    assert (got * torch_only.encode(TEXTS)).sum(axis=1).min() > 0.9999
    assert float(doc[0] @ got[0]) > 0.999


def test_making_an_export_removes_those_unused_for_a_month(tmp_path) -> None:
    month = time.time() - (UNUSED_DAYS + 1) * 86400
    old, recent, unfinished, other, writing = (tmp_path / f"{MODEL_NAME}-{n}" for n in (
        "old.onnx", "recent.onnx", "x.onnxab12.tmp", "notes.txt", "y.onnxcd34.tmp"))
    for p in (old, recent, unfinished, other, writing):
        p.write_bytes(b"x")
    for p in (old, unfinished, other):
        os.utime(p, (month, month))
    MiniLMEncoder(cache=tmp_path).encode(["x"], query=True)
    made = {p for p in tmp_path.iterdir() if p not in (recent, other, writing)}
    assert len(made) == 1 and made.pop().suffix == ".onnx"  # old and unfinished are gone
    assert recent.exists() and other.exists()  # recent exports (another torch) and other files stay
    assert writing.exists()  # an export another process is writing now
    (kept,) = set(tmp_path.glob("*.onnx")) - {recent}
    os.utime(kept, (month, month))
    inode = kept.stat().st_ino
    MiniLMEncoder(cache=tmp_path).encode(["x"], query=True)  # a use touches the kept export
    assert kept.stat().st_ino == inode and time.time() - kept.stat().st_mtime < 3600


def test_an_unusable_cache_leaves_the_export_in_memory(tmp_path, caplog, monkeypatch, torch_only) -> None:
    cache = tmp_path / "cache"
    real_exists = Path.exists

    def denied(self: Path) -> bool:  # a cache directory another user owns (root passes every check)
        if self.parent == cache:
            raise PermissionError(13, "Permission denied", str(self))
        return real_exists(self)

    monkeypatch.setattr(Path, "exists", denied)
    with caplog.at_level(logging.WARNING, logger="hybridsearch.embeddings"):
        enc = MiniLMEncoder(cache=cache)
        got = enc.encode(TEXTS[:2], query=True)
    assert f"cannot use the ONNX export cache {cache}" in caplog.text and "made in memory" in caplog.text
    assert enc.query_runtime == "onnxruntime" and not real_exists(cache)  # nothing written there
    assert (got * torch_only.encode(TEXTS[:2])).sum(axis=1).min() > 0.9999


def test_a_damaged_export_that_cannot_be_removed_does_not_stop_queries(tmp_path, caplog, monkeypatch,
                                                                        made_export) -> None:
    kept = keep(made_export, tmp_path)
    kept.write_bytes(b"not an onnx model")

    def denied(self: Path, missing_ok: bool = False) -> None:  # another user's file in a shared cache
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "unlink", denied)
    with caplog.at_level(logging.WARNING, logger="hybridsearch.embeddings"):
        enc = MiniLMEncoder(cache=tmp_path)
        enc.encode(["x"], query=True)
        enc.encode(["y"], query=True)
    assert enc.query_runtime == "onnxruntime" and caplog.text.count("cannot use the ONNX export cache") == 1


def test_the_export_is_shared_by_environments_with_the_same_model(tmp_path, made_export) -> None:
    kept = keep(made_export, tmp_path / "cache")
    enc = MiniLMEncoder(cache=tmp_path / "cache")
    enc.encode(["x"], query=True)
    inode = kept.stat().st_ino
    weights = Path(enc._model_dir) / "model.safetensors"  # another virtualenv: the same file, another mtime
    other = tmp_path / "other-env"
    other.mkdir()
    with (other / "model.safetensors").open("wb") as f:
        f.truncate(weights.stat().st_size)
    for name in ("tokenizer.json", "sentence_bert_config.json"):
        shutil.copy(weights.parent / name, other / name)
    assert _onnx_session(enc, other, tmp_path / "cache")[0] is not None
    assert [p.stat().st_ino for p in (tmp_path / "cache").iterdir()] == [inode]  # used, not made again


def test_runtime_is_validated() -> None:
    with pytest.raises(ConfigError, match="embedding runtime must be one of auto, torch, onnx-int8; got 'gpu'"):
        MiniLMEncoder(runtime="gpu")  # type: ignore[arg-type]


def test_one_string_is_refused_and_an_array_of_texts_is_read(encoder) -> None:
    """A str is a sequence of one-character texts: encode("abc") gave three vectors."""
    import numpy as np
    import pytest

    with pytest.raises(ValueError, match=r"not one string: encode\(\[text\]\)"):
        encoder.encode("compact space")
    got = encoder.encode(np.array(["compact space", "prime"]))
    assert got.shape == (2, 384) and np.allclose(got, encoder.encode(["compact space", "prime"]), atol=1e-6)
