"""Shoal's Kubernetes operator: BrokerCluster, Queue and SharedSubscription (DESIGN.md §6)."""
