"""The operations' JSON shapes (`wire.py`) name exactly the fields of the contracts they stand for.

`operations.py` is typed against these TypedDicts so the thin client never imports pydantic; this
holds them to the models (and to the answers the operations really give), so neither drifts.
"""

from __future__ import annotations

from pathlib import Path
from typing import get_type_hints

import pytest

from moonmind_worker import contracts, wire

PAIRS = [
    (wire.QueryFields, contracts.RetrievalQuery),
    (wire.ContextPackJSON, contracts.ContextPack),
    (wire.SymbolsResultJSON, contracts.SymbolsResult),
    (wire.IndexRequestJSON, contracts.IndexRequest),
    (wire.IndexReportJSON, contracts.IndexReport),
    (wire.OverlayUpsertRequestJSON, contracts.OverlayUpsertRequest),
    (wire.OverlayReportJSON, contracts.OverlayReport),
    (wire.OverlayCleanResultJSON, contracts.OverlayCleanResult),
]


@pytest.mark.parametrize(("shape", "model"), PAIRS, ids=[s.__name__ for s, _ in PAIRS])
def test_each_shape_names_its_contracts_fields(shape, model):
    assert set(get_type_hints(shape)) == set(model.model_fields)


@pytest.mark.parametrize(("shape", "model"), PAIRS, ids=[s.__name__ for s, _ in PAIRS])
def test_a_field_the_contract_requires_is_required_in_its_shape(shape, model):
    required = {name for name, f in model.model_fields.items() if f.is_required()}
    assert required <= shape.__required_keys__


@pytest.mark.slow  # indexes and searches a tree: the full suite's, not the fast loop's
def test_the_answers_of_a_one_shot_box_have_the_shapes_operations_declares(tmp_path, monkeypatch):
    """Index a small tree, overlay a file, list, count, describe and search it in this process: every key declared."""
    from moonmind_worker import operations
    from moonmind_worker.settings import get_settings

    monkeypatch.setenv("MOONMIND_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MOONMIND_OWNER", "off")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "app.py").write_text("def greet(name):\n    return f'hello {name}'\n")
    settings = get_settings()

    report = operations.index(settings, {"path": str(tree), "repo": "demo", "tenant": "default"})
    assert set(report) == set(get_type_hints(wire.IndexReportJSON))
    overlay = operations.overlay_upsert(settings, {"paths": [str(tree / "app.py")], "root": str(tree), "run_id": "r1",
                                                   "ttl": "1h", "repo": "demo", "tenant": "default"})
    assert set(overlay) == set(get_type_hints(wire.OverlayReportJSON))
    rows = operations.overlay_list(settings, run_id="r1")
    assert [set(r) for r in rows] == [set(get_type_hints(wire.OverlayRowJSON))]
    assert operations.chunk_count(settings, repo="demo", tenant="default") == 1
    assert set(operations.stats(settings, repo="demo", tenant="default")) == set(get_type_hints(wire.StatsJSON))
    assert set(operations.repos(settings, tenant=None)) == set(get_type_hints(wire.ReposJSON))
    pack = operations.search(settings, {"query": "greet someone by name", "filters": {"repo": "demo"}}, record=False)
    assert set(pack) == set(get_type_hints(wire.ContextPackJSON))
    assert [Path(i["source"]).name for i in pack["items"]] == ["app.py"]
    cleaned = operations.overlay_clean(settings, run_id="r1")
    assert cleaned == {"removed": 1, "run_id": "r1", "expired": False}
