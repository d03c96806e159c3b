"""The README's two commands are the ones CI runs."""

from __future__ import annotations

import re

from tests.conftest import REPO


def _commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    return re.findall(r"```bash\n(python3 -m venv .venv.*?)\n```", readme)


def test_ci_runs_the_readme_commands() -> None:
    commands = _commands()
    assert len(commands) == 2
    main_job, tests = commands
    assert "hybridsearch demo" in main_job and "pytest" in tests
    # each as typed, with `|| exit`: set -e does not stop at a failure inside an && chain
    ci = [line.removesuffix(" || exit") for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.endswith(" || exit")]
    assert tests in ci and main_job in ci
    assert ci.index(tests) < ci.index(main_job)
    for cmd in commands:
        assert cmd.index("torch==2.13.0") < cmd.index("-e ")
