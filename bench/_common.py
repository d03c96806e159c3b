"""Checks the bench scripts run before any work (argument types, the dataset, programs on PATH, the
OpenSearch node), cleanup steps that warn instead of raising, the met/MISSED verdict of their tables,
and one `error:` line (exit status 2) for a HybridSearchError."""

from __future__ import annotations

import argparse
import math
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from hybridsearch.embeddings import usable_cores
from hybridsearch.errors import ConfigError, HybridSearchError

# the CPU features a benchmark reports: what decides which runtimes and precisions are native
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def cpu_line() -> str:
    """The cores this process may use and the CPU features found, as one line."""
    try:
        have = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        have = set()
    found = ", ".join(f for f in CPU_FLAGS if f in have) or "none of " + ", ".join(CPU_FLAGS)
    return f"{usable_cores()} usable cores; CPU features: {found}"


def _int_from(value: str, lowest: int, what: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = lowest - 1
    if n < lowest:
        raise argparse.ArgumentTypeError(f"{what}, got {value!r}")
    return n


def positive_int(value: str) -> int:
    """An argparse type: a whole number above 0."""
    return _int_from(value, 1, "a whole number above 0")


def count(value: str) -> int:
    """An argparse type: a whole number, 0 or more."""
    return _int_from(value, 0, "a whole number, 0 or more")


def grid_step(value: str) -> float:
    """An argparse type: the step of a weight grid, a number in (0, 1] that divides 1 evenly (so that
    every grid point's weights sum to 1)."""
    try:
        step = float(value)
    except ValueError:
        step = math.nan
    if not (math.isfinite(step) and 0 < step <= 1 and math.isclose(round(1 / step) * step, 1, abs_tol=1e-9)):
        raise argparse.ArgumentTypeError(f"a step in (0, 1] that divides 1 evenly (0.05, 0.1, 0.25 ...), got {value!r}")
    return step


def dataset_dir(value: str) -> Path:
    """An argparse type: a BEIR dataset directory (one holding corpus.jsonl)."""
    path = Path(value)
    if not (path / "corpus.jsonl").is_file():
        raise argparse.ArgumentTypeError(f"{value}: not a BEIR dataset directory (no corpus.jsonl)")
    return path


def program(name: str) -> str:
    """The path of the program `name` on PATH; a ConfigError when there is none."""
    found = shutil.which(name)
    if found is None:
        raise ConfigError(f"{name} is not on PATH; install it or add its directory to PATH")
    return found


def node_version(url: str) -> str:
    """The version of the OpenSearch node at `url`; one-line HybridSearchError when it does not answer."""
    from hybridsearch.config import get_settings
    from hybridsearch.engines.opensearch.engine import display_url, make_client, translate_errors

    client = make_client(url, get_settings())
    try:
        with translate_errors(display_url(url), "read the node's version"):
            return str(client.info()["version"]["number"])
    finally:
        client.close()


def cleanup(what: str, step: Callable[[], object]) -> None:
    """Run one cleanup step; a failure is a warning line, so that it neither hides the error that
    led here nor stops the steps after it."""
    try:
        step()
    except Exception as e:  # any failure: cleanup goes on
        print(f"warning: could not {what}: {e}", file=sys.stderr)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def run_main(main: Callable[[], None]) -> None:
    """Run a bench script's main: a HybridSearchError ends it with one `error:` line and exit status 2."""
    try:
        main()
    except HybridSearchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
