"""Broker-wide names and rules shared by every layer."""
