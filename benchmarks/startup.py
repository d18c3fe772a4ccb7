"""Start-up and install footprint: what a device pays before its first call.

Builds fedlink's wheel, installs it with its core dependencies only into fresh virtualenvs
made ``--without-pip`` (the pip of this interpreter installs into them with ``--python``, so pip
itself, the installer, is not counted), once as pip installs by default (``.pyc`` files
compiled) and once ``--no-compile``, and measures with ``python -X importtime``:

- ``import_client_ms``: ``import fedlink.client`` in the core venv (target <= 300);
- ``import_client_session_ms``: ``from fedlink.client import ClientSession, run_client`` there,
  what a device's client program imports before its first call (the package loads its
  submodules when a name is first read, so this is the figure that includes the transport);
- ``import_baseline_ms``: ``import numpy, grpc, grpc.aio, tenacity`` there, the floor the SDK
  stands on, and ``client_session_over_baseline``, the ratio of the two (both in this run);
- ``import_sim_ms``: ``import fedlink.sim`` in this interpreter, with everything installed
  (target <= 2,500); ``import_serve_ms``: ``import fedlink.cli.serve`` likewise;
- ``core_install_mb``: the core venv's site-packages in MB (1e6 bytes) as pip installs it
  (with ``.pyc``), ``core_install_nocompile_mb`` without them (target <= 60 for the former),
  ``core_mb_<distribution>``: each distribution's files (its ``RECORD``, ``.pyc`` included),
  ``core_mb_numpy_openblas`` (``numpy.libs``: OpenBLAS, gfortran) and ``core_mb_numpy_tests``
  (numpy's own test suites) inside numpy's figure; ``fresh_venv_pip_mb``: what a plain
  ``python -m venv`` holds before anything is installed (pip, and setuptools before 3.12), which
  a reading of "site-packages of a fresh venv" that counts the installer would add;
- ``heavy_modules_after_client_import``: torch/scipy/sklearn/matplotlib/rich/opacus modules
  loaded by ``from fedlink.client import ClientSession`` in this interpreter (0 expected).

An import figure is everything the statement imports: the cumulative times of the top-level
``-X importtime`` entries after the interpreter's own start-up (``site``). Each is the fastest
of several fresh processes (``*_median_ms`` beside it): on a shared, loaded machine the fastest
run is the one least disturbed by other work. Needs the ``build`` package and the package
index (the core dependencies are installed).

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
SESSION = "from fedlink.client import ClientSession, run_client"
BASELINE = "import numpy, grpc, grpc.aio, tenacity"
ENTRY = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)$")


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
    """The purelib folder of ``python``'s environment."""
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                          "['purelib'])"], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def size_mb(folder: Path) -> float:
    """Bytes of the files under ``folder``, in MB (1e6)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6


def distribution_mb(site: Path) -> dict[str, float]:
    """MB of each distribution's installed files, as its ``RECORD`` lists them (files outside
    ``site``, like console scripts in ``bin/``, are left out)."""
    sizes = {}
    for info in site.glob("*.dist-info"):
        total = 0
        for line in (info / "RECORD").read_text().splitlines():
            path = (site / line.rsplit(",", 2)[0]).resolve()
            if path.is_file() and path.is_relative_to(site.resolve()):
                total += path.stat().st_size
        sizes[info.name.split("-")[0].lower()] = round(total / 1e6, 1)
    return dict(sorted(sizes.items()))


def numpy_parts_mb(site: Path) -> dict[str, float]:
    """The two largest parts of numpy that a device does not call: its bundled BLAS
    libraries and its test suites."""
    tests = sum(size_mb(d) for d in (site / "numpy").rglob("tests") if d.is_dir())
    return {"core_mb_numpy_openblas": round(size_mb(site / "numpy.libs"), 1),
            "core_mb_numpy_tests": round(tests, 1)}


def fresh_venv_mb(root: Path) -> float:
    """Site-packages of a plain ``python -m venv`` (with pip), nothing installed."""
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, capture_output=True)
    return round(size_mb(site_packages(root / "bin" / "python")), 1)


def import_ms(python: Path | str, statement: str) -> float:
    """Import time (ms) of everything ``statement`` imports: the cumulative times of the
    top-level ``-X importtime`` entries after the interpreter's start-up (``site``), so that
    modules a package loads lazily, outside its own entry, are counted too."""
    out = subprocess.run([str(python), "-X", "importtime", "-c", statement],
                         check=True, capture_output=True, text=True)
    total, started = 0, False
    for line in out.stderr.splitlines():
        match = ENTRY.match(line)
        if match and not match.group(2):
            if started:
                total += int(match.group(1))
            started = started or match.group(3) == "site"
    return total / 1000


def timings(python: Path | str, statement: str, repeats: int) -> tuple[float, float]:
    """(fastest, median) of ``repeats`` measurements in fresh processes."""
    runs = [import_ms(python, statement) for _ in range(repeats)]
    return min(runs), statistics.median(runs)


def heavy_after(statement: str) -> int:
    """How many modules of the ``HEAVY`` packages ``statement`` loads in this interpreter."""
    code = f"{statement}; import sys; print(sum(1 for m in sys.modules if m.split('.')[0] in " \
           f"{HEAVY!r}))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True)
    return int(out.stdout.strip())


def install_figures(tmp: Path, wheel: Path) -> tuple[Path, dict[str, object]]:
    """The core venv's python and the install-size figures."""
    python = core_venv(tmp / "core", wheel, compile_pyc=True)
    bare = core_venv(tmp / "bare", wheel, compile_pyc=False)
    site = site_packages(python)
    figures: dict[str, object] = {
        "core_install_mb": round(size_mb(site), 1),
        "core_install_nocompile_mb": round(size_mb(site_packages(bare)), 1),
        "core_install_target_met": size_mb(site) <= 60,
        "core_install_method": "venv --without-pip; outside pip install --python (pip not "
                               "counted); MB = 1e6 bytes of site-packages files",
        "core_distributions": " ".join(distribution_mb(site)),
    }
    figures.update({f"core_mb_{name}": mb for name, mb in distribution_mb(site).items()})
    figures.update(numpy_parts_mb(site))
    figures["fresh_venv_pip_mb"] = fresh_venv_mb(tmp / "fresh")
    return python, figures


def main() -> None:
    """Measure and report the figures (see the module docstring)."""
    args = parse_args(__doc__.splitlines()[0])
    repeats = 3 if args.quick else 7
    with tempfile.TemporaryDirectory(prefix="fedlink-startup-") as tmp:
        wheel = build_wheel(Path(tmp) / "dist")
        python, figures = install_figures(Path(tmp), wheel)
        import_ms(python, SESSION)  # warm the file cache
        measured = {"client": timings(python, "import fedlink.client", repeats),
                    "client_session": timings(python, SESSION, repeats),
                    "baseline": timings(python, BASELINE, repeats)}
    measured["sim"] = timings(sys.executable, "import fedlink.sim", repeats)
    measured["serve"] = timings(sys.executable, "import fedlink.cli.serve", repeats)
    for name, (fastest, median) in measured.items():
        figures[f"import_{name}_ms"] = round(fastest, 1)
        figures[f"import_{name}_median_ms"] = round(median, 1)
    figures.update({
        "client_session_over_baseline": round(measured["client_session"][0]
                                              / measured["baseline"][0], 3),
        "heavy_modules_after_client_import": heavy_after(SESSION),
        "import_client_target_met": measured["client"][0] <= 300,
        "import_client_session_target_met": measured["client_session"][0] <= 300,
        "import_sim_target_met": measured["sim"][0] <= 2500,
    })
    report(figures, args.json)


if __name__ == "__main__":
    main()
