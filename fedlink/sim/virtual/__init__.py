"""Virtual-clock simulation: the coordinator's engine and a lazy population on model time.

``[run] mode = "virtual"`` in an experiment makes ``fedlink simulate`` run here
(``fedlink.sim.virtual.runner``) instead of over real gRPC: no sockets, each client's
download, training and upload timed from its link profile and speed (``timing``), clients
coming and going (``availability``), made only while selected (``population``), driven by
the discrete-event ``loop`` on a ``fedlink.clock.ManualClock``, and trained where ``[run]
backend`` says (``backends``: inline, worker processes or Ray actors).
"""
