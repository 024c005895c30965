"""Authentication and authorization in RocketMQ 5's ACL 2.0 model.

``model`` (users, subjects, resources, actions, policy entries), ``metadata_provider``
(users and ACLs stored with the broker's configs), ``authentication`` (the gRPC clients'
HMAC-SHA1 signature), ``authorization`` (the evaluator), ``rpc_resources`` (what each
RPC needs), ``auth_admin_processor`` (the user and ACL RPCs) and ``auth_service`` (what
the gRPC layer calls).
"""
