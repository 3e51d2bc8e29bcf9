"""Observability: Prometheus metrics (:mod:`.metrics`, the multiprocess directory in :mod:`.multiproc`), structured
JSON logs (:mod:`.logs`), spans (:mod:`.spans`), and the worker supervisor that logs every worker's exit
(:mod:`.workers`).
"""
