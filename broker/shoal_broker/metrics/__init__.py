"""Broker metrics: Prometheus names and the cheap per-message counting the hot path does."""
