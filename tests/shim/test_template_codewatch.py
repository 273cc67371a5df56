"""The template's check of its code (shim.launch.install.CodeWatch): every change the whole
fingerprint sees is seen, through inotify while it can, through the fingerprint when it cannot."""

from __future__ import annotations

import errno
import os
import shutil

import pytest

from shim.kernel import linux
from shim.launch import install
from shim.launch.install import CodeWatch

from support.proctools import run_in_child


@pytest.fixture
def code(tmp_path):
    """An installed tree (``site/pkg/{a.py, sub/b.py}``) and its files."""
    site = tmp_path / "site"
    (site / "pkg" / "sub").mkdir(parents=True)
    (site / "pkg" / "a.py").write_text("A = 1\n")
    (site / "pkg" / "sub" / "b.py").write_text("B = 1\n")
    return site, [str(site / "pkg" / "a.py"), str(site / "pkg" / "sub" / "b.py")]


@pytest.fixture
def fingerprints(monkeypatch):
    """The whole fingerprints taken (each one's files), as they are taken."""
    taken = []
    whole = install.fingerprint

    def counted(files):
        taken.append(files)
        return whole(files)

    monkeypatch.setattr(install, "fingerprint", counted)
    return taken


@pytest.fixture
def watch(code, fingerprints):
    w = CodeWatch(code[1])
    assert w.watching
    fingerprints.clear()
    yield w
    w.close()


def replace_by_rename(path, text: str) -> None:
    """As pip installs a file: a new one renamed over the old."""
    tmp = f"{path}.new"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def test_unchanged_code_is_told_without_a_fingerprint(watch, fingerprints) -> None:
    assert not watch.changed() and not watch.changed()
    assert fingerprints == []


def test_a_file_rewritten_in_place_is_a_change(code, watch) -> None:
    with open(code[1][1], "a") as f:
        f.write("# upgraded\n")
    assert watch.changed()


def test_a_file_renamed_over_is_a_change(code, watch) -> None:
    replace_by_rename(code[1][0], "A = 2\n")
    assert watch.changed()


def test_a_directory_removed_and_made_anew_is_a_change(code, watch) -> None:
    site, _ = code
    shutil.rmtree(site / "pkg" / "sub")
    (site / "pkg" / "sub").mkdir()
    (site / "pkg" / "sub" / "b.py").write_text("B = 1\n")
    assert watch.changed()


def test_a_new_tree_renamed_into_place_above_the_code_is_a_change(code, watch) -> None:
    site, _ = code
    shutil.copytree(site, f"{site}.new")
    os.rename(site, f"{site}.old")
    os.rename(f"{site}.new", site)
    assert watch.changed()


def test_entries_beside_the_code_are_not_a_change_and_cost_no_fingerprint(code, watch, fingerprints) -> None:
    site, files = code
    (site / "pkg" / "__pycache__").mkdir()
    (site / "pkg" / "sub" / ".b.py.swp").write_text("")
    (site / "other").mkdir()
    assert not watch.changed()
    assert fingerprints == []


def test_an_event_that_changes_nothing_is_checked_and_later_changes_are_still_seen(code, watch, fingerprints) -> None:
    os.chmod(code[1][0], 0o600)  # IN_ATTRIB: the fingerprint does not hold the mode
    assert not watch.changed()
    assert len(fingerprints) == 1  # the whole comparison ...
    assert watch.watching and not watch.changed() and len(fingerprints) == 1  # ... once, on new watches
    replace_by_rename(code[1][1], "B = 2\n")
    assert watch.changed()


def test_lost_events_are_a_whole_comparison(code, watch, fingerprints, monkeypatch) -> None:
    monkeypatch.setattr(linux, "inotify_read", lambda fd: [(-1, linux.IN_Q_OVERFLOW, "")])
    assert not watch.changed()
    assert len(fingerprints) == 1


@pytest.mark.parametrize("refused", ["inotify_init", "inotify_add_watch"])
def test_without_inotify_every_check_compares_the_whole_fingerprint(code, fingerprints, monkeypatch, refused) -> None:
    def refuse(*args):
        raise OSError(errno.EMFILE if refused == "inotify_init" else errno.ENOSPC, "refused")

    monkeypatch.setattr(linux, refused, refuse)
    w = CodeWatch(code[1])
    try:
        assert not w.watching
        assert not w.changed() and not w.changed()
        assert len(fingerprints) == 3  # the first, then one per check
        replace_by_rename(code[1][0], "A = 2\n")
        assert w.changed()
    finally:
        w.close()


def test_a_closed_watch_still_answers_with_the_whole_fingerprint(code, watch, fingerprints) -> None:
    watch.close()
    assert not watch.watching and not watch.changed() and len(fingerprints) == 1
    replace_by_rename(code[1][0], "A = 2\n")
    assert watch.changed()


def test_code_on_a_remote_filesystem_is_compared_whole_at_every_check(code, fingerprints, monkeypatch) -> None:
    # inotify sees only the changes made through this kernel, not those of an NFS server's
    # other clients or of a FUSE daemon (virtiofs: a checkout edited on a VM's host).
    site, files = code
    nfs, ext4 = 0x6969, 0xEF53
    monkeypatch.setattr(linux, "fs_type", lambda path: nfs if path.startswith(str(site / "pkg")) else ext4,
                        raising=False)
    w = CodeWatch(files)
    try:
        assert not w.watching
        assert not w.changed() and len(fingerprints) == 2  # the first, then one per check
    finally:
        w.close()


def test_the_filesystem_type_is_statfs_magic_number(tmp_path) -> None:
    assert linux.fs_type("/proc") == 0x9FA0  # PROC_SUPER_MAGIC
    with pytest.raises(OSError) as raised:
        linux.fs_type(str(tmp_path / "missing"))
    assert raised.value.errno == errno.ENOENT and raised.value.filename == str(tmp_path / "missing")


def test_a_tree_replaced_where_a_link_on_the_way_leads_is_a_change(tmp_path) -> None:
    # site/pkg is a link to real/v1/pkg: real/ is on no path the watch was given.
    (tmp_path / "real" / "v1" / "pkg").mkdir(parents=True)
    (tmp_path / "real" / "v1" / "pkg" / "a.py").write_text("A = 1\n")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "pkg").symlink_to(tmp_path / "real" / "v1" / "pkg")
    w = CodeWatch([str(tmp_path / "site" / "pkg" / "a.py")])
    try:
        assert w.watching
        shutil.copytree(tmp_path / "real" / "v1", tmp_path / "real" / "v2")
        replace_by_rename(tmp_path / "real" / "v2" / "pkg" / "a.py", "A = 2\n")
        os.rename(tmp_path / "real" / "v1", tmp_path / "real" / "v0")
        os.rename(tmp_path / "real" / "v2", tmp_path / "real" / "v1")
        assert w.changed()
    finally:
        w.close()


def _in_own_mount_namespace(check) -> int:
    """Run ``check()`` in a forked child in a private mount namespace of its own (its mounts die
    with it and never reach the host); its exit status (0: it returned True)."""
    def in_own_namespace() -> bool:
        linux.unshare(linux.CLONE_NEWNS)
        linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
        return check()

    return run_in_child(in_own_namespace)


def test_a_tree_mounted_over_a_directory_on_the_way_is_a_change(code, tmp_path, fingerprints) -> None:
    # A mount shows no inotify event: an image or a volume of a new version bind-mounted over the
    # installed one must still be seen.
    site, files = code
    new = tmp_path / "new-pkg"
    shutil.copytree(site / "pkg", new)
    replace_by_rename(new / "a.py", "A = 2\n")

    def check() -> bool:
        w = CodeWatch(files)
        assert w.watching and not w.changed()
        linux.mount(str(new), str(site / "pkg"), None, linux.MS_BIND)
        return w.changed()

    assert _in_own_mount_namespace(check) == 0


def test_a_mount_removed_from_the_way_is_a_change(code, tmp_path) -> None:
    site, files = code
    cover = tmp_path / "cover"
    shutil.copytree(site / "pkg", cover)

    def check() -> bool:
        linux.mount(str(cover), str(site / "pkg"), None, linux.MS_BIND)
        w = CodeWatch(files)  # the code as the mount shows it
        assert w.watching and not w.changed()
        linux.umount2(str(site / "pkg"))
        return w.changed()

    assert _in_own_mount_namespace(check) == 0


def test_a_mount_elsewhere_costs_a_look_at_the_way_but_no_fingerprint(code, tmp_path, fingerprints, monkeypatch):
    # Every sandbox mounts its netns: the table changes all the time, the code's way does not.
    site, files = code
    (tmp_path / "elsewhere").mkdir()
    looks = []
    identities = install._identities
    monkeypatch.setattr(install, "_identities", lambda paths: looks.append(paths) or identities(paths))

    def check() -> bool:
        w = CodeWatch(files)
        fingerprints.clear()
        looks.clear()
        linux.mount("tmpfs", str(tmp_path / "elsewhere"), "tmpfs")
        w.look()  # as the template does after answering
        assert len(looks) == 1  # the table changed: the directories on the way were looked at
        assert not w.changed() and not w.changed() and len(looks) == 1  # once per change
        linux.umount2(str(tmp_path / "elsewhere"))
        assert not w.changed() and len(looks) == 2
        return fingerprints == []

    assert _in_own_mount_namespace(check) == 0


def test_a_tree_mounted_again_under_the_same_mount_id_is_a_change(code, tmp_path) -> None:
    # The kernel gives a freed mount id to the next mount: an unmount and a mount of another
    # tree at the same place between two looks leave the table's ids as they were.
    site, files = code
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    shutil.copytree(site / "pkg", v1)
    shutil.copytree(site / "pkg", v2)
    replace_by_rename(v2 / "a.py", "A = 2\n")

    def check() -> bool:
        linux.mount(str(v1), str(site / "pkg"), None, linux.MS_BIND)
        w = CodeWatch(files)
        assert w.watching and not w.changed()
        linux.umount2(str(site / "pkg"))
        linux.mount(str(v2), str(site / "pkg"), None, linux.MS_BIND)
        return w.changed()

    assert _in_own_mount_namespace(check) == 0


def test_a_mount_made_while_the_watch_is_made_is_seen(code, tmp_path, monkeypatch):
    # While the watches are made, a tree is mounted on the way: they watch the tree it covers,
    # and a later upgrade inside the mounted one must still be seen.
    site, files = code
    new = tmp_path / "new-pkg"
    shutil.copytree(site / "pkg", new)
    added = linux.inotify_add_watch
    mounted = []

    def mount_after_the_last(fd, path, mask):
        wd = added(fd, path, mask)
        if path == files[-1] and not mounted:  # every watch is on the tree the mount covers
            mounted.append(path)
            linux.mount(str(new), str(site / "pkg"), None, linux.MS_BIND)
        return wd

    monkeypatch.setattr(linux, "inotify_add_watch", mount_after_the_last)

    def check() -> bool:
        w = CodeWatch(files)
        assert mounted and w.watching
        w.changed()  # whatever it says of the mount itself (the mounted tree is a copy) ...
        replace_by_rename(new / "a.py", "A = 2\n")
        return w.changed()  # ... the upgrade inside it is a change

    assert _in_own_mount_namespace(check) == 0
