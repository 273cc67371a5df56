""".ci/gotool, the builder of the pinned Go tools, with a go command of the test's own on PATH: a
tool is built once into its cache and reused, builds wait for each other, a failed or overlong
build names its step and leaves nothing a later call could take for the tool, a go too old for the
module brings the pinned toolchain from the module proxy, and a schema whose file does not have
the pinned sha256 is refused.

The fake go (FAKE_GO below) plays the go command's part: what it is asked to do it logs to
$FAKE_LOG, and what it does is steered by FAKE_* variables (gotool passes the environment on,
except GO* variables, which it sets itself).
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from support.critools import gotool

FAKE_GO = r'''#!/usr/bin/env python3
import json, os, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(" ".join(["toolchain" if "toolchain@" in sys.argv[0] else "path"] + args) + "\n")
modules = os.environ["FAKE_MODULES"]
version = os.environ.get("FAKE_TOOLCHAIN_VERSION" if "toolchain@" in sys.argv[0] else "FAKE_GO_VERSION", "go1.26.8")
if args[:2] == ["env", "GOVERSION"]:
    print(version)
elif args[:2] == ["env", "-json"]:
    print("{}")
elif args[:3] == ["mod", "download", "-json"]:
    module, _, wanted = args[3].partition("@")
    directory = os.path.join(modules, module + "@" + wanted)
    print(json.dumps({"Path": module, "Version": wanted, "Dir": directory, "GoMod": directory + ".mod"}))
elif args[0] == "install":
    time.sleep(float(os.environ.get("FAKE_BUILD_SECONDS", "0")))
    if os.environ.get("FAKE_FAIL"):
        sys.exit("compile: " + os.environ["FAKE_FAIL"])
    target = os.path.join(os.environ["GOBIN"], args[-1].partition("@")[0].rsplit("/", 1)[-1])
    with open(target, "w") as f:
        f.write("#!/bin/sh\necho built by " + version + " with " + " ".join(args[1:-1]) + "\n")
    os.chmod(target, 0o755)
elif args[0] == "get":
    with open(os.environ["FAKE_LOG"] + ".gomod", "w") as f, open("go.mod") as mod:
        f.write(mod.read())
    with open(os.environ["FAKE_LOG"] + ".nice", "w") as f:
        f.write(str(os.nice(0)))
elif args[:2] == ["list", "-m"]:
    with open("go.mod") as mod:
        print([line.split()[2] for line in mod if line.startswith("require " + args[-1] + " ")][0])
elif args[0] == "build":
    target = args[args.index("-o") + 1]
    with open(target, "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(target, 0o755)
else:
    sys.exit("fake go: unknown command " + " ".join(args))
'''

PINS = '''
[go]
toolchain = "1.26.8"

[tools.hello]
module = "example.com/hello"
version = "v1.2.3"
package = "example.com/hello/cmd/hello"
build = "install"
ldflags = "-X example.com/hello/version.Version={version}"

[tools.node]
module = "example.com/cluster"
version = "v1.4.2"
package = "example.com/cluster/cmd/node"
build = "module"
local_replaces = "v0.4.2"

[schemas.greeting]
module = "example.com/greeting"
version = "v0.1.0"
into = "pkg/greeting"

[schemas.greeting.files]
"greeting.proto" = "0000000000000000000000000000000000000000000000000000000000000000"
'''


CLUSTER_GO_MOD = """module example.com/cluster

go 1.26.0

require (
\texample.com/cluster/api v0.0.0
\texample.com/other v1.0.0
)

replace (
\texample.com/cluster/api => ./staging/api // its own API module
\texample.com/other => example.com/fork v1.0.1
)

replace example.com/cluster/client => ../client
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The fake go first on PATH, a cache and pins of the test's own; what the fake go was asked to do."""
    bin_dir, modules = tmp_path / "bin", tmp_path / "modules"
    bin_dir.mkdir()
    modules.mkdir()
    (bin_dir / "go").write_text(FAKE_GO)
    (bin_dir / "go").chmod(0o755)
    (modules / "example.com").mkdir()
    (modules / "example.com" / "hello@v1.2.3.mod").write_text("module example.com/hello\n\ngo 1.26.6\n")
    (modules / "example.com" / "cluster@v1.4.2.mod").write_text(CLUSTER_GO_MOD)
    (tmp_path / "pins.toml").write_text(PINS)
    log = tmp_path / "go.log"
    log.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("PODSHIM_TOOLS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_MODULES", str(modules))
    monkeypatch.setattr(gotool, "PINS", str(tmp_path / "pins.toml"))
    monkeypatch.setattr(gotool, "REPO", str(tmp_path / "repo"))
    return log


def builds(log) -> list[str]:
    return [line for line in log.read_text().splitlines() if " install " in line]


def test_a_tool_is_built_once_into_the_cache_keyed_by_its_version_and_reused(fake, tmp_path) -> None:
    path = gotool.tool_path("hello")
    assert path == str(tmp_path / "cache" / "hello-v1.2.3" / "hello")
    assert gotool.tool_path("hello") == path
    assert builds(fake) == ["path install -trimpath -ldflags=-X example.com/hello/version.Version=1.2.3 "
                            "example.com/hello/cmd/hello@v1.2.3"]
    assert sorted(os.listdir(tmp_path / "cache" / "hello-v1.2.3")) == ["hello"]
    assert os.stat(tmp_path / "cache" / "hello-v1.2.3").st_mode & 0o777 == 0o755


def test_two_callers_at_once_build_the_tool_once(fake, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_BUILD_SECONDS", "1")
    paths: list[str] = []
    callers = [threading.Thread(target=lambda: paths.append(gotool.tool_path("hello"))) for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(30)
    assert len(paths) == 2 and paths[0] == paths[1]
    assert len(builds(fake)) == 1


def test_a_failed_build_names_its_step_and_leaves_nothing_behind(fake, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_FAIL", "undefined: frobnicate")
    with pytest.raises(gotool.GoToolError) as failed:
        gotool.tool_path("hello")
    assert str(failed.value) == ("step 'go install example.com/hello/cmd/hello@v1.2.3' failed (exit status 1):\n"
                                 "compile: undefined: frobnicate")
    assert not os.path.exists(tmp_path / "cache" / "hello-v1.2.3")
    assert not [name for name in os.listdir(tmp_path / "cache") if name.startswith(".build-")]


def test_a_build_that_outlives_its_time_is_killed_and_leaves_nothing_behind(fake, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_BUILD_SECONDS", "60")
    started = time.monotonic()
    with pytest.raises(gotool.GoToolError) as failed:
        gotool.tool_path("hello", timeout=5)
    assert time.monotonic() - started < 30
    assert str(failed.value) == ("step 'go install example.com/hello/cmd/hello@v1.2.3' did not finish within the "
                                 "build's 5 s (killed)")
    assert not os.path.exists(tmp_path / "cache" / "hello-v1.2.3")
    assert not [name for name in os.listdir(tmp_path / "cache") if name.startswith(".build-")]


def test_a_go_older_than_the_module_asks_for_fetches_the_pinned_toolchain_and_builds_with_it(fake, tmp_path,
                                                                                          monkeypatch) -> None:
    monkeypatch.setenv("FAKE_GO_VERSION", "go1.19.8")  # Debian 12's golang-go
    toolchain = tmp_path / "modules" / "golang.org" / "toolchain@v0.0.1-go1.26.8.linux-amd64"
    os.makedirs(toolchain / "bin")
    os.makedirs(toolchain / "pkg" / "tool" / "linux_amd64")
    (toolchain / "bin" / "go").write_text(FAKE_GO)
    (toolchain / "bin" / "go").chmod(0o444)  # a module zip keeps no mode bits
    (toolchain / "pkg" / "tool" / "linux_amd64" / "compile").write_text("")
    (toolchain / "pkg" / "tool" / "linux_amd64" / "compile").chmod(0o444)
    monkeypatch.setenv("FAKE_TOOLCHAIN_VERSION", "go1.26.8")
    path = gotool.tool_path("hello")
    assert [line.split()[0] for line in builds(fake)] == ["toolchain"]
    assert "mod download -json golang.org/toolchain@v0.0.1-go1.26.8.linux-amd64" in fake.read_text()
    with open(path) as f:
        assert "built by go1.26.8" in f.read()
    assert os.access(toolchain / "pkg" / "tool" / "linux_amd64" / "compile", os.X_OK)


def test_a_module_that_needs_a_newer_go_than_the_pinned_toolchain_is_refused_with_what_to_raise(fake, tmp_path,
                                                                                               monkeypatch) -> None:
    monkeypatch.setenv("FAKE_GO_VERSION", "go1.19.8")
    (tmp_path / "modules" / "example.com" / "hello@v1.2.3.mod").write_text("module example.com/hello\n\ngo 1.27\n")
    with pytest.raises(gotool.GoToolError, match=r"^the pinned toolchain go1\.26\.8 is older than go1\.27\.0, which "
                                                 r"a pinned module needs: raise \[go\] toolchain in .*pins\.toml$"):
        gotool.tool_path("hello")
    assert builds(fake) == []


def test_a_tool_without_a_pin_or_a_way_to_build_it_is_refused(fake) -> None:
    with pytest.raises(gotool.GoToolError, match=r"^no tool 'nope' is pinned in .*pins\.toml \(pinned: hello, node\)$"):
        gotool.tool_path("nope")


def test_a_schema_file_without_the_pinned_sha256_is_refused(fake, tmp_path) -> None:
    module = tmp_path / "modules" / "example.com" / "greeting@v0.1.0"
    module.mkdir()
    (module / "greeting.proto").write_text('syntax = "proto3";\n')
    pin = gotool.load_pins()["schemas"]["greeting"]
    with pytest.raises(gotool.GoToolError) as refused:
        gotool.compile_schema("greeting", pin, gotool.sys.executable)
    assert str(refused.value) == ("step 'check example.com/greeting@v0.1.0/greeting.proto': its sha256 is "
                                  "26695965cd692d9dce08efe0b2e1f745c3be7c19631b56873c8956b8d486cf17, the pin says "
                                  + "0" * 64)
    assert not os.path.exists(tmp_path / "repo")


def test_the_pinned_build_tags_are_given_to_the_build(fake, tmp_path) -> None:
    pins = tmp_path / "pins.toml"
    pins.write_text(PINS.replace('build = "install"', 'build = "install"\ntags = "no_docs  no_btrfs"'))
    gotool.tool_path("hello")
    assert builds(fake) == ["path install -trimpath -ldflags=-X example.com/hello/version.Version=1.2.3 "
                            "-tags=no_docs,no_btrfs example.com/hello/cmd/hello@v1.2.3"]


def test_schema_files_importing_each_other_by_their_path_in_the_module_import_from_the_package(fake, tmp_path) -> None:
    """containerd's API files import each other as "types/mount.proto": the generated code must
    import those from the pin's package, not from a top-level ``types``."""
    import hashlib
    import subprocess
    import sys

    module = tmp_path / "modules" / "example.com" / "greeting@v0.1.0"
    (module / "types").mkdir(parents=True)
    files = {
        "types/name.proto": 'syntax = "proto3";\npackage greeting.types;\nmessage Name { string text = 1; }\n',
        "hello.proto": 'syntax = "proto3";\npackage greeting;\nimport "types/name.proto";\n'
                       'import "google/protobuf/empty.proto";\nmessage Hello { greeting.types.Name name = 1; }\n',
    }
    for name, text in files.items():
        (module / name).write_text(text)
    pin = {"module": "example.com/greeting", "version": "v0.1.0", "into": "pkg/greet", "strip": "",
           "files": {name: hashlib.sha256(text.encode()).hexdigest() for name, text in files.items()}}
    assert gotool.compile_schema("greeting", pin, sys.executable)
    said = subprocess.run([sys.executable, "-c", "from pkg.greet import hello_pb2 as h; "
                           "print(h.Hello(name={'text': 'hi'}).name.text, h.Hello.DESCRIPTOR.file.name)"],
                          cwd=tmp_path / "repo", capture_output=True, text=True, timeout=60)
    assert (said.returncode, said.stdout) == (0, "hi pkg/greet/hello.proto\n"), said.stderr


def test_a_module_build_replaces_what_the_module_takes_from_its_own_directories_by_their_published_version(
        fake, tmp_path) -> None:
    path = gotool.tool_path("node")
    assert path == str(tmp_path / "cache" / "node-v1.4.2" / "node")
    throwaway = (tmp_path / "go.log.gomod").read_text()
    assert throwaway.endswith("require example.com/cluster v1.4.2\n\nreplace (\n"
                              "\texample.com/cluster/api => example.com/cluster/api v0.4.2\n"
                              "\texample.com/cluster/client => example.com/cluster/client v0.4.2\n)\n")
    assert (tmp_path / "go.log.nice").read_text() == str(gotool.BUILD_NICENESS)
    assert "build -o " in fake.read_text()
