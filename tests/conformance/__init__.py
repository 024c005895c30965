"""Conformance: the same scenarios on the embedded pymq broker and on Apache RocketMQ 5.3.3.

Every test takes the ``target`` fixture (conftest.py), parametrised over ``pymq`` and
``rocketmq``, and asserts what a real RocketMQ 5.3.3 broker does (see
/work/shared/real-rocketmq.md, "Semantics observed on it"). A test that fails only on
``[pymq]`` names a place where the embedded broker differs from RocketMQ.
"""
