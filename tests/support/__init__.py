"""The tests' own helpers, shared by their directories: what each layer's tests start, watch and clean.

- ``sandbox_env``: private Controller roots and the leak check; ``shimtools``: real shims and their end;
- ``podtools``: a pod service's roots; ``critools``: crictl, critest and a podshimd; ``ctrdtools``: a private containerd;
- ``proctools``, ``rpctools``, ``ttytools``, ``layertools``: processes, the wire, terminals, layer trees;
- ``registry`` and ``imagebuild``: the session's local registry and its images; ``netrelay``: a loopback relay;
- ``nspawn`` and ``guest``: a booted systemd (systemd-nspawn) and the cgroup v2 guest (qemu);
- ``kubetools``: kubectl against the harness cluster of bench/cluster.py.

The tests import them as ``support.<module>`` (``tests/`` is on their path, as pytest puts it there).
"""
