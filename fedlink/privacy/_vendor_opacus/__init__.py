"""Opacus's privacy analysis (RDP and PRV), vendored so the coordinator can account without torch.

Why vendored: every module under ``opacus`` is reached through ``opacus/__init__.py``, which
imports torch (``PrivacyEngine``, ``GradSampleModule``), and ``opacus.accountants.accountant``
imports ``DPOptimizer``. DESIGN.md forbids torch on the coordinator, which is where a run's
privacy budget is accounted and enforced. The *analysis* part of Opacus's accountants is pure
numpy/scipy, so it is copied here verbatim from opacus 1.6.0
(``opacus/accountants/analysis/rdp.py`` and ``analysis/prv/*.py``, Apache-2.0, Copyright (c)
Meta Platforms, Inc. and affiliates), with one change: ``prv/domain.py`` computes its RDP bound
with the vendored functions instead of ``opacus.accountants.RDPAccountant``. The accountant
logic around them (``RDPAccountant.get_epsilon``, ``PRVAccountant.get_epsilon``) is reproduced
in ``fedlink.privacy.accounting``. ``tests/unit/test_privacy_accounting.py`` checks that the
results equal Opacus's own accountants, so an Opacus upgrade that changes the analysis shows up
as a failing test.
"""
