"""sync_workspace's archive is unpacked only inside its destination: a crafted
archive (path traversal, an absolute path, a link) writes nothing anywhere."""

from __future__ import annotations

import io
import tarfile

import pytest

from monarch_nb._common import _workspace


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
