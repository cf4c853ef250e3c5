"""`bench.token_economy`'s counting: the grep + read baseline with the real `grep`, and the reading model."""

from __future__ import annotations

from pathlib import Path

from bench.token_economy import grep_files, grep_reads, score

from conftest import write_tree


def test_grep_keeps_the_files_holding_every_word_and_drops_the_least_distinctive_word_when_none_does(tmp_path: Path):
    root = write_tree(tmp_path / "t", {
        "a.py": "retry the request with backoff\n",
        "b.py": "request handling\n",
        "c.py": "request parsing\n",
        "d.py": "backoff jitter\n",
    })
    assert grep_files(root, "retry request backoff") == ["a.py"]
    # no file holds "jitter" and "request" together: "request" (in the most files) goes, "jitter" stays
    assert grep_files(root, "jitter request") == ["d.py"]
    assert grep_files(root, "nowhere to be found") == []


def test_grep_and_read_counts_the_list_then_each_file_whole_in_path_order(tmp_path: Path):
    root = write_tree(tmp_path / "t", {"a.py": "x" * 400, "b.py": "y" * 40})
    reads = grep_reads(root, ["a.py", "b.py"])
    listing = (len("./a.py\n./b.py\n") + 3) // 4  # characters / 4, rounded up
    assert reads == [("a.py", listing + 100), ("b.py", listing + 110)]
    scored = score(reads, {"b.py", "missing.py"}, reads[-1][1])
    assert scored["first"] == listing + 110
    assert scored["recall"] == {500: 0.5, 1000: 0.5, 2000: 0.5, 4000: 0.5}  # one of two targets, read within 500
