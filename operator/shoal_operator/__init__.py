"""Shoal's Kubernetes operator: arrives with the operator issue (#5); nothing here yet."""
