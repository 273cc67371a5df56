"""``podshimctl``: the command-line client.

- ``client.cli.main``  the program: parser, output helpers, the shim-level verbs (``sandbox``,
  ``call``, ``events``) that talk to one shim or to the Controller.
- ``client.cli.pods``  the crictl-shaped pod verbs (``runp``, ``pods``, ``create``, ...).
"""
