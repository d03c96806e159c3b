"""Exception hierarchy: every error the library raises on purpose is a HybridSearchError."""

from __future__ import annotations

from typing import Any


class HybridSearchError(Exception):
    """Base class for all hybridsearch errors."""


class ConfigError(HybridSearchError):
    """Invalid configuration or settings."""


class ValidationError(HybridSearchError):
    """Bad input. Names the record (file and line) and the field when they are known."""

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        source: str | None = None,
        line: int | None = None,
        record: str | None = None,
    ) -> None:
        self.message = message
        self.field = field
        self.source = source
        self.line = line
        self.record = record
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.source is not None:
            where.append(self.source if self.line is None else f"{self.source}:{self.line}")
        elif self.line is not None:
            where.append(f"line {self.line}")
        if self.record is not None:
            where.append(f"record {self.record!r}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        return f"{', '.join(where)}: {self.message}" if where else self.message

    def located(self, *, source: str | None = None, line: int | None = None) -> ValidationError:
        """A copy of this error with the file and line filled in."""
        return ValidationError(
            self.message,
            field=self.field,
            source=source if source is not None else self.source,
            line=line if line is not None else self.line,
            record=self.record,
        )


class PluginError(HybridSearchError):
    """A plugin could not be loaded or registered."""


class PluginNotFoundError(PluginError):
    """No plugin of that name is registered."""


class PluginConflictError(PluginError):
    """Two plugins claim the same name."""


class EngineError(HybridSearchError):
    """The engine failed."""


class EngineUnavailableError(EngineError):
    """The engine cannot be reached or opened."""


class IndexNotFoundError(EngineError):
    """The index does not exist."""


class BulkWriteError(EngineError):
    """Some items of a bulk write failed; `.failures` maps item id to reason."""

    def __init__(self, message: str, failures: dict[str, Any]) -> None:
        self.failures = failures
        super().__init__(message)


class UnsupportedCapabilityError(HybridSearchError):
    """The engine does not provide the capability a channel needs."""


class QueryError(HybridSearchError):
    """A query could not be run."""
