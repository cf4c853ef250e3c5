"""The keep-alive balancer of `gateway serve --workers N` (gateway/balance.py), in process: what a
worker publishes in the shared counts file and when it sheds a connection. The same mechanism is
checked against real worker processes in test_gateway.py (the `workers` fixture)."""

from __future__ import annotations

import mmap
import subprocess
import sys

import pytest

from moonmind_worker.gateway import balance


@pytest.fixture
def counts_file(tmp_path):
    return balance.create_file(tmp_path / "connections", 4)


def slots(path) -> list[int]:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return list(memoryview(m).cast("q"))


def publish(path, slot: int, count: int) -> None:
    """What another worker does on each response: write its open-connection count into its slot."""
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        view = memoryview(m).cast("q")
        view[slot] = count
        view.release()


@pytest.fixture
def worker(counts_file):
    """A Balancer for 2 workers, its open connections set by `holding(n)` and its clock by `at(t)`."""
    clock = [1000.0]
    held = [0]
    b = balance.Balancer(counts_file, 2, connections=lambda: held[0], clock=lambda: clock[0])

    def holding(n: int) -> None:
        held[0] = n

    def at(t: float) -> None:
        clock[0] = t

    yield b, holding, at
    b.close()


def test_a_worker_publishes_its_open_connections_in_its_own_slot(worker, counts_file):
    b, holding, _ = worker
    holding(3)
    b.should_close()
    assert slots(counts_file)[b.slot] == 3 and sum(slots(counts_file)) == 3
    holding(1)
    b.should_close()
    assert slots(counts_file)[b.slot] == 1


def test_a_worker_at_or_under_its_fair_share_sheds_nothing(worker, counts_file):
    b, holding, at = worker
    other = 1 - b.slot
    for mine, theirs in [(6, 6), (7, 6), (0, 0), (1, 0), (3, 9)]:  # fair share: total / workers, rounded up
        publish(counts_file, other, theirs)
        holding(mine)
        for step in range(3):
            at(1000.0 + step)
            assert not b.should_close(), (mine, theirs)


def test_a_worker_over_its_fair_share_sheds_one_connection_per_interval(worker, counts_file):
    b, holding, at = worker
    other = 1 - b.slot
    publish(counts_file, other, 5)
    holding(8)  # fair share ceil(13 / 2) = 7
    assert b.should_close()
    assert not b.should_close()  # the close must land before the counts say whether another is needed
    at(1000.0 + balance.SHED_INTERVAL_S / 2)
    assert not b.should_close()
    at(1000.0 + balance.SHED_INTERVAL_S)
    assert b.should_close()
    holding(7)  # the shed connection reconnected to the other worker: an even split
    publish(counts_file, other, 6)
    at(1000.0 + 10 * balance.SHED_INTERVAL_S)
    assert not b.should_close()


def test_close_zeroes_the_slot_so_a_stopped_workers_connections_stop_counting(counts_file):
    b = balance.Balancer(counts_file, 2, connections=lambda: 4)
    b.should_close()
    assert slots(counts_file)[b.slot] == 4
    b.close()
    assert slots(counts_file) == [0, 0, 0, 0]


CLAIM = """
import sys
from moonmind_worker.gateway.balance import Balancer
b = Balancer(sys.argv[1], 2, connections=lambda: 0)
print(b.slot, flush=True)
sys.stdin.read()
"""


def test_each_process_claims_its_own_slot_and_a_dead_ones_slot_is_free_again(counts_file):
    first = subprocess.Popen([sys.executable, "-c", CLAIM, str(counts_file)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "0"
        mine = balance.Balancer(counts_file, 2, connections=lambda: 0)
        assert mine.slot == 1  # slot 0 is locked by the other process
        mine.close()
    finally:
        first.kill()  # no clean-up of its own: the kernel drops its byte-range lock
        first.wait()
    again = balance.Balancer(counts_file, 2, connections=lambda: 0)
    try:
        assert again.slot == 0
    finally:
        again.close()


def test_a_full_file_refuses_another_worker(tmp_path):
    path = balance.create_file(tmp_path / "connections", 1)
    holder = subprocess.Popen([sys.executable, "-c", CLAIM, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "0"
        with pytest.raises(RuntimeError, match="all 1 balance slots are taken"):
            balance.Balancer(path, 2, connections=lambda: 0)
    finally:
        holder.kill()
        holder.wait()
