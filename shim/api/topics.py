"""The topics of the shim's events (protocol.md, "Events"): what a subscriber is told, and when."""

from __future__ import annotations

__all__ = ["TOPIC_CREATE", "TOPIC_START", "TOPIC_EXIT", "TOPIC_STATE", "TOPIC_TASK_EXIT"]

TOPIC_CREATE = "/sandbox/create"
TOPIC_START = "/sandbox/start"
TOPIC_EXIT = "/sandbox/exit"
TOPIC_STATE = "/sandbox/state"
TOPIC_TASK_EXIT = "/tasks/exit"
