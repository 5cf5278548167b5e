"""Shoal's Spark analytics: arrives with the metrics issue (#6); nothing here yet."""
