"""bundlegen.safe_write, the one writer every command uses: a regular file or none is
replaced, never a FIFO, folder or device, never through a symlink out of the folder it must
stay in; the text lands by rename (a reader sees the old file or the new one); a refusal is
one UnsafeWrite line naming the path."""
from __future__ import annotations

import os
import stat

import pytest

from bundlegen.safe_write import UnsafeWrite, unlink, write_text


def test_a_new_file_and_its_folders_are_made(tmp_path):
    path = write_text(tmp_path / "a" / "b" / "f.txt", "x\r\ny\n", inside=tmp_path)
    assert path.read_bytes() == b"x\r\ny\n"           # line ends as given
    assert not [p for p in path.parent.iterdir() if p.name != "f.txt"]


def test_an_existing_file_is_replaced_by_rename_and_keeps_its_mode(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("old")
    os.chmod(path, 0o640)
    os.link(path, tmp_path / "other-name")            # the old inode keeps the old text
    write_text(path, "new", inside=tmp_path)
    assert path.read_text() == "new" and (tmp_path / "other-name").read_text() == "old"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


@pytest.mark.parametrize("make, words", [
    (lambda p: os.mkfifo(p), "a FIFO, not a regular file"),
    (lambda p: p.mkdir(), "a folder, not a regular file"),
])
def test_what_is_no_regular_file_is_refused(tmp_path, make, words):
    target = tmp_path / "t"
    make(target)
    with pytest.raises(UnsafeWrite, match=words) as info:
        write_text(target, "x", inside=tmp_path)
    assert "\n" not in str(info.value) and str(target) in str(info.value)


def test_a_symlink_out_of_the_folder_is_refused_and_one_inside_is_followed(tmp_path):
    inside, outside = tmp_path / "ws", tmp_path / "elsewhere.txt"
    inside.mkdir()
    outside.write_text("theirs")
    (inside / "out-link").symlink_to(outside)
    with pytest.raises(UnsafeWrite, match=r"refusing to write outside .* \(through a symlink"):
        write_text(inside / "out-link", "x", inside=inside)
    assert outside.read_text() == "theirs"
    (inside / "real.txt").write_text("old")
    (inside / "in-link").symlink_to(inside / "real.txt")
    write_text(inside / "in-link", "new", inside=inside)
    assert (inside / "real.txt").read_text() == "new" and (inside / "in-link").is_symlink()
    linked_folder = inside / "sub"
    linked_folder.symlink_to(tmp_path)                 # a parent folder leading out
    with pytest.raises(UnsafeWrite, match="refusing to write outside"):
        write_text(linked_folder / "f.txt", "x", inside=inside)
    with pytest.raises(UnsafeWrite, match="refusing to write outside"):
        unlink(inside / "out-link", inside=inside)
    assert outside.exists()


def test_a_read_only_file_is_refused_in_one_line(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("old")
    os.chmod(path, 0o444)
    if os.access(path, os.W_OK):
        pytest.skip("running as a user who writes read-only files (root)")
    with pytest.raises(UnsafeWrite, match="read-only"):
        write_text(path, "new")
    assert path.read_text() == "old"
