"""Shoal's AMQP 1.0 broker: all state in Redis, any number of stateless replicas."""
