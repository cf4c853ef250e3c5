"""A trusted socket: the CLI talks only to its own user's owner, in a home nobody else controls.

Everything is real: the CLI runs in process (tests/cli_runner.py) against an embedded store
on disk; the "other user" is a real process that dropped to uid 65534 (so those tests need root).
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from moonmind_worker.owner import protocol

from celery_helpers import stop
from conftest import write_tree

QUERY = ("rag", "search", "--query", "where is the bearer token checked", "--filters", "repo=demo", "tenant=acme")
NOBODY = 65534

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")

#: A listener that binds the socket as root (the file is root's, as a real owner's would be), then
#: becomes uid 65534 before listen(): SO_PEERCRED reports the credentials in effect at listen().
#: It records every byte a client sends it.
FAKE_OWNER = textwrap.dedent("""
    import os, socket, sys
    from pathlib import Path
    from moonmind_worker.owner import protocol

    path, record = Path(sys.argv[1]), sys.argv[2]
    out = open(record, "wb")  # opened before the drop: uid 65534 may not create files here
    s = socket.socket(socket.AF_UNIX)
    protocol.at_short_path(path, s.bind)
    os.setgid(65534)
    os.setuid(65534)
    s.listen(1)
    print("listening", flush=True)
    s.settimeout(60)
    conn, _ = s.accept()
    print("accepted", flush=True)
    conn.settimeout(30)
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    out.write(data)
    out.close()
""")


def collection_dir(home: Path) -> Path:
    return home / "qdrant-edge" / "moonmind__repo"


def refused(r, *fragments: str) -> None:
    """The command failed with the clear error (every fragment in it), not a traceback."""
    assert r.code != 0, r.stdout
    assert "Traceback" not in r.stderr, r.stderr
    text = " ".join(r.stderr.split())  # the message may be wrapped
    for fragment in fragments:
        assert fragment in text, r.stderr


@needs_root
def test_a_fake_owner_of_another_uid_is_refused_before_any_request_byte_is_sent(prebuilt, invoke, home, tmp_path):
    path = protocol.socket_path(home / "qdrant-edge", "moonmind__repo")
    record = tmp_path / "received"
    fake = subprocess.Popen([sys.executable, "-c", FAKE_OWNER, str(path), str(record)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert fake.stdout is not None and fake.stdout.readline().strip() == "listening"
        r = invoke(*QUERY)
        refused(r, str(path), f"uid {NOBODY}", "MOONMIND_HOME")
        out, err = fake.communicate(timeout=30)  # the client closed its end: the fake's read ends
    finally:
        stop(fake)
    assert fake.returncode == 0, err
    assert "accepted" in out  # the client did connect: the refusal is the peer check's
    assert record.read_bytes() == b""


def test_a_symlinked_owner_lock_is_refused_and_its_target_left_untouched(prebuilt, invoke, home, tmp_path):
    target = tmp_path / "precious"
    target.write_text("a file only this user may write\n")
    os.utime(target, ns=(1_000_000_000, 1_000_000_000))
    lock = collection_dir(home) / "owner.lock"
    lock.symlink_to(target)
    r = invoke(*QUERY)
    refused(r, str(lock), "symbolic link")
    assert target.read_text() == "a file only this user may write\n"
    assert target.stat().st_mtime_ns == 1_000_000_000
    assert lock.is_symlink()


def test_a_symlinked_socket_is_refused_without_connecting_to_its_target(prebuilt, invoke, home, tmp_path):
    elsewhere = tmp_path / "elsewhere.sock"
    listener = socket.socket(socket.AF_UNIX)
    protocol.at_short_path(elsewhere, listener.bind)
    listener.listen(1)
    listener.setblocking(False)
    link = protocol.socket_path(home / "qdrant-edge", "moonmind__repo")
    link.symlink_to(elsewhere)
    try:
        r = invoke(*QUERY)
        refused(r, str(link), "symbolic link")
        with pytest.raises(BlockingIOError):  # nobody connected to the link's target
            listener.accept()
    finally:
        listener.close()
    assert link.is_symlink()


def test_a_symlinked_moonmind_home_is_refused(prebuilt, invoke, home, tmp_path):
    link = tmp_path / "linked-home"
    link.symlink_to(home)
    r = invoke(*QUERY, extra_env={"MOONMIND_HOME": str(link)})
    refused(r, str(link), "symbolic link", "MOONMIND_HOME")


def test_a_symlinked_collection_directory_is_refused(prebuilt, invoke, home, tmp_path):
    moved = tmp_path / "moved-collection"
    collection_dir(home).rename(moved)
    collection_dir(home).symlink_to(moved)
    r = invoke(*QUERY)
    refused(r, str(collection_dir(home)), "symbolic link")
    assert not (moved / "owner.lock").exists()


def test_a_world_writable_moonmind_home_is_refused_with_the_chmod_that_fixes_it(prebuilt, invoke, home):
    home.chmod(0o777)
    r = invoke(*QUERY)
    refused(r, str(home), "0777", "others", f"chmod 700 {home}")


@needs_root
def test_a_moonmind_home_owned_by_another_uid_is_refused(prebuilt, invoke, home):
    os.chown(home, NOBODY, NOBODY)
    r = invoke(*QUERY)
    refused(r, str(home), f"owned by uid {NOBODY}", "MOONMIND_HOME")


@pytest.mark.slow
def test_a_new_moonmind_home_is_created_private(invoke, tmp_path):
    new = tmp_path / "fresh" / "home"
    tiny = write_tree(tmp_path / "tiny", {"a.py": "def f():\n    return 1\n"})  # what is indexed does not matter here
    r = invoke("rag", "index", str(tiny), "--repo", "demo", "--tenant", "acme", extra_env={"MOONMIND_HOME": str(new)})
    assert r.code == 0, r.stderr
    for d in (new, new / "qdrant-edge", collection_dir(new)):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
