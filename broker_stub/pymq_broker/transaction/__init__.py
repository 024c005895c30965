"""Transactional messages: half messages, end transaction, check-back."""
