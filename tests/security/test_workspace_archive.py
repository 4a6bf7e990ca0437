"""sync_workspace's archive is unpacked only inside its destination: a crafted
archive (path traversal, an absolute path, a link) writes nothing anywhere."""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import tarfile

import pytest

from monarch_nb._services import _workspace


def archive_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buffer.getvalue()


def regular(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


@pytest.mark.parametrize(
    "member",
    [regular("../escaped.txt"), regular("/tmp/absolute.txt"), link("innocent", "/etc/passwd")],
    ids=["traversal", "absolute", "symlink"],
)
def test_a_crafted_archive_writes_nothing(tmp_path, member):
    dest = tmp_path / "dest"
    archive = archive_of((regular("fine.txt"), b"ok"), (member, b"evil"))
    with pytest.raises(ValueError, match="refused archive member"):
        _workspace.unpack(archive, str(dest))
    assert not (tmp_path / "escaped.txt").exists()
    assert not dest.exists() or list(dest.iterdir()) == []  # checked before anything is written


@pytest.mark.parametrize("compress", [False, True])
def test_a_workspace_round_trips_without_caches(tmp_path, compress):
    source = tmp_path / "src"
    (source / "pkg" / "__pycache__").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("x = 1\n")
    (source / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (source / "notes.md").write_text("hello\n")
    packed = _workspace.pack([str(source)], compress=compress)
    assert (packed.files, packed.nbytes) == (2, 12)
    path, files, nbytes = _workspace.unpack(packed.archive, str(tmp_path / "out"))
    assert (path, files, nbytes) == (str(tmp_path / "out"), 2, 12)
    assert (tmp_path / "out" / "pkg" / "mod.py").read_text() == "x = 1\n"
    assert not (tmp_path / "out" / "pkg" / "__pycache__").exists()


def test_both_ways_a_workspace_travels_check_its_paths_alike(tmp_path):
    # Packed for an agent, or rsynced over ssh: a directory sends its contents,
    # a file itself, and anything else is refused by name before anything runs.
    from monarch_nb._controller import _rsync

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("A = 1\n")
    (tmp_path / "one.py").write_text("X = 1\n")
    line = _rsync.command(["ssh"], "h", [str(tmp_path / "pkg"), str(tmp_path / "one.py")], "/d")
    assert line[-3:] == [f"{tmp_path / 'pkg'}/", str(tmp_path / "one.py"), "h:/d/"]
    packed = _workspace.pack([str(tmp_path / "pkg"), str(tmp_path / "one.py")])
    with tarfile.open(fileobj=io.BytesIO(packed.archive)) as tar:
        assert sorted(tar.getnames()) == ["a.py", "one.py"]
    missing = str(tmp_path / "missing")
    for send in (
        lambda: _rsync.command(["ssh"], "h", [missing], "/d"),
        lambda: _workspace.pack([missing]),
    ):
        with pytest.raises(ValueError, match=r"missing'? is neither a file nor a directory"):
            send()


# -- what is already in the destination, on a Python with or without data_filter ----


@pytest.fixture(params=["without data_filter", "with data_filter"])
def python_build(request, monkeypatch):
    """Debian 12's 3.11.2 (and Pythons before 3.10.12/3.11.4) have no
    ``tarfile.data_filter``: unpacking must not rely on it."""
    if request.param == "without data_filter":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    return request.param


def test_a_link_to_a_directory_in_the_destination_redirects_nothing(tmp_path, python_build):
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir(mode=0o700)
    outside.mkdir()
    (dest / "pkg").symlink_to(outside)  # left there, or planted before the sync
    archive = archive_of((regular("pkg/evil.py"), b"import os\n"))
    _workspace.unpack(archive, str(dest))
    assert list(outside.iterdir()) == []
    assert not (dest / "pkg").is_symlink()
    assert (dest / "pkg" / "evil.py").read_bytes() == b"import os\n"


def test_a_link_or_fifo_at_a_file_is_replaced_never_written_through(tmp_path, python_build):
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir(mode=0o700)
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_bytes(b"keep me")
    (dest / "mod.py").symlink_to(secret)
    os.link(secret, dest / "hard.py")  # a second name for the same file
    os.mkfifo(dest / "data.txt")  # opening it to write would block: it is replaced
    archive = archive_of(
        (regular("mod.py"), b"X = 1\n"),
        (regular("hard.py"), b"Y = 2\n"),
        (regular("data.txt"), b"rows\n"),
    )
    assert _workspace.unpack(archive, str(dest)) == (str(dest), 3, 17)
    assert secret.read_bytes() == b"keep me"
    for name, data in (("mod.py", b"X = 1\n"), ("hard.py", b"Y = 2\n"), ("data.txt", b"rows\n")):
        info = (dest / name).lstat()
        assert stat.S_ISREG(info.st_mode), name
        assert info.st_nlink == 1, name
        assert not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH), name
        assert (dest / name).read_bytes() == data
    assert sorted(p.name for p in dest.iterdir()) == ["data.txt", "hard.py", "mod.py"]


def test_a_directory_where_the_archive_has_a_file_is_named(tmp_path):
    dest = tmp_path / "dest"
    (dest / "mod.py").mkdir(parents=True, mode=0o700)
    dest.chmod(0o700)
    with pytest.raises(ValueError, match=r"mod\.py' is a directory in the destination"):
        _workspace.unpack(archive_of((regular("mod.py"), b"X = 1\n")), str(dest))
    assert [p.name for p in dest.iterdir()] == ["mod.py"]  # no temporary file left


# -- the destination: on every worker's PYTHONPATH -----------------------------------


def test_a_destination_others_can_write_is_refused(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    dest.chmod(0o777)
    archive = archive_of((regular("mod.py"), b"X = 1\n"))
    with pytest.raises(PermissionError, match=r"writable by group or others \(mode 777\).*"):
        _workspace.unpack(archive, str(dest))
    dest.chmod(0o700)
    (dest / "pkg").mkdir()
    (dest / "pkg").chmod(0o775)  # a directory inside it, on the way to a member
    with pytest.raises(PermissionError, match=r"pkg' is writable by group or others"):
        _workspace.unpack(archive_of((regular("pkg/mod.py"), b"X = 1\n")), str(dest))
    assert list((dest / "pkg").iterdir()) == []


def test_a_destination_that_is_a_link_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "dest").symlink_to(real)
    with pytest.raises(PermissionError, match=r"is not a directory .*a link there is not followed"):
        _workspace.unpack(archive_of((regular("mod.py"), b"X = 1\n")), str(tmp_path / "dest"))
    assert list(real.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_destination_of_another_user_is_refused(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir(mode=0o755)
    os.chown(dest, 65534, 65534)  # nobody's, as if another user had made it first
    with pytest.raises(PermissionError, match="belongs to uid 65534, not to you"):
        _workspace.unpack(archive_of((regular("mod.py"), b"X = 1\n")), str(dest))
    assert list(dest.iterdir()) == []


def test_a_missing_destination_is_made_writable_by_its_owner_only(tmp_path):
    old = os.umask(0)  # the most permissive umask: still nothing group- or other-writable
    try:
        _, files, _ = _workspace.unpack(
            archive_of((regular("a/b/mod.py"), b"X = 1\n")), str(tmp_path / "x" / "dest")
        )
    finally:
        os.umask(old)
    assert files == 1
    for made in (tmp_path / "x", tmp_path / "x" / "dest", tmp_path / "x" / "dest" / "a"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o755, made
    assert stat.S_IMODE((tmp_path / "x" / "dest" / "a" / "b" / "mod.py").stat().st_mode) == 0o644


# -- caps: members and unpacked bytes ----------------------------------------------


def test_an_archive_over_the_member_cap_is_refused_before_anything_is_written(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(_workspace, "MAX_MEMBERS", 3)
    archive = archive_of(*((regular(f"m{i}.py"), b"") for i in range(5)))
    dest = tmp_path / "dest"
    with pytest.raises(ValueError, match="the archive has more than 3 files and directories"):
        _workspace.unpack(archive, str(dest))
    assert list(dest.iterdir()) == []
    source = tmp_path / "src"
    source.mkdir()
    for i in range(5):
        (source / f"m{i}.py").write_text("")
    with pytest.raises(ValueError, match=r"the workspace \[.*src'\] has more than 3 files"):
        _workspace.pack([str(source)])


def test_an_archive_over_the_byte_cap_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(_workspace, "MAX_UNPACKED_BYTES", 10 << 10)
    # 64 KiB of zeros: a few hundred bytes gzipped, over the cap unpacked.
    archive = archive_of((regular("small.py"), b"X = 1\n"), (regular("zeros.bin"), bytes(64 << 10)))
    assert len(archive) < 10 << 10
    dest = tmp_path / "dest"
    with pytest.raises(ValueError, match=r"unpacks to more than 10 KiB \(64 KiB so far\)"):
        _workspace.unpack(archive, str(dest))
    assert list(dest.iterdir()) == []


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")
def test_an_rsynced_workspace_is_not_left_writable_by_others(tmp_path):
    # A project made under umask 002 is group-writable; its copy on the hosts goes on
    # every rank's PYTHONPATH, so rsync takes the write bits of group and others away.
    from monarch_nb._controller import _rsync

    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "mod.py").write_text("X = 1\n")
    for path in (project, project / "pkg", project / "pkg" / "mod.py"):
        path.chmod(path.stat().st_mode | 0o022)
    local_ssh = tmp_path / "ssh"  # runs the remote command here: `ssh HOST CMD...`
    local_ssh.write_text('#!/bin/sh\nshift\nexec "$@"\n')
    local_ssh.chmod(0o700)
    dest = tmp_path / "dest"
    line = _rsync.command([str(local_ssh)], "h", [str(project)], str(dest))
    subprocess.run(line, check=True, capture_output=True, timeout=60)
    for path in (dest / "pkg", dest / "pkg" / "mod.py"):
        assert path.stat().st_mode & 0o022 == 0, oct(path.stat().st_mode)
    assert (dest / "pkg" / "mod.py").read_text() == "X = 1\n"
