"""Disk full (issue 32, item 1): a clear `disk_full` naming the path, never a SIGBUS, and the next run resumes.

Real processes on a real small filesystem: MOONMIND_HOME on a tmpfs of a few MB (root only; skipped
otherwise), the installed `moonmind` one-shot (MOONMIND_OWNER=off, so the process that meets the full
disk is the CLI itself). Why tmpfs: the engine writes through memory maps, and there a page it
cannot back, even one only read, is a SIGBUS that killed the process with no message.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
from pathlib import Path

import pytest

from moonmind_worker.errors import EXIT_CONFIG

pytestmark = pytest.mark.slow

#: The exit status a shell shows for a process killed by SIGBUS (128 + 7).
SIGBUS_EXIT = 128 + signal.SIGBUS


@pytest.fixture
def small_fs(tmp_path: Path):
    """A mounted tmpfs (resized with `_resize`), unmounted whatever the test does."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _resize(mnt: Path, mb: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={mb}m", str(mnt)], check=True, capture_output=True)


def _fill(mnt: Path, leave: int = 0) -> Path:
    """Take every free byte of the filesystem but `leave` with a filler file (writes, not holes)."""
    filler = mnt / "filler"
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    with open(filler, "ab") as f:
        for size in (1 << 20, 4096):
            block = b"\0" * size
            while free - size >= leave:
                try:
                    f.write(block)
                    f.flush()
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
                free -= size
    return filler


def _tree(root: Path, files: int) -> Path:
    """Files whose chunks are all distinct (so each adds to the store): ~12 functions each."""
    rnd = random.Random(7)
    words = [f"w{rnd.randrange(10**6):06d}" for _ in range(4000)]
    for i in range(files):
        body = []
        for j in range(12):
            doc = " ".join(rnd.choice(words) for _ in range(40))
            body.append(f'def f{i}_{j}(x):\n    """{doc}"""\n    return x + {j}\n\n')
        p = root / f"pkg{i % 20}" / f"m{i}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(body))
    return root


@pytest.fixture
def on_fs(cli, small_fs: Path):
    """`cli` with MOONMIND_HOME on the small filesystem, one-shot."""
    extra = {"MOONMIND_HOME": str(small_fs / "home"), "MOONMIND_OWNER": "off"}

    def run(*args: str, **kw):
        return cli(*args, extra_env={**extra, **kw.pop("extra_env", {})}, **kw)

    return run


def _refused_clearly(r, home: Path) -> dict:
    """A `disk_full` error with exit 3 and no traceback: never a signal."""
    assert r.code not in (SIGBUS_EXIT, -signal.SIGBUS), f"killed by SIGBUS: {r.stderr[-2000:]}"
    assert r.code == EXIT_CONFIG, (r.code, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    err = r.error()
    assert err["code"] == "disk_full", err
    assert str(home) in err["message"] and "free" in err["message"], err
    assert "MOONMIND_HOME" in err["action"], err
    return err


def _no_signal(r) -> None:
    assert r.code >= 0 and r.code != SIGBUS_EXIT, f"killed by a signal ({r.code}): {r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr


def test_an_index_that_fills_the_disk_stops_with_disk_full_and_the_next_run_resumes(on_fs, small_fs, tmp_path):
    tree = _tree(tmp_path / "big", 3000)  # a few batches fit in 56 MB, not all of them
    _resize(small_fs, 56)
    r = on_fs("rag", "index", str(tree), "--repo", "big", "--json")
    _refused_clearly(r, small_fs / "home")
    # the run stopped with room left for reads: what it wrote is searchable at once
    assert on_fs("rag", "search", "w000123 f12_3", "--repo", "big").code == 0

    _resize(small_fs, 400)
    again = on_fs("rag", "index", str(tree), "--repo", "big", "--json")
    assert again.code == 0, again.stderr[-2000:]
    report = again.json()
    assert 0 < report["files_unchanged"] < 3000, report  # what the first run wrote is kept, the rest written now
    assert report["files_unchanged"] + report["files_indexed"] == 3000, report


@pytest.fixture
def indexed_full(on_fs, small_fs: Path, repo: Path, tmp_path: Path):
    """The fixture repository indexed, then a larger tree indexed until it filled the disk."""
    _resize(small_fs, 80)
    r = on_fs("rag", "index", str(repo), "--repo", "demo", "--json")
    assert r.code == 0, r.stderr[-2000:]
    big = on_fs("rag", "index", str(_tree(tmp_path / "big", 3000)), "--repo", "big", "--json")
    assert big.code != 0, "the larger tree fits: make it larger"
    return repo


def test_searches_stats_and_doctor_keep_working_after_an_index_filled_the_disk(on_fs, indexed_full, small_fs):
    def reads_work() -> None:
        r = on_fs("rag", "search", "bearer token", "--repo", "demo", "--json")
        _no_signal(r)
        assert r.code == 0, r.stderr[-2000:]
        assert "tokens.py" in r.stdout
        stats = on_fs("rag", "stats", "--repo", "demo", "--json")
        _no_signal(stats)
        assert stats.code == 0, stats.stderr[-2000:]
        doctor = on_fs("worker", "doctor")
        _no_signal(doctor)
        assert doctor.code == 0, doctor.stdout[-2000:] + doctor.stderr[-2000:]

    reads_work()
    # and with the rest taken by someone else, but for what an open may write: the engine sometimes
    # rewrites a payload index's preallocated 1 MiB flags file as it opens; with less free, that
    # rewrite falls short and leaves a hole, and the next open is then refused as disk_full (tested below)
    _fill(small_fs, leave=(1 << 20) + (64 << 10))
    reads_work()


def _shard_with_a_hole(small_fs: Path, hole: int, wal: bool) -> Path:
    """A shard whose one mapped payload-index file (1 MiB, as the engine preallocates them) has `hole` bytes unwritten."""
    shard = small_fs / "home" / "shard"
    index = shard / "segments" / "s1" / "payload_index" / "path-map"
    index.mkdir(parents=True)
    with open(index / "flags_a.dat", "wb") as f:
        f.write(b"\1" * ((1 << 20) - hole))
        f.truncate(1 << 20)
    if wal:
        (shard / "wal").mkdir()
    return shard


def test_a_shard_without_a_log_opens_when_the_holes_it_reads_fit_in_what_is_free(small_fs):
    """A refused write leaves a few pages unwritten; the reads after it must still open the store."""
    from moonmind_worker.store.edge_disk import room_to_open

    shard = _shard_with_a_hole(small_fs, 16 << 10, wal=False)
    _fill(small_fs, leave=256 << 10)
    room_to_open(small_fs / "home", shard)  # needs the hole and a little: no error


@pytest.mark.parametrize(("hole", "wal"), [(16 << 10, True), (512 << 10, False)], ids=["log-replayed-on-open", "holes-past-free"])
def test_an_open_that_may_take_more_than_is_free_is_disk_full(small_fs, hole, wal):
    from moonmind_worker.errors import MoonmindError
    from moonmind_worker.store.edge_disk import room_to_open

    shard = _shard_with_a_hole(small_fs, hole, wal=wal)
    _fill(small_fs, leave=256 << 10)
    with pytest.raises(MoonmindError) as refused:
        room_to_open(small_fs / "home", shard)
    assert refused.value.code == "disk_full" and "opening the store" in refused.value.message


def test_with_not_one_byte_free_reads_fail_with_disk_full_not_a_signal(on_fs, indexed_full, small_fs):
    _fill(small_fs)
    for args in (("rag", "search", "bearer token", "--repo", "demo", "--json"),
                 ("rag", "stats", "--repo", "demo", "--json")):
        got = on_fs(*args)
        _no_signal(got)
        if got.code:  # the engine rewrites its config file on every open: one page it cannot have
            _refused_clearly(got, small_fs / "home")
    doctor = on_fs("worker", "doctor")
    _no_signal(doctor)
    assert doctor.code == 0 or "No room for opening the store" in doctor.stdout, doctor.stdout[-2000:]


def test_a_store_never_opened_is_refused_on_a_full_disk_with_disk_full_not_a_signal(on_fs, small_fs, repo):
    _resize(small_fs, 80)
    r = on_fs("rag", "index", str(repo), "--repo", "demo", "--json")
    assert r.code == 0, r.stderr[-2000:]
    # before any search: on tmpfs the first open takes a page for every hole of the payload indexes it reads
    _fill(small_fs, leave=64 << 10)
    for args in (("rag", "search", "bearer token", "--repo", "demo", "--json"),
                 ("rag", "stats", "--repo", "demo", "--json")):
        _refused_clearly(on_fs(*args), small_fs / "home")


def test_an_overlay_upsert_on_a_full_disk_is_disk_full_and_the_store_still_answers(on_fs, indexed_full, small_fs):
    (indexed_full / "auth/tokens.py").write_text("".join(
        f"def edited_{n}(x):\n    return x * {n}  # an edit made while the disk is full\n\n" for n in range(400)))
    job = {"MOONMIND_RUN_ID": "run-1", "MOONMIND_REPO": "demo"}
    _fill(small_fs, leave=256 << 10)  # room to open the store, not to write an edit's chunks safely
    r = on_fs("rag", "overlay", "upsert", "auth/tokens.py", "--json", cwd=indexed_full, extra_env=job)
    _refused_clearly(r, small_fs / "home")
    after = on_fs("rag", "search", "bearer token", "--repo", "demo", "--json")
    assert after.code == 0, after.stderr[-2000:]


def test_running_out_of_space_in_the_final_optimize_is_disk_full_and_the_next_run_finishes(on_fs, small_fs, tmp_path):
    """Room for the chunks, not for the optimize that builds their graph (it copies the segment)."""
    tree = _tree(tmp_path / "many", 4000)  # past the engine's indexing threshold
    _resize(small_fs, 144)
    r = on_fs("rag", "index", str(tree), "--repo", "many", "--json")
    err = _refused_clearly(r, small_fs / "home")
    assert "optimizing" in err["message"] and "Not enough space" in err["message"], err
    _resize(small_fs, 512)
    again = on_fs("rag", "index", str(tree), "--repo", "many", "--json")
    assert again.code == 0, again.stderr[-2000:]
    assert again.json()["files_unchanged"] == 4000
