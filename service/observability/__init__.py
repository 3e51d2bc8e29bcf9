"""Observability: Prometheus metrics (:mod:`.metrics`) and structured JSON logs (:mod:`.logs`)."""
