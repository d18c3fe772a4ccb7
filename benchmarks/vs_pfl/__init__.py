"""fedlink against pfl-research on one task (``vs_pfl_ratio`` in ``benchmarks/sim_scale.py``).

``task`` defines it (numpy only), ``run_pfl.py`` runs it with pfl in a python that has pfl,
``fedlink_side`` runs it on fedlink's virtual-clock loop.
"""
