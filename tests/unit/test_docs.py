"""The documents ship current and clean: the configuration reference matches the config
classes, the MkDocs site builds with warnings as errors, the README stays a front door, and no
document or comment carries a machine's path, a dated run log or a file from outside the
repository."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gen_config() -> object:
    spec = importlib.util.spec_from_file_location("gen_config", ROOT / "docs" / "gen_config.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_reference_is_generated_from_the_current_classes() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == _gen_config().render(), (  # type: ignore[attr-defined]
        "docs/configuration.md is stale: run python docs/gen_config.py")


def test_the_configuration_reference_has_every_table_and_key() -> None:
    page = _gen_config().render()  # type: ignore[attr-defined]
    for table in ("run", "data", "model", "client", "client.retry", "coordinator",
                  "coordinator.flush", "coordinator.limits", "network", "virtual", "ray"):
        assert f"`[{table}]`" in page
    for key in ("`target_accuracy`", "`max_staleness`", "`residual_memory_mb`", "`evaluator`"):
        assert key in page


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
         "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()
    assert (tmp_path / "site" / "api" / "index.html").is_file()


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move guide text to docs/"


GENERATED = {ROOT / "benchmarks" / "RESULTS.md"}  # its date and machine are the point
FORBIDDEN = {
    "a machine's path": re.compile(r"(?<![\w.])/(work|home|tmp|root|Users)/"),
    "a dated run": re.compile(r"\b20\d\d-\d\d-\d\d\b|\bUTC 20\d\d|\d\d:\d\d UTC"),
    "a file outside the repository": re.compile(r"\.\./shared/|shared/DESIGN\.md"),
}


def _documents() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in ("fedlink", "tests", "benchmarks", "examples", "clients", "server"):
        found += sorted(p for p in (ROOT / folder).rglob("*")
                        if p.suffix in (".py", ".md", ".toml") and "proto" not in p.parts)
    return [p for p in found if p not in GENERATED]


def test_no_document_or_comment_holds_a_path_a_date_or_an_outside_file() -> None:
    problems = []
    this = Path(__file__).resolve()
    for path in _documents():
        if path == this:
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            for what, pattern in FORBIDDEN.items():
                if pattern.search(line):
                    problems.append(f"{path.relative_to(ROOT)}: {what}: {line.strip()[:100]}")
    assert not problems, "\n".join(problems)
