"""Request processors: one per RocketMQ request family (send, pull, send back, offsets, admin)."""
