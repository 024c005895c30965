"""Broker managers: topic configs, consumer offsets, subscription groups."""
