"""Message filters: RocketMQ's SQL92 property filter (tags are in processor.subscription)."""
