"""The one thin gRPC layer: requests in, processors called, errors mapped."""
