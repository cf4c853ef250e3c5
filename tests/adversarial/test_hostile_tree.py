"""A hostile tree is indexed safely (issue 32, items 2, 3 and 6): an ignore pattern built to
backtrack exponentially, files and directories swapped for links while the index runs, a branch
thousands of levels deep, and a directory the indexer may not read."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import MOONMIND, write_tree

pytestmark = pytest.mark.slow

#: `a*a*…*a*c`: against a ~40-character name of `a`s, git's glob as a backtracking regex tries every split.
BOMB = "*".join(["a"] * 18) + "*c"
MARKER = "SECRET-MARKER-7f3c9d2e-never-index-me"


def _index(cli, root: Path, repo: str, timeout: float = 60):
    r = cli("rag", "index", str(root), "--repo", repo, "--json", timeout=timeout)
    assert r.code == 0, r.stderr
    return r.json()


def _stored_texts(env) -> list[str]:
    from moonmind_worker.settings import get_settings
    from moonmind_worker.store import EdgeStore

    get_settings.cache_clear()
    settings = get_settings()
    store = EdgeStore(settings.data_dir, settings.collection)
    try:
        return [h.payload["text"] for h in store.scroll(None, ["text"])]
    finally:
        store.close()


def test_a_pattern_bomb_in_gitignore_is_left_out_with_a_note_and_the_index_completes(cli, tmp_path):
    names = {f"{'a' * 36}{i}.py": f"def bomb_target_{i}():\n    return {i}\n" for i in range(4)}
    root = write_tree(tmp_path / "bomb", {".gitignore": f"{BOMB}\n*.log\n", "debug.log": "noise\n", **names})
    report = _index(cli, root, "bomb")
    notes = [s["reason"] for s in report["skipped"] if s["path"] == ".gitignore"]
    assert any(BOMB in n and "not applied" in n for n in notes), report["skipped"]
    assert report["files_indexed"] == 5  # the four and .gitignore: the other pattern (*.log) still applies


def test_a_costly_but_legitimate_ignore_pattern_is_applied_in_linear_time(cli, tmp_path):
    # six stars: within the limit, so applied; as a backtracking regex, far past the timeout on these names
    pattern = "a*a*a*a*a*a*c"
    files = {f"{'a' * 200}{i}.py": f"def long_name_{i}():\n    return {i}\n" for i in range(3)}
    files["a_x_a_y_a_z_a_w_a_v_a_c"] = "ignored by the costly pattern\n"
    root = write_tree(tmp_path / "costly", {".gitignore": pattern + "\n", **files})
    report = _index(cli, root, "costly")
    assert report["files_indexed"] == 4  # the three and .gitignore
    assert not [s for s in report["skipped"] if s["path"] == ".gitignore"]


@pytest.mark.parametrize("what", ["file", "directory"])
def test_a_file_or_directory_swapped_for_a_link_mid_index_is_never_followed(cli, env, tmp_path, what):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text(f"{MARKER} = 'a secret outside the tree'\n")
    root = write_tree(tmp_path / "race", {f"m{i:03}.py": f"def module_{i}():\n    return {i}\n" for i in range(150)})
    spare = tmp_path / "spare"  # where the swapped-out twin waits: outside the tree, on its file system
    spare.mkdir()
    swaps = []
    for i in range(20):
        name = f"v{i:02}" + (".py" if what == "file" else "")
        place = root / name
        regular, link = spare / f"{name}.regular", spare / f"{name}.link"
        if what == "file":
            regular.write_text(f"def victim_{i}():\n    return {i}\n")
            os.symlink(outside / "victim.py", link)
        else:
            regular.mkdir()
            (regular / "victim.py").write_text(f"def victim_{i}():\n    return {i}\n")
            os.symlink(outside, link)
        os.replace(regular, place)
        swaps.append((place, regular, link))

    stop = threading.Event()

    def swapper() -> None:  # random victims flip between real and link, so what the walk lists is not what is there to read
        rnd, is_link = random.Random(32), [False] * len(swaps)
        while not stop.is_set():
            i = rnd.randrange(len(swaps))
            place, regular, link = swaps[i]
            os.replace(place, link if is_link[i] else regular)
            os.replace(regular if is_link[i] else link, place)
            is_link[i] = not is_link[i]

    t = threading.Thread(target=swapper, daemon=True)
    t.start()
    try:
        for _ in range(4):
            _index(cli, root, "race", timeout=120)
    finally:
        stop.set()
        t.join(10)
    texts = _stored_texts(env)
    assert texts, "nothing was indexed"
    assert not [x for x in texts if MARKER in x]
    on_disk = [f for f in Path(env["MOONMIND_HOME"]).rglob("*") if f.is_file() and MARKER.encode() in f.read_bytes()]
    assert not on_disk  # not even in a log or a write-ahead file


def _deep_chain(root: Path, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:  # relative to the root: the chain's absolute path would pass PATH_MAX
        for i in range(1, depth + 1):
            os.mkdir("/".join(["d"] * i), dir_fd=fd)
        bottom = os.open("/".join(["d"] * depth) + "/bottom.py", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(bottom, b"def bottom():\n    return 1\n")
        os.close(bottom)
    finally:
        os.close(fd)


def _remove_chain(root: Path, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:  # bottom up, without recursion (shutil.rmtree recurses once per level)
        os.unlink("/".join(["d"] * depth) + "/bottom.py", dir_fd=fd)
        for i in range(depth, 0, -1):
            os.rmdir("/".join(["d"] * i), dir_fd=fd)
    finally:
        os.close(fd)


def test_a_tree_2000_levels_deep_is_cut_at_the_depth_bound_and_the_rest_is_indexed(cli, tmp_path):
    from moonmind_worker.text.files import MAX_DEPTH

    root = write_tree(tmp_path / "deep", {"top.py": "def top():\n    return 1\n", "zz_after.py": "def after():\n    return 2\n"})
    _deep_chain(root, 2000)
    try:
        report = _index(cli, root, "deep", timeout=120)
    finally:
        _remove_chain(root, 2000)
    assert report["files_indexed"] == 2  # top.py and zz_after.py, on both sides of the deep branch
    cut = [s for s in report["skipped"] if f"deeper than {MAX_DEPTH} directory levels" in s["reason"]]
    assert len(cut) == 1 and cut[0]["path"] == "/".join(["d"] * (MAX_DEPTH + 1)), report["skipped"]


#: Runs a command as root without the capabilities that let root read any directory.
AS_ROOT_WITHOUT_DAC = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
                       "--bounding-set=-dac_override,-dac_read_search"]


def test_an_unreadable_directory_is_skipped_with_a_reason_and_the_rest_is_indexed(env, tmp_path):
    prefix: list[str] = []
    if os.geteuid() == 0:  # root reads a mode-000 directory: it runs without that power
        if shutil.which("setpriv") is None:
            pytest.skip("running as root, and setpriv (util-linux) is not there to drop CAP_DAC_OVERRIDE")
        prefix = AS_ROOT_WITHOUT_DAC
    root = write_tree(tmp_path / "repo", {
        "ok.py": "def readable():\n    return 1\n",
        "locked/inside.py": "def hidden():\n    return 2\n",
        "open/also.py": "def also_readable():\n    return 3\n",
    })
    os.chmod(root / "locked", 0)
    try:
        r = subprocess.run([*prefix, MOONMIND, "rag", "index", str(root), "--repo", "locked", "--json"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    finally:
        os.chmod(root / "locked", 0o755)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["files_indexed"] == 2
    reasons = {s["path"]: s["reason"] for s in report["skipped"]}
    assert reasons.get("locked") == "unreadable directory (Permission denied)", report["skipped"]
