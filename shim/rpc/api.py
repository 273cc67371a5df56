"""Service and method names of the shim's API (protocol.md, "Services"), shared with clients."""

from __future__ import annotations

__all__ = ["SANDBOX_SERVICE", "EVENTS_SERVICE", "TASK_SERVICE", "TEMPLATE_SERVICE", "TEMPLATE_METHODS", "SANDBOX_METHODS", "EVENTS_METHODS",
           "TASK_METHODS"]

SANDBOX_SERVICE = "podshim.sandbox.v1.Sandbox"
EVENTS_SERVICE = "podshim.events.v1.Events"
TASK_SERVICE = "podshim.task.v1.Task"
TEMPLATE_SERVICE = "podshim.template.v1.Template"

SANDBOX_METHODS = (
    "CreateSandbox", "StartSandbox", "Platform", "StopSandbox", "WaitSandbox",
    "SandboxStatus", "PingSandbox", "ShutdownSandbox", "SandboxMetrics",
)
EVENTS_METHODS = ("Subscribe",)
TASK_METHODS = ("Create", "Start", "Kill", "Wait", "Delete", "State")
TEMPLATE_METHODS = ("Spawn", "Ping")
