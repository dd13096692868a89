"""A local AWS for tests: moto in server mode on a free loopback port, open only to this session
(:mod:`kinesumer.aws.local_server`, which ``kinesumer demo`` and ``kinesumer local-aws`` serve
too)."""

from __future__ import annotations

from ..aws.local_server import ADMIN_HEADER, LOOPBACK, REGION, SERVICES, LocalAWS, LocalAWSError

__all__ = ["ADMIN_HEADER", "LOOPBACK", "REGION", "SERVICES", "LocalAWS", "LocalAWSError"]
