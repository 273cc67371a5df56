"""The shim's state machines and the RPC handlers over them.

- ``shim.sandbox.sandbox``       one sandbox: its state machine, the pause, netns and cgroups.
- ``shim.sandbox.config``        how a shim was started (ShimConfig).
- ``shim.sandbox.tasks``         the containers (tasks) of a sandbox and their state machine.
- ``shim.sandbox.options``       CreateSandbox's options (PodSandboxConfig) validated.
- ``shim.sandbox.record``        state.json: the one schema its writers and ``podshim delete`` share.
- ``shim.sandbox.events``        the event bus behind the Events service.
- ``shim.sandbox.service``       Sandbox service handlers: translate only.
- ``shim.sandbox.task_service``  Task service handlers: translate only.
"""
