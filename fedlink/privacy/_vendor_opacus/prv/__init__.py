# ruff: noqa
# mypy: ignore-errors
# Vendored from opacus 1.6.0 (opacus/accountants/analysis/prv/__init__.py), Apache-2.0,
# Copyright (c) Meta Platforms, Inc. and affiliates. See fedlink/privacy/_vendor_opacus/__init__.py.
from .compose import compose_heterogeneous
from .domain import Domain, compute_safe_domain_size
from .prvs import (
    DiscretePRV,
    PoissonSubsampledGaussianPRV,
    TruncatedPrivacyRandomVariable,
    discretize,
)


__all__ = [
    "DiscretePRV",
    "Domain",
    "PoissonSubsampledGaussianPRV",
    "TruncatedPrivacyRandomVariable",
    "compose_heterogeneous",
    "compute_safe_domain_size",
    "discretize",
]
