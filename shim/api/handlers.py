"""Runtime handlers and namespace modes: the names CreateSandbox's options take (protocol.md, 7.1)."""

from __future__ import annotations

__all__ = ["NAMESPACE_MODES", "NATIVE", "RUNTIME_HANDLERS"]

#: CRI's NamespaceMode numbers and their names.
NAMESPACE_MODES = {0: "POD", 1: "CONTAINER", 2: "NODE", 3: "TARGET"}
NATIVE = "native"  # the shim's own launcher (shim.runtime.native)
#: Who runs the pause and the tasks: the shim itself, or an OCI runtime's CLI (shim.runtime.oci);
#: the sandbox picks its shim.runtime.base.Runtime from this once, at CreateSandbox.
RUNTIME_HANDLERS = (NATIVE, "runc", "crun")
