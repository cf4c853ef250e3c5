"""The benchmark suite cannot rot: `python -m bench --quick` runs every stage end to end (issue 9)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import _SCRUB

ROOT = Path(__file__).resolve().parent.parent


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
        "| `rag search --execution sync` wall (embedded store) |", "| `rag search --execution queue` wall (warm worker) |",
        "| overlay upsert of one file |", "| TTL sweep of 1,000 expired overlay points |",
        "| peak memory, Celery worker (solo, warm) |", "| peak memory, CLI `rag search` sync |",
        "### Growth: embedded store (Qdrant Edge), synthetic vectors", "### Baseline: Qdrant Edge vs qdrant-client local mode",
        "### Baseline: BM25 alone vs ours", "### Where one machine stops being enough",
    ):
        assert figure in text, figure
    assert "| 1,000 | 1,000 |" in text  # the growth row reached its size

    sys.path.insert(0, str(ROOT))
    from bench.suite import BEGIN, END, write_section

    write_section(out, f"{BEGIN}\nnew run\n{END}\n")  # a later run replaces the section, never appends
    again = out.read_text()
    assert again.count(BEGIN) == 1 and "new run" in again and "kept as is" in again
