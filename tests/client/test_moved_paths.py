"""The import paths code outside the repository may use for what moved to the shared CRI layer
(shim.cri) give the new home's objects: client.criapi and client.cri.configs."""

from __future__ import annotations

import subprocess
import sys

import pytest

import shim.cri.configs
from shim.cri import api

import client.cri.configs
import client.criapi


def test_the_old_configs_path_gives_the_shared_layers_classes() -> None:
    assert client.cri.configs.__all__ == shim.cri.configs.__all__
    for name in client.cri.configs.__all__:
        assert getattr(client.cri.configs, name) is getattr(shim.cri.configs, name)


@pytest.mark.parametrize("name", ["api_pb2", "api_pb2_grpc", "NotGenerated"])
def test_the_old_criapi_path_gives_the_shared_layers_schema(name) -> None:
    assert getattr(client.criapi, name) is getattr(api, name)


def test_the_old_criapi_path_names_nothing_else() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'messages'"):
        client.criapi.messages  # noqa: B018  (the attribute access is what is tested)


def test_importing_the_old_criapi_path_imports_no_schema() -> None:
    code = "import sys, client.criapi; print(sorted(m for m in sys.modules if 'pb2' in m or m.startswith('google')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == "[]\n"
