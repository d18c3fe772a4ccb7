"""``[client] trainer`` names: a ``Registry`` of builders, one per local-training method.

A builder is ``(config, loss) -> factory``, or ``(config, loss, device) -> factory`` when it
takes ``device`` (the torch device ``[client] device`` resolves to for this process's worker;
a builder without that parameter is refused when ``[client] device`` is set); the factory is
``(model, data, *, seed) -> fedlink.client.Trainer`` and builds each client's trainer.
Register your own by name::

    from fedlink.experiment.trainers import TRAINERS, reads_options

    @TRAINERS.register("scaffold")
    @reads_options("scaffold_lr")
    def scaffold(config, loss):
        return lambda model, data, *, seed: ScaffoldTrainer(model, data, seed=seed)

``reads_options`` names the ``[coordinator.training] trainer_options`` the trainers read: a
simulation that sets another is refused (``options_read``) instead of training as if it
were unset. A builder that does not say, an import string and a plugged trainer are not
checked.

(``[client] trainer = "package.module:attr"`` names a factory directly, no registration.)

This module stays importable without torch, so that a config naming a trainer is checked when
it is parsed; the built-ins import their torch code when they are built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from fedlink.client.base import PROX_MU
from fedlink.errors import ConfigError
from fedlink.privacy.setup import DP_SGD_OPTIONS
from fedlink.registry import Registry

if TYPE_CHECKING:
    from fedlink.client import Trainer


class ClientSettings(Protocol):
    """What a builder reads of ``[client]`` (``fedlink.experiment.config.ClientSection``)."""

    @property
    def optimizer(self) -> str:
        """``[client] optimizer``."""
        ...

    @property
    def optimizer_options(self) -> Mapping[str, Any]:
        """``[client] optimizer_options``."""
        ...

    @property
    def keep_local(self) -> tuple[str, ...]:
        """``[client] keep_local``."""
        ...


class Settings(Protocol):
    """What a builder is given: the ``ExperimentConfig`` (this module names only the part
    it reads, so that the config, which checks trainer names here, is not imported back)."""

    @property
    def client(self) -> ClientSettings:
        """The ``[client]`` section."""
        ...

TrainerFactory = Callable[..., "Trainer"]
"""``(model, data, *, seed) -> Trainer``."""

TRAINERS: Registry[TrainerFactory] = Registry("trainer")
"""Trainer name -> ``(config: ExperimentConfig, loss) -> TrainerFactory`` (``config``
is typed as ``Settings``, the part of it a builder reads)."""

OPTIONS_ATTRIBUTE = "trainer_options_read"
"""Where ``reads_options`` keeps a builder's option names."""

Builder = TypeVar("Builder", bound=Callable[..., Any])


def reads_options(*names: str) -> Callable[[Builder], Builder]:
    """Declare the ``trainer_options`` the trainers a builder makes read (none: it reads
    no option); the decorated builder is returned unchanged."""

    def declare(builder: Builder) -> Builder:
        setattr(builder, OPTIONS_ATTRIBUTE, frozenset(names))
        return builder

    return declare


def options_read(trainer: str) -> frozenset[str] | None:
    """The ``trainer_options`` the trainer named ``trainer`` reads (``None`` when its builder
    does not say, see ``reads_options``, or ``trainer`` is an import string)."""
    if not TRAINERS.registered(trainer):
        return None
    read = getattr(TRAINERS.get(trainer), OPTIONS_ATTRIBUTE, None)
    return None if read is None else frozenset(read)


@TRAINERS.register("torch")
@reads_options(PROX_MU)
def torch_trainer(config: Settings, loss: Any, device: Any = "cpu") -> TrainerFactory:
    """The built-in local SGD (``TorchTrainer``) with the loss, the config's optimizer,
    ``keep_local`` and the device."""
    from fedlink.client.torch_trainer import TorchTrainer  # torch: only when it is built
    from fedlink.models.training import build_optimizer

    section = config.client
    optimizer = build_optimizer(section.optimizer, section.optimizer_options)

    def build(model: Any, data: Any, *, seed: int) -> Trainer:
        return TorchTrainer(model, data, seed=seed, loss=loss, optimizer=optimizer,
                            keep_local=section.keep_local, device=device)

    return build


@TRAINERS.register("dp_sgd")
@reads_options(*DP_SGD_OPTIONS)
def dp_sgd_trainer(config: Settings, loss: Any, device: Any = "cpu") -> TrainerFactory:
    """Opacus DP-SGD, with cross-entropy, on any data (fedlink or torch datasets)."""
    from fedlink.privacy.dp_sgd import DPSGDTrainer  # torch and opacus: only when built

    # the config refuses the torch trainer's settings with it (ClientSection); a loss can
    # still come as a plug
    if loss != "cross_entropy":
        raise ConfigError("client.trainer = 'dp_sgd' trains with cross_entropy: the loss "
                          "passed to the run would change nothing; leave it out")

    def build(model: Any, data: Any, *, seed: int) -> Trainer:
        return DPSGDTrainer(model, data, seed=seed, device=device)

    return build
