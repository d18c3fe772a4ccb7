"""A run's folder, ``<output_dir>/<run name>/``, and the records a run writes there.

A run that starts in a folder holding an earlier run's records first removes them all: its
event log, summary, report and plots, final model, and TensorBoard's event files. Else a run
that ends early (an error, a stop) would leave the earlier run's summary, report or model
beside its own events, a run that draws fewer plots (a gRPC run after a virtual one, which
draws model-time plots) would leave the earlier run's beside its report, and TensorBoard
would draw both runs' curves as one. A coordinator resuming from its state dir
(``fedlink serve``) keeps them: they are its own run's.

Only the files a run writes are removed, by name; anything else in the folder is left.
Importing this module loads neither torch nor the TensorBoard extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedlink.metrics import EVENTS_FILENAME
from fedlink.metrics.report import PLOT_FILENAMES, REPORT_FILENAME
from fedlink.metrics.summary import SUMMARY_FILENAME
from fedlink.private import private_dir

if TYPE_CHECKING:
    from fedlink.experiment.config import ExperimentConfig

MODEL_FILENAME = "model.pt"
"""The final global model as a torch ``state_dict`` (``torch.load`` it into the model)."""
VECTOR_FILENAME = "model.npy"
"""The final global model as the flat float32 vector the coordinator holds."""
TENSORBOARD_DIRNAME = "tensorboard"
"""The folder of the TensorBoard event files inside a run folder."""
TENSORBOARD_FILES = "events.out.tfevents.*"
"""The names of the TensorBoard event files (a writer opens a new one each run)."""

RECORDS: tuple[str, ...] = (EVENTS_FILENAME, SUMMARY_FILENAME, REPORT_FILENAME,
                            *PLOT_FILENAMES, MODEL_FILENAME, VECTOR_FILENAME)
"""Every file a run writes at the top of its folder."""


def prepare_run_dir(config: ExperimentConfig, output_dir: Path | None,
                    keep_records: bool = False) -> Path:
    """Create ``<output_dir>/<run name>/`` and remove an earlier run's records there
    (``clear_records``); ``keep_records`` keeps them (a resumed run goes on with its own)."""
    run_dir = private_dir(Path(output_dir or config.run.output_dir) / config.run.name)
    if not keep_records:
        clear_records(run_dir)
    return run_dir


def clear_records(run_dir: Path) -> None:
    """Remove the records a run writes (``RECORDS`` and TensorBoard's event files) from
    ``run_dir``."""
    for name in RECORDS:
        (run_dir / name).unlink(missing_ok=True)
    for path in (run_dir / TENSORBOARD_DIRNAME).glob(TENSORBOARD_FILES):
        path.unlink(missing_ok=True)
