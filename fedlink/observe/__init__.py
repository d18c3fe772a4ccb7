"""Watching a coordinator while it runs: Prometheus metrics and TensorBoard scalars.

Both are subscribers of the coordinator's event log (``EventLog.subscribe``), which stays the
source of truth. Their libraries are optional extras (``fedlink[metrics]``,
``fedlink[tensorboard]``), imported only by the module that uses them:

- ``fedlink.observe.endpoint.MetricsEndpoint``: the ``/metrics`` endpoint of one coordinator
  (``fedlink serve --metrics-port``, ``[coordinator.metrics]``), started on a server by
  ``serve_metrics`` (``fedlink serve``, and ``fedlink simulate`` over gRPC);
- ``fedlink.observe.prometheus``: the exporter and its metric names;
- ``fedlink.observe.rpc``: the server interceptor that times every call;
- ``fedlink.observe.tensorboard``: scalars for TensorBoard (``[run] tensorboard = true``;
  ``fedlink serve`` and ``fedlink simulate`` in both modes).
"""
