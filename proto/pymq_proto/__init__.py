"""The pymq wire protocol: gRPC service definitions and the stored record layout.

`pymq_proto.v1` holds the generated gRPC code (regenerate with `make proto`).
`pymq_proto.record` is the commit-log record layout shared by the broker, which
writes records, and the client, which decodes them from pull responses.
"""
