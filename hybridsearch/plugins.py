"""Entry-point plugin registry. Built-ins register through the same entry points as third parties."""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from hybridsearch.errors import PluginConflictError, PluginNotFoundError

GROUPS = ("engines", "channels", "fusers", "rerankers", "profiles", "loaders", "intents", "encoders")
_cache: dict[tuple[str, str], Any] = {}


def _group(group: str) -> str:
    if group not in GROUPS:
        raise PluginNotFoundError(f"unknown plugin group {group!r}; valid: {', '.join(GROUPS)}")
    return f"hybridsearch.{group}"


@cache
def _entries(group: str) -> dict[str, EntryPoint]:
    """The group's installed entry points, read once per process: reading them scans every
    installed distribution's metadata (about 8 ms here), too slow for a check on each request."""
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=_group(group)):
        if ep.name in found and found[ep.name].value != ep.value:
            raise PluginConflictError(
                f"two {group} plugins are named {ep.name!r}: {found[ep.name].value} and {ep.value}")
        found[ep.name] = ep
    return found


_registered: dict[tuple[str, str], Any] = {}


def register(group: str, name: str, obj: Any) -> None:
    """Register a plugin in-process (as an entry point would); a taken name is a conflict."""
    _group(group)
    if name in _entries(group) or (group, name) in _registered:
        raise PluginConflictError(f"a {group[:-1]} named {name!r} is already registered")
    _registered[(group, name)] = obj


def names(group: str) -> list[str]:
    """Registered plugin names of a group, sorted."""
    return sorted(set(_entries(group)) | {n for g, n in _registered if g == group})


def require(group: str, name: str) -> None:
    """Raise PluginNotFoundError, naming the valid names, unless `name` is registered in `group`."""
    valid = names(group)
    if name not in valid:
        raise PluginNotFoundError(f"no {group[:-1]} named {name!r}; valid: {', '.join(valid) or 'none'}")


def load(group: str, name: str, protocol: type | None = None) -> Any:
    """Load a plugin by name, once; check it against `protocol` when given."""
    key = (group, name)
    if key in _registered:
        return _registered[key]
    if key not in _cache:
        require(group, name)
        entries = _entries(group)
        obj = entries[name].load()
        if protocol is not None and not (
            isinstance(obj, protocol) or (isinstance(obj, type) and issubclass(obj, protocol))
        ):
            raise PluginNotFoundError(
                f"{group[:-1]} {name!r} ({entries[name].value}) does not implement {protocol.__name__}")
        _cache[key] = obj
    return _cache[key]
