"""Every code block of the README (its quick starts included) runs as written.

The blocks of ``README.md`` run in order, in one scratch folder holding a copy of
``examples/`` and ``clients/``, so a later block sees what an earlier one wrote (the quick
start's ``virtual.toml``):

- ``python``: executed;
- ``bash``: run by ``bash -e`` with ``fedlink`` and ``python`` meaning this checkout's;
- ``toml``: parsed and checked as an experiment (``ExperimentConfig.from_dict``); one whose
  first line is ``# save as NAME`` is also written to ``NAME``.

A block that cannot run here (``make test`` itself, a device's address) is marked by an
``<!-- illustrative: why -->`` line right above it, and is the only kind skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedlink.experiment import ExperimentConfig

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"(?:<!-- illustrative: (?P<why>[^>]*?) -->\n)?```(?P<lang>\w*)\n"
                   r"(?P<code>.*?)```", re.S)
RUNS = ("python", "bash", "toml")


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, its code, and why it is illustrative (if it is)."""

    lang: str
    code: str
    illustrative: str | None
    line: int


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, in order."""
    return [Block(m["lang"], m["code"], m["why"], text.count("\n", 0, m.start()) + 1)
            for m in FENCE.finditer(text)]


def _bin(folder: Path) -> Path:
    """A folder of ``fedlink`` and ``python`` commands that run this checkout."""
    folder.mkdir()
    for name, line in (("fedlink", f'exec "{sys.executable}" -m fedlink "$@"'),
                       ("python", f'exec "{sys.executable}" "$@"')):
        script = folder / name
        script.write_text(f"#!/bin/sh\n{line}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder


def _run(block: Block, cwd: Path, env: dict[str, str]) -> None:
    where = f"README.md line {block.line}"
    if block.lang == "python":
        result = subprocess.run([sys.executable, "-c", block.code], cwd=cwd, env=env,
                                capture_output=True, text=True, timeout=900, check=False)
    elif block.lang == "bash":
        result = subprocess.run(["bash", "-e", "-c", block.code], cwd=cwd, env=env,
                                capture_output=True, text=True, timeout=900, check=False)
    else:
        table = tomllib.loads(block.code)
        ExperimentConfig.from_dict(table, base_dir=cwd)
        first = block.code.splitlines()[0]
        if first.startswith("# save as "):
            (cwd / first.removeprefix("# save as ").strip()).write_text(block.code)
        return
    assert result.returncode == 0, f"{where} ({block.lang}) failed:\n{result.stdout}\n" \
        f"{result.stderr}"


def test_the_readme_blocks_are_all_run_or_marked_illustrative() -> None:
    found = blocks(README.read_text(encoding="utf-8"))
    assert found, "no code block found: the pattern no longer reads the README"
    for block in found:
        assert block.lang in RUNS or block.illustrative, \
            f"README.md line {block.line}: a {block.lang or 'plain'} block neither runs nor " \
            f"says why it is illustrative"
        if block.illustrative is not None:
            assert block.illustrative.strip(), f"README.md line {block.line}: say why"
    assert sum(b.illustrative is None for b in found) >= 4


def test_the_block_reader_sees_markers_and_languages() -> None:
    text = "x\n<!-- illustrative: needs a phone -->\n```bash\nmake demo\n```\n```toml\na = 1\n```\n"
    assert blocks(text) == [Block("bash", "make demo\n", "needs a phone", 2),
                            Block("toml", "a = 1\n", None, 6)]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_readme_block_runs(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for folder in ("examples", "clients"):
        shutil.copytree(ROOT / folder, work / folder)
    env = {**os.environ,
           "PATH": f"{_bin(tmp_path / 'bin')}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")])),
           "MPLBACKEND": "Agg"}
    ran = 0
    for block in blocks(README.read_text(encoding="utf-8")):
        if block.illustrative is None:
            _run(block, work, env)
            ran += 1
    assert ran >= 4
    assert (work / "runs" / "digits-fedavg" / "summary.json").is_file()
    assert (work / "runs" / "quickstart" / "report.md").is_file()
    assert (work / "runs" / "virtual-poor-fleet" / "summary.json").is_file()
