"""Tag expressions, the rule broker and clients share: ``*`` (every message) or ``TagA || TagB``."""

from __future__ import annotations

__all__ = ["SUB_ALL", "check_tags", "split_tags"]

SUB_ALL = "*"


def split_tags(expression: str | None) -> list[str] | None:
    """The tags ``expression`` names, stripped, blanks kept (``"A ||"`` -> ``["A", ""]``);
    None for every message (``*``, empty or None). Callers choose what a blank means:
    RocketMQ's ``FilterAPI.buildSubscriptionData`` drops it, pymq's broker refuses it."""
    text = (expression or SUB_ALL).strip()
    if text == SUB_ALL:
        return None
    return [t.strip() for t in text.split("||")]


def check_tags(expression: str | None) -> list[str] | None:
    """:func:`split_tags`, with a ValueError naming ``expression`` when a tag is blank."""
    tags = split_tags(expression)
    if tags is not None and not all(tags):
        raise ValueError(f"tag expression {expression!r} has an empty tag; write '*' or 'TagA || TagB'")
    return tags
