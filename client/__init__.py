"""podshim's parent-runtime side: the Controller, pods with CRI semantics, and podshimctl.

Importing this package never imports pyroute2: the node agent that embeds it stays light.
"""
