"""Settings from the environment (prefix HYBRIDSEARCH_; nested plugin config uses "__")."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _user_cache() -> Path:
    """$XDG_CACHE_HOME, else ~/.cache; the system's temporary directory where there is no home."""
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"])
    try:
        return Path.home() / ".cache"
    except (RuntimeError, KeyError):
        import tempfile

        return Path(tempfile.gettempdir())


class Settings(BaseSettings):
    # an empty variable (`${UNSET}` in a compose file) is unset, never an empty path such as "."
    model_config = SettingsConfigDict(env_prefix="HYBRIDSEARCH_", env_nested_delimiter="__",
                                      extra="ignore", env_ignore_empty=True)

    index_dir: Path = Path(".hybridsearch/index")
    lexicon: str = Field(default="", description="variant lexicon files added to the bundled one (os.pathsep-"
                         "separated); an index records the lexicon it was analysed with and refuses another")
    redis_url: str | None = None
    # Celery workers
    worker_visibility_timeout: int = Field(default=3600, ge=1, description="seconds before Redis redelivers a "
                                           "task whose worker vanished; must exceed the longest batch")
    worker_max_retries: int = Field(default=5, ge=0, description="retries of a task after a transient error")
    worker_max_lost: int = Field(default=3, ge=1, description="times the process running a batch may die before "
                                 "the batch is dead-lettered instead of delivered again")
    worker_retry_backoff_max: int = Field(default=300, ge=1, description="longest wait between retries, seconds")
    worker_task_expires: int = Field(default=86_400, ge=1, description="seconds a queued backfill task and a "
                                     "task result stay valid")
    worker_job_ttl: int = Field(default=7 * 86_400, ge=60, description="seconds a job's state stays in Redis")
    worker_stall_warning: float = Field(default=60.0, gt=0, allow_inf_nan=False, description="seconds without "
                                        "progress before a followed job warns that it may have no worker")
    worker_concurrency: int | None = Field(default=None, ge=1, description="worker processes (default: CPUs)")
    embedding_batch_size: int = Field(default=32, ge=1, description="texts per model batch of the encoder")
    ingest_hdc_process: bool | None = Field(default=None, description="encode HDC codes in a helper process, a "
                                            "batch ahead of the one being written (default: where the process "
                                            "may use two cores or more and the input holds four batches or more)")
    embedding_precision: Literal["auto", "float32", "bfloat16"] = Field(
        default="float32", description="float32: the same vectors (to float rounding) on every CPU and however a "
        "corpus is batched; bfloat16 (auto: where the CPU computes it natively) is 1.8x to 2.8x faster, but its "
        "vectors (cosine 0.9999 to float32's) vary with batch composition, so scores depend on a corpus's chunking")
    embedding_runtime: Literal["auto", "torch", "onnx-int8"] = Field(
        default="auto", description="auto: documents and queries run on ONNX Runtime, the float32 model exported "
        "once into embedding_cache with its attention fused (the same vectors as torch; about 1.2x to 1.3x torch's "
        "throughput), torch where that cannot be made; torch: everything on torch; onnx-int8: an int8-quantised "
        "export, about 1.5x to 1.7x float32 on a 2-core CPU with cosine about 0.993 to its vectors (embed the "
        "corpus and search it with the same runtime)")
    encoder: str = Field(default="minilm", description="the encoder plugin (group hybridsearch.encoders): minilm "
                         "(all-MiniLM-L6-v2 from its package), sentence-transformers (any local model directory, "
                         "encoder_model_dir), or a third party's")
    encoder_model_dir: Path | None = Field(default=None, description="the model directory of the "
                                           "sentence-transformers encoder")
    cross_encoder_model_dir: Path | None = Field(default=None, description="a local cross-encoder model "
                                                 "directory for the cross-encoder reranker (the voicevault "
                                                 "profile's step); without one its fused order stands")
    passage_vectors: Literal["separate", "pooled"] = Field(
        default="separate", description="separate: each passage (the title, each sentence) is embedded alone; "
        "pooled: from the token embeddings of its chunk's own forward pass (one pass per chunk; the passages past "
        "the model's 256 word pieces alone), where the encoder can (the default runtime)")
    embedding_cache_max_mb: int = Field(default=4096, ge=0, description="size of the embedding cache (every "
                                        "chunk's vectors by encoder and text, in embedding_cache) before the "
                                        "least recently used entries go; 0: no cache")
    embedding_cache: Path = Field(default_factory=lambda: _user_cache() / "hybridsearch",
                                  description="where the encoder keeps its ONNX export and the embedding cache "
                                  "(default: $XDG_CACHE_HOME or ~/.cache, then hybridsearch)")
    intent_classifier: str = Field(default="rules", description="the query-intent plugin (group "
                                   "hybridsearch.intents): lookup, survey, compare, prereq or related")
    search_max_k: int = Field(default=10_000, ge=1, description="the most results one search may ask for")
    domain_sample: int = Field(default=5000, ge=2, le=10_000, description="stored vectors the domain check "
                               "reads to find an index's centroid and its farthest document (profiles' domain_check)")
    open_licenses: list[str] = Field(default_factory=lambda: [
        "CC0-1.0", "CC-BY-4.0", "CC-BY-SA-4.0", "CC-BY-NC-4.0", "CC-BY-NC-SA-4.0", "CC-BY-3.0", "CC-BY-2.0",
        "public-domain"], description="licences of the `open` class (a JSON list); every other document, "
        "those without a licence included, is `restricted`")
    # HTTP query service (hybridsearch serve)
    http_max_body: int = Field(default=64 * 1024, ge=1024, description="largest request body, bytes (413 above)")
    http_max_query_chars: int = Field(default=2000, ge=1, description="longest query text (422 above)")
    http_rate_limit: float = Field(default=50.0, gt=0, allow_inf_nan=False, description="requests per second "
                                   "per API key (429 with Retry-After above)")
    http_rate_burst: int = Field(default=100, ge=1, description="requests a key may send at once")
    http_workers: int | None = Field(default=None, ge=1, description="server processes of `hybridsearch serve`, "
                                     "each with its own model and its share of the cores (default: the cores "
                                     "this process may use)")
    http_shutdown_grace: float = Field(default=30.0, gt=0, allow_inf_nan=False, description="seconds in-flight "
                                       "requests get to finish on SIGTERM")
    # citation graph (indexer/graph.py)
    graph_damping: float = Field(default=0.85, gt=0.0, lt=1.0, description="PageRank damping factor")
    graph_cocited_max: int = Field(default=20, ge=0, description="co-cited works kept per work")
    exact_dense_max: int = Field(default=200_000, ge=0, description="vectors an embedded index searches "
                                 "exactly before it switches to inverted lists (IVF)")
    dense_nprobe: int = Field(default=64, ge=1, le=65_536, description="inverted lists an embedded IVF search "
                              "scans, of 512 at 200k vectors and 1,024 at 1M (bench/scale.py at 1M clustered "
                              "vectors, 1,024 lists: recall@10 0.995 at 64, p50 5.3 ms)")
    torch_threads: int | None = Field(default=None, ge=1, description="threads of the encoder, torch and ONNX "
                                      "Runtime alike (default: the cores this process may run on)")

    # query log: one record per search from the CLI and the Python API
    query_log: bool = Field(default=True, description="write the query log")
    query_log_dir: Path | None = Field(default=None, description="JSONL directory for the query log; default: "
                                       "<index dir>/querylog on the embedded engine, daily indices on OpenSearch")
    query_log_buffer: int = Field(default=10_000, ge=1, description="records held before new ones are dropped")
    query_log_batch: int = Field(default=500, ge=1, description="records per write")
    query_log_prefix: str = Field(default="hybridsearch-queries-", description="name prefix of the daily "
                                  "query-log indices on OpenSearch (<prefix>YYYY.MM.DD); their index template, "
                                  "deletion policy, `logs prune` and the dashboards' index pattern follow it")

    # OpenSearch engine (a cluster, or the local node that `hybridsearch opensearch start` runs)
    opensearch_url: str | None = None
    opensearch_username: str | None = None
    opensearch_password: SecretStr | None = None
    opensearch_verify_certs: bool = True
    opensearch_ca_certs: Path | None = None
    opensearch_timeout: float = Field(default=30.0, gt=0)
    opensearch_retry_s: float = Field(default=30.0, ge=0, description="with several URLs (the nodes of a "
                                      "cluster): seconds a request that meets a lost node (refused, reset, or "
                                      "502/503/504 while the cluster recovers) is tried again on the other nodes, "
                                      "with backoff, before it fails")
    opensearch_shards: int | None = Field(default=None, ge=1, le=1024, description="primary shards of a new "
                                          "logical index (default: the chunk template's, 1)")
    opensearch_replicas: int | None = Field(default=None, ge=0, le=32, description="replicas of each shard of a new "
                                            "logical index and its graph index (default: the chunk template's, 0); "
                                            "a cluster of N nodes holds up to N - 1")
    opensearch_index: str = "hybridsearch"
    opensearch_knn_engine: Literal["lucene", "faiss"] = "lucene"
    opensearch_vector_compression: Literal["1x", "4x", "32x"] = Field(
        default="1x", description="the dense vectors of a new OpenSearch index (lucene engine, OpenSearch 3.x): "
        "1x float32; 4x quantised to 7 bits, 32x to 1 bit, searched on those and rescored with the float32 "
        "vectors kept on disk")
    opensearch_ef_search: int = Field(default=100, ge=1, le=10_000, description="vectors an HNSW search examines "
                                      "at least (query-time ef_search; more for a larger k)")
    opensearch_bulk_docs: int = Field(default=250, ge=1, description="documents per bulk request")
    opensearch_bulk_threads: int = Field(default=2, ge=1, description="bulk requests in flight at once")
    opensearch_bulk_bytes: int = Field(default=10 * 1024 * 1024, ge=1024, description="bytes per bulk request")
    opensearch_bulk_retries: int = Field(default=5, ge=0, description="retries of items rejected with 429")
    opensearch_write_block_wait: float = Field(default=600.0, ge=0, description="seconds a write waits while "
                                               "`indices reindex` has the index write-blocked")
    opensearch_reindex_slices: int = Field(default=2, ge=1, description="parallel slices of `indices reindex`")
    opensearch_snapshot_repo: str = Field(default="hybridsearch", description="snapshot repository of the "
                                          "`snapshot` commands")
    opensearch_snapshot_timeout: float = Field(default=3600.0, gt=0, description="seconds `snapshot create` and "
                                               "`snapshot restore` wait for the node to finish one")
    require_opensearch: bool = Field(default=False, description="tests: a missing node fails instead of skipping")

    # the local node (hybridsearch opensearch start|stop|status)
    opensearch_home: Path | None = Field(default=None, description="cache of the node's distribution and "
                                         "data; default ~/.cache/hybridsearch/opensearch, or "
                                         "/var/cache/hybridsearch/opensearch as root")
    opensearch_port: int | None = Field(default=None, ge=1, le=65535, description="default: a free port")
    opensearch_version: str = Field(default="3.6.0", description="the OpenSearch release of a new local node: "
                                    "3.6.0 (Java 21 or newer) or 2.19.1 (Java 11..21); a node keeps the release "
                                    "its data was written by")
    opensearch_heap: str = "1g"
    opensearch_java_home: Path | None = None
    opensearch_start_timeout: float = Field(default=180.0, gt=0)

    @field_validator("query_log_prefix")
    @classmethod
    def _index_prefix(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,200}", value):
            raise ValueError("not an index-name prefix (lower-case letters, digits, '-', '_' and '.', starting "
                             "with a letter or digit)")
        return value


_cache: tuple[tuple[tuple[str, str], ...], Settings] | None = None


def get_settings() -> Settings:
    """The settings from the environment; a bad value is one ConfigError naming its variable.
    Built again only when a HYBRIDSEARCH_* variable changed (building them costs milliseconds,
    and the query path asks for them on every search)."""
    global _cache
    from pydantic import ValidationError

    from hybridsearch.errors import ConfigError

    # the environment's own mapping (os.environ decodes each name and value in Python: 0.07 ms a
    # call); its names are bytes on POSIX, str elsewhere
    raw: Any = getattr(os.environ, "_data", os.environ)
    prefix = Settings.model_config["env_prefix"]
    prefixes = (prefix, prefix.encode())
    env = tuple(sorted((k, v) for k, v in raw.items() if k[:len(prefix)].upper() in prefixes))
    if _cache is not None and _cache[0] == env:
        return _cache[1]
    try:
        settings = Settings()
        _cache = (env, settings)
        return settings
    except ValidationError as e:
        err = e.errors()[0]
        name = "HYBRIDSEARCH_" + "__".join(str(p) for p in err["loc"]).upper()
        raise ConfigError(f"{name}: {err['msg']} (got {err.get('input')!r})") from e
