"""RocketMQ's ACL credentials of a client: an access key and its secret key, both or neither."""

from __future__ import annotations


def check_credentials(access_key: str | None, secret_key: str | None) -> tuple[str, str] | None:
    """``(access_key, secret_key)``, or None for no authentication.

    Raises ValueError when only one is given, or one is empty: a client would otherwise
    connect unauthenticated and meet a FORBIDDEN far from the mistake.
    """
    if access_key is None and secret_key is None:
        return None
    if not access_key or not secret_key:
        which, value = ("secret_key", secret_key) if access_key else ("access_key", access_key)
        raise ValueError(
            "give both access_key and secret_key (RocketMQ's ACL credentials), or neither: "
            f"{which} is {'missing' if value is None else 'empty'}"
        )
    return access_key, secret_key
