"""The benchmark suite cannot rot: `python -m bench --quick` runs every stage end to end (issue 9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import _SCRUB

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quick_benchmark_runs_every_stage_and_keeps_other_sections(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\n## Someone else's section\n\nkept as is\n")
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    cmd = [sys.executable, "-m", "bench", "--quick", "--output", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    text = out.read_text()
    assert text.count("<!-- bench:suite:begin -->") == 1 and text.count("<!-- bench:suite:end -->") == 1
    assert "## Someone else's section\n\nkept as is" in text
    for figure in (
        "| index throughput |", "| no-change re-index |", "| search stage p50 (store request) |",
        "| `rag search --execution sync` wall (embedded store) |", "| `rag search` served by the box's owner (default settings) |",
        "| `rag search --execution queue` wall (warm worker) |",
        "| overlay upsert of one file |", "| TTL sweep of 1,000 expired overlay points |",
        "| peak memory, Celery worker (solo, warm) |", "| peak memory, CLI `rag search` sync |",
        "### Growth: embedded store (Qdrant Edge), synthetic vectors", "### Baseline: Qdrant Edge vs qdrant-client local mode",
        "### Baseline: BM25 alone vs ours", "### Where one machine stops being enough",
        "### Retrieval quality per language",
    ):
        assert figure in text, figure
    assert "| 1,000 | 1,000 |" in text  # the growth row reached its size
    smoke = next(line for line in text.splitlines() if line.startswith("| Python (this checkout) |"))
    assert float(smoke.split("|")[4]) > 0.3, smoke  # the smoke set finds its files (0.000: its targets moved)

    sys.path.insert(0, str(ROOT))
    from bench.suite import BEGIN, END, write_section

    write_section(out, f"{BEGIN}\nnew run\n{END}\n")  # a later run replaces the section, never appends
    again = out.read_text()
    assert again.count(BEGIN) == 1 and "new run" in again and "kept as is" in again


def test_a_quick_run_never_replaces_a_full_runs_figures(tmp_path):
    sys.path.insert(0, str(ROOT))
    from bench.suite import BEGIN, END, FULL_TITLE, write_section

    out = tmp_path / "BENCHMARKS.md"
    out.write_text(f"# Benchmarks\n\n{BEGIN}\n{FULL_TITLE}\n\nfull figures\n{END}\n")
    written = write_section(out, f"{BEGIN}\n## Benchmark suite (`python -m bench --quick`)\n\nquick figures\n{END}\n")
    assert written == tmp_path / "BENCHMARKS.quick.md"
    assert "full figures" in out.read_text() and "quick figures" not in out.read_text()
    assert "quick figures" in written.read_text()
    assert write_section(out, f"{BEGIN}\n{FULL_TITLE}\n\nnew full figures\n{END}\n") == out  # a full run replaces it
    assert "new full figures" in out.read_text() and "\nfull figures" not in out.read_text()


WRK_OUT_32 = """Running 10s test @ http://127.0.0.1:50615
  2 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   121.59ms    8.28ms 169.29ms   95.03%
    Req/Sec   131.16     27.31   161.00     46.50%
  Latency Distribution
     50%  120.96ms
     75%  122.74ms
     90%  126.08ms
     99%  157.56ms
  2617 requests in 10.02s, 72.41MB read
Requests/sec:    261.26
Transfer/sec:      7.23MB
"""


def test_wrk_summary_is_read_from_the_distribution_not_from_a_stdev_column_ending_in_50_percent():
    from bench.gateway_bench import parse_wrk

    assert parse_wrk(WRK_OUT_32) == {"rps": 261.26, "p50_ms": 120.96, "p99_ms": 157.56, "requests": 2617, "non_2xx": 0}


@pytest.mark.slow
def test_index_profile_reports_every_stage_and_the_search_latency_it_buys(tmp_path):
    from conftest import FIXTURE_FILES, write_tree

    tree = write_tree(tmp_path / "tree", FIXTURE_FILES)
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    r = subprocess.run([sys.executable, "-m", "bench.index_profile", "--source", str(tree)], env=env,
                       cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for stage in ("walk", "read", "chunk", "embed", "BM25 vectors", "store writes", "optimize"):
        assert f"| {stage}" in r.stdout, r.stdout
    assert "chunks/s" in r.stdout and "search p50 on plain segments" in r.stdout



@pytest.mark.slow
def test_index_memory_breaks_the_runs_peak_down_by_process(tmp_path):
    """The per-process view behind the suite's summed peak: every process of the run with RSS, PSS,
    anonymous and file-backed memory at that peak, and the writer's largest mappings."""
    from conftest import FIXTURE_FILES, write_tree

    tree = write_tree(tmp_path / "tree", FIXTURE_FILES)
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    r = subprocess.run([sys.executable, "-m", "bench.index_memory", "--source", str(tree)], env=env,
                       cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "summed RSS peak" in r.stdout and "| process | RSS | PSS | anonymous | file-backed |" in r.stdout
    assert "| writer (rag index) |" in r.stdout and "[heap]" in r.stdout, r.stdout


@pytest.mark.slow
def test_index_timeline_shows_the_cores_the_writer_and_its_workers_used_over_the_run(tmp_path):
    """When a cold index keeps the cores busy and when not: a row per interval, and the run's summary."""
    from conftest import FIXTURE_FILES, write_tree

    tree = write_tree(tmp_path / "tree", FIXTURE_FILES)
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    r = subprocess.run([sys.executable, "-m", "bench.index_timeline", "--source", str(tree), "--every", "0.05"], env=env,
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "| t (s) | writer cores | worker cores | workers | summed RSS |" in r.stdout, r.stdout
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ") and "MiB |" in line]
    assert rows and "wall " in r.stdout and "peak summed RSS" in r.stdout, r.stdout
    assert max(float(row.split("|")[2]) for row in rows) > 0, r.stdout  # the writer was seen working


@pytest.mark.slow
def test_dense_graph_reports_build_latency_and_recall_per_variant_and_names_a_bad_one(tmp_path):
    """The dense index's options on a real index's vectors; a mistyped variant is refused before any index run."""
    from conftest import FIXTURE_FILES, write_tree

    tree = write_tree(tmp_path / "tree", FIXTURE_FILES)
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    cmd = [sys.executable, "-m", "bench.dense_graph", "--source", str(tree), "--builds", "1", "--queries", "4"]
    r = subprocess.run([*cmd, "--variant", "graph:m=12", "--variant", "plain-int8"], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for variant in ("graph:m=12", "plain-int8"):
        row = next(line for line in r.stdout.splitlines() if line.startswith(f"| {variant} |"))
        assert row.split("|")[5].strip() == "1.0000", row  # a tree this small is searched whole: every query exact
    bad = subprocess.run([*cmd, "--variant", "graph:m=x"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "bad option 'm=x'" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_same_output_finds_identical_searches_identical_and_reports_a_changed_one(prebuilt, home, tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "bench.same_output", "--home", str(home), "--only", "q00", "symbol", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)

    saved = tmp_path / "saved"
    assert run("--save", str(saved)).returncode == 0
    same = run("--compare", str(saved))
    assert same.returncode == 0 and "byte-identical" in same.stdout
    (saved / "q00.md.out").write_text((saved / "q00.md.out").read_text() + "one more line\n")
    changed = run("--compare", str(saved))
    assert changed.returncode == 1 and "-one more line" in changed.stdout and "1 output(s) differ" in changed.stdout


def test_the_quick_smoke_set_names_files_that_exist():
    """`python -m bench --quick` scores eval-python-moonmind.json on this checkout: its targets must be here."""
    data = json.loads((ROOT / "bench" / "eval-python-moonmind.json").read_text())
    named = [p for q in data["queries"] for p in q["relevant"] + q.get("secondary", [])]
    assert named and [p for p in named if not (ROOT / p).is_file()] == []


def _hosted_latency(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([sys.executable, "-m", "bench.hosted_latency", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_hosted_latency_names_a_missing_corpus_instead_of_a_traceback(tmp_path):
    p = _hosted_latency("--corpus", str(tmp_path / "missing"))
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    assert f"--corpus {tmp_path / 'missing'} is not a directory" in p.stderr and "fetched on first use" in p.stderr


@pytest.mark.slow
def test_hosted_latency_runs_on_a_given_tree_without_the_shared_eval_file(tmp_path):
    from conftest import FIXTURE_FILES, write_tree

    tree = write_tree(tmp_path / "tree", FIXTURE_FILES)
    p = _hosted_latency("--corpus", str(tree), "--repo", "demo", "--queries", str(tmp_path / "absent.json"),
                        "--rounds", "1", "--cli-runs", "1", "--median-ms", "1", "--sigma", "0.1")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "using the suite's 10 queries" in p.stderr
    out = json.loads(p.stdout)
    assert out["in_process_whole_query"]["n"] == 10 and out["cli_process_whole_query"]["n"] == 1


def test_a_measured_process_tree_counts_the_cpu_of_the_children_it_reaped():
    """`measure.run_tree_measured` (bench.peer's CPU columns): a parent that spends no CPU itself but waits for a
    child that spends 0.3 s of CPU is measured at 0.3 s or more, with its exit code."""
    from bench.measure import run_tree_measured

    child = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    parent = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {child!r}])\nsys.exit(3)"
    r = run_tree_measured([sys.executable, "-c", parent], dict(os.environ), every_s=0.01)
    assert r.code == 3
    assert r.cpu_s >= 0.3


def test_the_peers_file_set_is_copied_at_its_paths_and_nothing_else(tmp_path):
    """`bench.peer --same-files`: the copy both tools index holds exactly the files of the peer's types (its suffix
    match: lower-cased), at their relative paths, with their bytes; other types and links stay out."""
    from bench.peer import same_files_tree

    src = tmp_path / "src"
    (src / "pkg" / "locale").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("def a():\n    return 1\n")
    (src / "pkg" / "B.PY").write_text("x = 1\n")
    (src / "pkg" / "locale" / "django.po").write_text('msgid "a"\n')
    (src / "README.txt").write_text("docs\n")
    (src / "link.py").symlink_to(src / "pkg" / "a.py")
    dest = tmp_path / "dest"
    files, size = same_files_tree(src, dest, frozenset({".py"}))
    copied = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert copied == ["pkg/B.PY", "pkg/a.py"]
    assert (files, size) == (2, len("def a():\n    return 1\n") + len("x = 1\n"))
    assert (dest / "pkg" / "a.py").read_text() == (src / "pkg" / "a.py").read_text()


@pytest.mark.slow
def test_peer_baseline_times_both_indexes_on_one_tree_and_reports_the_ratio_and_query_latency():
    """`python -m bench.peer --quick --same-files` (issue 36): our cold index and semble's build interleaved on a small
    tree, with the shipped model converted for the peer, then on the copy holding only the peer's default file types,
    and the query latency of every path."""
    pytest.importorskip("semble")
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    r = subprocess.run([sys.executable, "-m", "bench.peer", "--quick", "--same-files"], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("| 1 |")]
    assert len(rows) == 4, r.stdout  # the tree, then the same files; the peer as its CLI runs (4) and its library (0)
    assert all(row.count("MiB") == 2 and "**" in row for row in rows), r.stdout
    assert [row.split("|")[2].strip() for row in rows] == ["4", "in-process (library default)"] * 2
    assert r.stdout.count("CPU (user + system, whole process tree) ratio median") == 4
    assert "its table float32" in r.stdout
    assert "the same files: the " in r.stdout
    for path in ("ours in-process", "semble in-process", "ours one-shot", "ours served", "semble CLI"):
        assert f"| {path}" in r.stdout, r.stdout


def test_the_peer_gets_our_model_as_model2vec_ships_models_a_float32_table(tmp_path):
    """Issue 55: handed our float16 table as is, the peer ran ~15% slower than on the same table in float32."""
    from safetensors.numpy import load_file

    from bench.peer import MODEL_DIR, convert_model

    ours = load_file(str(MODEL_DIR / "embeddings.safetensors"))["embeddings"]
    given = load_file(str(convert_model(tmp_path / "m") / "model.safetensors"))["embeddings"]
    assert given.dtype.name == "float32" and given.shape == ours.shape
    assert (given == ours.astype("float32")).all()  # the same table, widened


def test_the_catalog_bench_asks_for_each_gettext_message_with_the_files_that_say_it(tmp_path):
    from bench.catalogs import messages

    (tmp_path / "forms").mkdir()
    (tmp_path / "forms" / "fields.py").write_text(
        'ERR = _("Enter a valid email address.")\nOTHER = gettext_lazy(\'Ensure this value is positive.\')\n'
        'FMT = _("Ensure this value has at most %(max)d characters.")\nSHORT = _("Required")\n')
    (tmp_path / "core.py").write_text('raise ValueError(__("Enter a valid email address."))\n')
    found = messages(tmp_path, 10)
    assert found == {"Enter a valid email address.": {"forms/fields.py", "core.py"},
                     "Ensure this value is positive.": {"forms/fields.py"}}  # no format fields, nothing short
    first = messages(tmp_path, 1)
    assert len(first) == 1 and first.items() <= found.items()  # a sample of them
    assert messages(tmp_path, 1) == first  # in the seeded order
