"""Settings from the environment (prefix HYBRIDSEARCH_; nested plugin config uses "__")."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HYBRIDSEARCH_", env_nested_delimiter="__",
                                      extra="ignore")

    index_dir: Path = Path(".hybridsearch/index")
    opensearch_url: str | None = None
    redis_url: str | None = None
    embedding_batch_size: int = Field(default=64, ge=1)
    exact_dense_max: int = Field(default=200_000, ge=0)
    torch_threads: int | None = Field(default=None, ge=1)


def get_settings() -> Settings:
    return Settings()
