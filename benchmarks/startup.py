"""Start-up and install footprint: what a device pays before its first call.

Builds fedlink's wheel, installs it with its core dependencies only into a fresh virtualenv
(no pip inside, ``--no-compile`` and compiled), and measures with ``python -X importtime``:

- ``import_client_ms``: ``import fedlink.client`` in the core venv (target <= 300);
- ``import_baseline_ms``: ``import numpy, grpc, grpc.aio, tenacity`` there, the floor the SDK
  stands on, and ``client_over_baseline``, the ratio of the two (both in this run);
- ``import_sim_ms``: ``import fedlink.sim`` in this interpreter, with everything installed
  (target <= 2,500); ``import_serve_ms``: ``import fedlink.cli.serve`` likewise;
- ``core_site_packages_mb`` (as pip installs it, with ``.pyc`` files) and
  ``core_site_packages_nocompile_mb``; ``core_distributions``: what the core install holds;
- ``heavy_modules_after_client_import``: torch/scipy/sklearn/matplotlib/rich/opacus modules
  loaded by ``import fedlink.client`` in this interpreter (0 expected).

Each import figure is the fastest of several fresh processes (``*_median_ms`` beside it): on a
shared, loaded machine the fastest run is the one least disturbed by other work.
Needs the ``build`` package and the package index (the core dependencies are installed).

Run: ``python benchmarks/startup.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "opacus", "scipy", "sklearn", "matplotlib", "rich", "dp_accounting")


def build_wheel(out: Path) -> Path:
    """fedlink's wheel, built from this checkout into ``out``."""
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(REPO)],
                   check=True, capture_output=True)
    return next(out.glob("fedlink-*.whl"))


def core_venv(root: Path, wheel: Path, compile_pyc: bool) -> Path:
    """A fresh venv (no pip) holding ``wheel`` and its core dependencies; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    flags = [] if compile_pyc else ["--no-compile"]
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                    "--quiet", *flags, str(wheel)], check=True, capture_output=True)
    return python


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                          "['purelib'])"], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6


def import_ms(python: Path | str, statement: str, modules: tuple[str, ...]) -> float:
    """Import time (ms) that ``statement`` spends in the packages ``modules``: the sum of the
    cumulative times of the top-level entries of ``-X importtime`` rooted in them (a submodule
    imported after its package, like ``fedlink.client``, is an entry of its own)."""
    out = subprocess.run([str(python), "-X", "importtime", "-c", statement],
                         check=True, capture_output=True, text=True)
    total = 0
    for line in out.stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S+)$", line)
        if match and match.group(2).split(".")[0] in modules:
            total += int(match.group(1))
    return total / 1000


def timings(python: Path | str, statement: str, modules: tuple[str, ...],
            repeats: int) -> tuple[float, float]:
    """(fastest, median) of ``repeats`` measurements in fresh processes."""
    runs = [import_ms(python, statement, modules) for _ in range(repeats)]
    return min(runs), statistics.median(runs)


def heavy_after(statement: str) -> int:
    code = f"{statement}; import sys; print(sum(1 for m in sys.modules if m.split('.')[0] in " \
           f"{HEAVY!r}))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True)
    return int(out.stdout.strip())


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    repeats = 3 if args.quick else 7
    with tempfile.TemporaryDirectory(prefix="fedlink-startup-") as tmp:
        wheel = build_wheel(Path(tmp) / "dist")
        python = core_venv(Path(tmp) / "core", wheel, compile_pyc=True)
        bare = core_venv(Path(tmp) / "bare", wheel, compile_pyc=False)
        figures: dict[str, object] = {
            "core_site_packages_mb": round(size_mb(site_packages(python)), 1),
            "core_site_packages_nocompile_mb": round(size_mb(site_packages(bare)), 1),
            "core_distributions": " ".join(sorted(
                p.name.split("-")[0] for p in site_packages(python).glob("*.dist-info"))),
        }
        import_ms(python, "import fedlink.client", ("fedlink",))  # warm the file cache
        client = timings(python, "import fedlink.client", ("fedlink",), repeats)
        baseline = timings(python, "import numpy, grpc, grpc.aio, tenacity",
                           ("numpy", "grpc", "tenacity"), repeats)
    sim = timings(sys.executable, "import fedlink.sim", ("fedlink",), repeats)
    serve = timings(sys.executable, "import fedlink.cli.serve", ("fedlink",), repeats)
    for name, (fastest, median) in {"client": client, "baseline": baseline, "sim": sim,
                                    "serve": serve}.items():
        figures[f"import_{name}_ms"] = round(fastest, 1)
        figures[f"import_{name}_median_ms"] = round(median, 1)
    figures.update({
        "client_over_baseline": round(client[0] / baseline[0], 3),
        "heavy_modules_after_client_import": heavy_after("import fedlink.client"),
        "import_client_target_met": client[0] <= 300,
        "import_sim_target_met": sim[0] <= 2500,
    })
    report(figures, args.json)


if __name__ == "__main__":
    main()
