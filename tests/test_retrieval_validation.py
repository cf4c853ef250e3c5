"""Spec 05 acceptance: retrieval parameters, validation, inspection, stats, a book corpus and `rag eval`.

Every test drives the installed `moonmind` CLI against a real Qdrant Edge store.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from moonmind_worker.retrieval.evaluation import first_target_rank, ndcg_at_k, recall_at_k

from conftest import write_tree


@pytest.fixture
def indexed(prebuilt):
    """The fixture repository indexed as repo=demo, tenant=acme: a copy of the session's index (these
    tests search it; how `rag index` builds it is test_indexing.py's subject), not a `rag index` each."""
    return prebuilt


FR007 = (
    "chunk_id", "source", "section_title", "text", "content_hash", "chunk_sequence", "total_chunks",
    "indexed_at", "token_count", "model_version", "score",
)


def search(cli, *args: str):
    r = cli("rag", "search", "--filters", "repo=demo", "--json", *args)
    assert r.code == 0, r.stderr
    return r.json(), r.stderr


# ------------------------------------------------------------ US2: parameters ---


@pytest.mark.slow
def test_top_k_three_returns_at_most_three(cli, indexed):
    pack, _ = search(cli, "-q", "connection pool", "--top-k", "3", "--score-threshold", "0")
    assert len(pack["items"]) == 3


@pytest.mark.slow
def test_threshold_keeps_only_scores_at_or_above_it(cli, indexed):
    loose, _ = search(cli, "-q", "validate bearer token header", "--score-threshold", "0", "--top-k", "20")
    strict, _ = search(cli, "-q", "validate bearer token header", "--score-threshold", "0.7", "--top-k", "20")
    assert any(i["score"] < 0.7 for i in loose["items"])  # the threshold has something to remove
    assert all(i["score"] >= 0.7 for i in strict["items"])
    assert [i["chunk_id"] for i in strict["items"]] == [i["chunk_id"] for i in loose["items"] if i["score"] >= 0.7]


@pytest.mark.slow
def test_top_k_and_threshold_together(cli, indexed):
    pack, _ = search(cli, "-q", "database connections", "--top-k", "2", "--score-threshold", "0.3")
    assert 1 <= len(pack["items"]) <= 2
    assert all(i["score"] >= 0.3 for i in pack["items"])


@pytest.mark.slow
def test_results_are_ordered_by_score_in_unit_range(cli, indexed):
    pack, _ = search(cli, "-q", "render an HTML template", "--top-k", "10", "--score-threshold", "0")
    scores = [i["score"] for i in pack["items"]]
    assert len(scores) >= 3
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in scores)


# ----------------------------------------------------------- US4: inspection ---


@pytest.mark.slow
def test_every_fr007_field_is_present_and_content_is_never_truncated(cli, indexed):
    pack, _ = search(cli, "-q", "ConnectionPool acquire", "--top-k", "5", "--score-threshold", "0")
    assert pack["items"]
    for item in pack["items"]:
        for key in FR007:
            assert key in item and item[key] is not None, key
        whole = (indexed / item["source"]).read_text()
        assert item["text"] == whole[item["offset_start"] : item["offset_end"]]
        assert item["total_chunks"] > item["chunk_sequence"] >= 0


# --------------------------------------------------------- US3: validation ---


@pytest.mark.slow
def test_blank_query_is_a_validation_error(cli, indexed):
    r = cli("rag", "search", "-q", "   ", "--json")
    assert r.code == 2
    assert r.error()["code"] == "invalid_query" and "empty" in r.error()["message"]
    assert r.stdout == ""


@pytest.mark.slow
def test_query_over_1000_characters_is_processed_with_a_note(cli, indexed):
    long_query = ("how does the connection pool hand out database connections " * 30)[:1500]
    pack, stderr = search(cli, "-q", long_query, "--score-threshold", "0")
    assert pack["items"]
    assert any("1500 characters" in n for n in pack["notes"])
    assert "note:" in stderr


@pytest.mark.slow
def test_special_characters_only_are_searched_and_an_empty_result_says_so(cli, indexed):
    pack, stderr = search(cli, "-q", "@#$%^&*()!?", "--score-threshold", "0.95")
    assert pack["items"] == []
    assert any("no chunk scored" in n for n in pack["notes"])
    assert "no chunk scored" in stderr


@pytest.mark.slow
def test_unreachable_store_is_a_connection_error_not_a_crash(cli, indexed):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    r = cli("rag", "search", "-q", "pool", "--json", extra_env={"QDRANT_URL": f"http://127.0.0.1:{port}"})
    assert r.code == 4
    assert r.error()["code"] == "qdrant_unreachable"
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.slow
def test_same_query_five_times_gives_identical_results(cli, indexed):
    runs = [search(cli, "-q", "token scopes", "--score-threshold", "0")[0]["items"] for _ in range(5)]
    assert all(run == runs[0] for run in runs)
    assert runs[0]


# ------------------------------------------------------------- SC-003: stats ---


@pytest.mark.slow
def test_stats_shows_per_file_counts_and_finds_files_no_chunk_represents(cli, indexed):
    r = cli("rag", "stats", "--repo", "demo", "--root", str(indexed), "--json")
    assert r.code == 0, r.stderr
    stats = r.json()
    counts = {f["path"]: f["chunks"] for f in stats["files"]}
    assert set(counts) == {"auth/tokens.py", "db/pool.py", "docs/guide.md", "web/render.js"}
    assert all(n >= 1 for n in counts.values()) and stats["chunks"] == sum(counts.values())
    assert stats["orphans"] == []

    (indexed / "db" / "migrations.py").write_text("def migrate():\n    return 'schema v2'\n")
    r = cli("rag", "stats", "--repo", "demo", "--root", str(indexed))
    assert r.code == 0, r.stderr
    assert "orphaned files (1)" in r.stdout and "db/migrations.py" in r.stdout
    assert "auth/tokens.py" in r.stdout


# ------------------------------------------------------ SC-007: a small book ---

BOOK = {
    "docs/module-01-ros2/01-nodes.md": """
        # Module 1: The Robotic Nervous System

        ## ROS 2 nodes and topics

        A ROS 2 node is a process that publishes and subscribes to topics. Nodes exchange
        typed messages over DDS; a publisher writes to a topic and every subscriber receives it.

        ## Services and actions

        Services are synchronous request/response calls between nodes; actions add feedback
        and cancellation for long-running goals such as navigating to a pose.
        """,
    "docs/module-01-ros2/02-urdf.md": """
        # Describing a humanoid with URDF

        ## Links and joints

        The Unified Robot Description Format lists the links (rigid bodies) and joints of a
        humanoid robot: hip, knee and ankle joints with their limits and inertia.
        """,
    "docs/module-02-simulation/01-gazebo.md": """
        # Module 2: The Digital Twin

        ## Simulating physics in Gazebo

        Gazebo simulates gravity, collisions and friction so a robot can be tested before it
        exists. Load a world file, spawn the robot model and run the physics engine.

        ## Sensors in simulation

        Simulated LiDAR, depth cameras and IMUs publish noisy readings like real hardware.
        """,
    "docs/module-03-isaac/01-perception.md": """
        # Module 3: The AI-Robot Brain

        ## Visual SLAM with Isaac ROS

        NVIDIA Isaac ROS runs hardware-accelerated visual SLAM to map the room and localise
        the robot, and Nav2 plans a path through that map.
        """,
    "docs/module-04-vla/01-voice.md": """
        # Module 4: Vision-Language-Action

        ## Voice commands with Whisper

        Speech is transcribed with Whisper, a language model turns the command into a plan,
        and the plan becomes a sequence of ROS 2 actions for the humanoid.
        """,
}


@pytest.fixture
def book(cli, tmp_path: Path) -> Path:
    root = write_tree(tmp_path / "book", BOOK)
    r = cli("rag", "index", str(root), "--repo", "book")
    assert r.code == 0, r.stderr
    return root


@pytest.mark.slow
@pytest.mark.parametrize(
    "query, chapter",
    [
        ("Gazebo simulation", "docs/module-02-simulation/"),
        ("humanoid URDF joints", "docs/module-01-ros2/02-urdf.md"),
        ("how do ROS 2 nodes publish messages", "docs/module-01-ros2/01-nodes.md"),
        ("visual SLAM mapping", "docs/module-03-isaac/"),
        ("voice commands", "docs/module-04-vla/"),
    ],
)
def test_book_topic_queries_come_from_the_right_chapter(cli, book, query, chapter):
    r = cli("rag", "search", "-q", query, "--filters", "repo=book", "--top-k", "3", "--json")
    assert r.code == 0, r.stderr
    items = r.json()["items"]
    assert items, r.stderr
    assert items[0]["source"].startswith(chapter)
    assert items[0]["section_title"]  # the heading path travels with the chunk


@pytest.mark.slow
def test_markdown_chunks_carry_their_heading_path(cli, book):
    r = cli("rag", "search", "-q", "simulated LiDAR depth cameras IMU", "--filters", "repo=book", "--top-k", "1", "--json")
    assert r.code == 0, r.stderr
    item = r.json()["items"][0]
    assert item["source"] == "docs/module-02-simulation/01-gazebo.md"
    assert item["section_title"] == "Module 2: The Digital Twin > Sensors in simulation"


INSTALL_BOOK = {
    "docs/module-01-ros2/00-installation.md": """
        # Module 1: Installing ROS 2

        ## Installing ROS 2 Humble on Ubuntu

        Add the ROS 2 apt repository and its signing key, then install the desktop variant with
        `sudo apt install ros-humble-desktop`. This installs the core libraries, RViz and the demos.

        ## Sourcing the environment

        Every new shell needs the ROS 2 environment: source `/opt/ros/humble/setup.bash`, or add that
        line to your `~/.bashrc` so the `ros2` command is always on the path.

        ## Verifying the installation

        Run the talker and listener demos in two terminals. If the listener prints the talker's
        messages, the installation works and DDS discovery is reaching both nodes.
        """,
    "docs/module-02-simulation/01-gazebo.md": """
        # Module 2: The Digital Twin

        ## Installing Gazebo

        Gazebo needs a working ROS 2 installation first (see Module 1); then install the
        `ros-humble-gazebo-ros-pkgs` bridge so simulated topics appear in ROS 2.
        """,
    "docs/module-03-isaac/01-perception.md": """
        # Module 3: The AI-Robot Brain

        ## Setting up Isaac ROS

        Isaac ROS runs inside a container on top of a ROS 2 installation; install the NVIDIA
        container toolkit and pull the Isaac ROS development image.
        """,
    "docs/module-04-vla/01-voice.md": """
        # Module 4: Vision-Language-Action

        ## Installing Whisper

        Install Whisper with pip next to your ROS 2 installation; the model weights are
        downloaded once and cached.
        """,
}


@pytest.mark.slow
def test_sc001_ros2_installation_gets_three_of_the_top_five_from_the_ros2_module(cli, tmp_path):
    """SC-001: a chapter's sections on the topic outrank passing mentions of it in other modules."""
    root = write_tree(tmp_path / "book", BOOK | INSTALL_BOOK)
    assert cli("rag", "index", str(root), "--repo", "book").code == 0
    r = cli("rag", "search", "-q", "ROS2 installation", "--filters", "repo=book", "--top-k", "5", "--json")
    assert r.code == 0, r.stderr
    ros2 = [i for i in r.json()["items"] if i["source"].startswith("docs/module-01-ros2/")]
    assert len(ros2) >= 3
    assert all(i["score"] > 0.5 for i in ros2[:3])


# ------------------------------------------------------------- rag eval ---


def test_ndcg_matches_a_hand_computed_example():
    # targets a and b; a at rank 1, b at rank 3 (x repeats and counts once)
    files = ["a.py", "x.py", "x.py", "b.py", "c.py"]
    # DCG = 1/log2(2) + 1/log2(4) = 1.5 ; IDCG = 1/log2(2) + 1/log2(3) = 1.6309...
    assert ndcg_at_k(files, {"a.py", "b.py"}, 10) == pytest.approx(1.5 / 1.6309297535714575)
    # only one target: ideal DCG is a single hit at rank 1
    assert ndcg_at_k(["x.py", "a.py"], {"a.py"}, 10) == pytest.approx(0.6309297535714575)
    assert ndcg_at_k(["x.py", "a.py"], {"a.py"}, 1) == 0.0
    assert recall_at_k(files, {"a.py", "b.py", "z.py"}, 2) == pytest.approx(1 / 3)
    assert first_target_rank(files, {"b.py"}) == 3


@pytest.mark.slow
def test_rag_eval_reports_metrics_and_failed_queries(cli, indexed, tmp_path):
    queries = {
        "queries": [
            {"query": "ConnectionPool", "relevant": ["db/pool.py"], "secondary": [], "category": "symbol"},
            {"query": "check a bearer token", "relevant": ["auth/tokens.py"], "secondary": [], "category": "semantic"},
            {"query": "render a template", "relevant": ["nowhere/missing.py"], "secondary": [], "category": "semantic"},
        ]
    }
    qfile = tmp_path / "q.json"
    qfile.write_text(json.dumps(queries))
    r = cli("rag", "eval", "--queries", str(qfile), "--repo", "demo", "--json")
    assert r.code == 0, r.stderr  # a failing query is a result, not an error
    report = r.json()
    by_query = {q["query"]: q for q in report["results"]}
    assert by_query["ConnectionPool"]["files"][0] == "db/pool.py"
    assert by_query["ConnectionPool"]["ndcg"] == 1.0
    assert by_query["render a template"]["ndcg"] == 0.0
    assert [f["query"] for f in report["failed"]] == ["render a template"]
    assert by_query["render a template"]["files"]  # what came back instead
    expected = sum(q["ndcg"] for q in report["results"]) / 3
    assert report["ndcg"] == pytest.approx(expected, abs=1e-4)
    assert set(report["categories"]) == {"semantic", "symbol"}
    assert report["latency_p95_ms"] >= report["latency_p50_ms"] > 0

    text = cli("rag", "eval", "--queries", str(qfile), "--repo", "demo")
    assert text.code == 0 and "NDCG@10" in text.stdout and "nowhere/missing.py" in text.stdout


@pytest.mark.slow
def test_rag_eval_rejects_a_malformed_query_file(cli, indexed, tmp_path):
    qfile = tmp_path / "bad.json"
    qfile.write_text(json.dumps({"queries": [{"query": "x"}]}))
    r = cli("rag", "eval", "--queries", str(qfile), "--json")
    assert r.code == 2 and r.error()["code"] == "invalid_argument" and r.stdout == ""
