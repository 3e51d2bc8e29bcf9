"""Observability: Prometheus metrics (:mod:`.metrics`, the multiprocess directory in :mod:`.multiproc`, the
statistics extension's totals read back from them in :mod:`.statistics`), structured JSON logs (:mod:`.logs`),
spans (:mod:`.spans`), and the worker supervisor that logs every worker's exit (:mod:`.workers`).
"""
