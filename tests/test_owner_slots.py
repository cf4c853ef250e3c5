"""The owner's slots stay fair: slow or idle clients cannot keep a normal command from its answer.

Everything is real: `moonmind serve` owns the store in its own process, and the clients here
are raw AF_UNIX connections (the misbehaving ones) or the CLI as a user runs it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from moonmind_worker.owner import protocol
from moonmind_worker.owner.server import MAX_CONNECTIONS, REQUEST_S

from celery_helpers import stop
from conftest import write_tree
from test_owner import QUERY, socket_of, start_owner

#: More connections than the owner has slots, so that every slot is contested.
CLIENTS = 40
#: How long a test waits for something the owner must do within its request deadline.
PATIENCE_S = REQUEST_S + 30


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(PATIENCE_S)
    sock.connect(str(path))
    return sock


def request(op: str, args: dict, *, progress: bool = False) -> bytes:
    return protocol.encode({"v": protocol.VERSION, "op": op, "args": args, "scope": {}, "progress": progress})


def final(sock: socket.socket) -> dict:
    """Read the owner's lines until its final one (a result or an error)."""
    reader = protocol.LineReader(sock)
    while True:
        message = reader.read()
        if "result" in message or "error" in message:
            return message


class Tricklers:
    """`n` clients that send one byte of a request, then one more each second, and reconnect when dropped."""

    def __init__(self, path: Path, n: int) -> None:
        self.path = path
        self.socks = [self._connect() for _ in range(n)]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._trickle, daemon=True)
        self.thread.start()

    def _connect(self) -> socket.socket:
        sock = connect(self.path)
        sock.sendall(b"{")
        return sock

    def _trickle(self) -> None:
        while not self.stopping.wait(1.0):  # the attack's pace, not a synchronization
            for i, sock in enumerate(self.socks):
                try:
                    sock.sendall(b" ")
                except OSError:  # dropped by the owner: come back, as an attacker would
                    sock.close()
                    try:
                        self.socks[i] = self._connect()
                    except OSError:
                        pass

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)
        for sock in self.socks:
            sock.close()


@pytest.fixture
def owner(prebuilt, env, home):
    proc = start_owner(env, home)
    yield proc
    stop(proc)


@pytest.mark.slow
def test_40_trickling_clients_do_not_keep_a_normal_client_from_an_answer_within_its_deadline(owner, cli, home):
    assert CLIENTS > MAX_CONNECTIONS
    tricklers = Tricklers(socket_of(home), CLIENTS)  # connected first: the owner takes them on before the command
    try:
        # a one-shot fallback cannot open the store the owner holds: success means the owner answered
        r = cli(*QUERY, "--json", extra_env={"MOONMIND_STORE_WAIT_S": "0.2"}, timeout=60)
    finally:
        tricklers.close()
    assert r.code == 0, r.stderr
    assert r.json()["items"][0]["source"] == "auth/tokens.py"
    assert (socket_of(home).parent / "owner.lock").read_text().strip() == str(owner.pid)
    assert owner.poll() is None


@pytest.mark.slow
def test_a_new_client_takes_the_slot_of_the_longest_reading_one_when_all_are_taken(owner, home):
    search = request("search", {"query": {"query": "where is the bearer token checked", "filters": {"repo": "demo"}}})
    warm = connect(socket_of(home))  # the first search loads the model: not what is tested here
    warm.sendall(search)
    assert "result" in final(warm)
    warm.close()
    readers = [connect(socket_of(home)) for _ in range(MAX_CONNECTIONS)]  # every slot: taken before the client's
    client = connect(socket_of(home))
    try:
        client.sendall(search)
        assert "result" in final(client)
        oldest, newest = readers[0], readers[-1]
        assert oldest.recv(1) == b""  # made way for the client
        newest.setblocking(False)
        with pytest.raises(BlockingIOError):  # still open: only one reader gave up its slot, before any deadline
            newest.recv(1)
    finally:
        client.close()
        for sock in readers:
            sock.close()


@pytest.mark.slow
def test_a_client_that_sends_nothing_is_dropped_after_the_request_deadline(owner, home):
    sock = connect(socket_of(home))
    try:
        assert sock.recv(1) == b""  # closed by the owner, without an answer (a timeout here raises instead)
    finally:
        sock.close()


@pytest.mark.slow
def test_a_request_sent_slowly_within_the_deadline_is_answered(owner, home):
    data = request("search", {"query": {"query": "where is the bearer token checked",
                                        "filters": {"repo": "demo", "tenant": "acme"}}})
    third = len(data) // 3
    sock = connect(socket_of(home))
    try:
        for part in (data[:third], data[third:2 * third], data[2 * third:]):
            sock.sendall(part)
            time.sleep(0.2)  # the gap between parts is what is tested, not a synchronization
        message = final(sock)
    finally:
        sock.close()
    assert message["result"]["items"][0]["source"] == "auth/tokens.py", message


@pytest.mark.slow
def test_a_running_operation_is_not_evicted_by_new_connections(env, home, tmp_path):
    """An index run (the oldest connection) is held mid-way while 40 idle clients arrive and are dropped; it still completes."""
    from http_servers import EmbeddingsServer

    server = EmbeddingsServer(repeat=2)
    hosted = {**env, **server.provider_env("sk-slots"), "MOONMIND_EMBEDDING_MODEL": "local-embed-512"}
    tree = write_tree(tmp_path / "small", {"a.py": "def alpha():\n    return 1\n", "b.py": "def beta():\n    return 2\n"})
    proc = start_owner(hosted, home)
    idle: list[socket.socket] = []
    try:
        server.hold_after = server.calls  # every embedding call from now on waits for `released`
        runner = connect(socket_of(home))
        runner.sendall(request("index", {"path": str(tree), "repo": "small", "tenant": "acme"}, progress=True))
        assert server.holding.wait(PATIENCE_S), "the index never reached the embedder"
        idle = [connect(socket_of(home)) for _ in range(CLIENTS)]
        for sock in idle:  # the oldest evicted at once, the rest at the deadline: every one of them is dropped
            assert sock.recv(1) == b""
        server.released.set()
        message = final(runner)
        runner.close()
    finally:
        server.released.set()
        for sock in idle:
            sock.close()
        stop(proc)
        server.close()
    assert message["result"]["files_seen"] == 2, message


# ------------------------------------------- issue 52: a stale hand-over marker ---


@pytest.mark.parametrize("role", ["serve", "celery worker"])  # a role with a space: issue 52's fix broke hand-overs to workers
def test_a_hand_over_marker_names_its_writer_while_it_hands_over(tmp_path, role):
    from moonmind_worker.owner import handover

    handover.announce(tmp_path, role)
    assert handover.pending(tmp_path) == os.getpid()
    handover.withdraw(tmp_path)
    assert handover.pending(tmp_path) is None


def test_a_marker_whose_pid_was_reused_by_another_live_process_is_stale(tmp_path):
    """Issue 52: a marker left by a newcomer that died, naming a PID now someone else's, held every command 61 s."""
    from moonmind_worker.owner import handover

    other = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / handover.MARKER).write_text(f"{other.pid} celery worker started=1")  # tick 1: not this sleep
        assert handover.pending(tmp_path) is None
        (tmp_path / handover.MARKER).write_text(f"{other.pid} celery worker started={handover.started(other.pid)}")
        assert handover.pending(tmp_path) == other.pid
    finally:
        other.kill()
        other.wait()


def test_a_marker_older_than_a_hand_over_may_take_is_stale(tmp_path):
    from moonmind_worker.owner import handover

    marker = tmp_path / handover.MARKER
    marker.write_text(f"{os.getpid()} serve")  # the format before start times: a live PID alone
    assert handover.pending(tmp_path) == os.getpid()
    old = time.time() - handover.HANDOVER_S - 60
    os.utime(marker, (old, old))
    assert handover.pending(tmp_path) is None


@pytest.mark.slow
def test_a_request_larger_than_the_owner_reads_is_refused_by_name_and_the_owner_keeps_serving(owner, home):
    """Issue 52: a 30-50 MB MCP query came back as store_busy "owner went away" while the owner was alive."""
    from moonmind_worker.errors import MoonmindError
    from moonmind_worker.owner.client import connect

    huge = {"query": {"query": "pool " * (protocol.MAX_REQUEST_BYTES // 4), "filters": {"repo": "demo"}}, "record": False}
    with pytest.raises(MoonmindError) as caught:
        connect(home / "qdrant-edge", "moonmind__repo").call("search", huge)
    assert caught.value.code == "invalid_argument"
    assert "MiB" in caught.value.message and "MOONMIND_MAX_QUERY_CHARS" in caught.value.action
    pack = connect(home / "qdrant-edge", "moonmind__repo").call("search", {"query": {"query": "bearer token", "filters": {
        "repo": "demo", "tenant": "acme"}}, "record": False})
    assert pack["items"]
