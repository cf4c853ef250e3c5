"""The base of every wire contract, and a JSON dump that builds no pydantic serializer.

Its own module so that the contracts can live in more than one: `contracts.py` (the query, the pack,
the errors) and `task_contracts.py` (the tasks' arguments and reports) both build on it, and
`contracts` re-exports all of it.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict


class Contract(BaseModel):
    """Every wire model: validators built on first use, not at import.

    Why: building all of them cost most of the contracts' import, and a one-shot `rag search`
    builds none (`contracts.plainly_valid_query`, `json_dump`); the gateway and the tasks build them when they use them.
    """

    model_config = ConfigDict(defer_build=True)


def json_dump(model: BaseModel) -> dict[str, Any]:
    """`model.model_dump(mode="json")`, without building pydantic's serializer when every value is plain JSON.

    Why: like validating (see `contracts.plainly_valid_query`), the first serializer a process builds
    loads pydantic's plugin machinery. The packs the pipeline builds hold only str, int,
    finite float, bool, None, lists, dicts and contract models, whose JSON form is the value
    itself, fields in declaration order. Any other value, a custom serializer, a computed or
    extra field: pydantic dumps it. tests/test_contracts.py compares the two on real packs.
    """
    try:
        return _plain_model(model)
    except _NotPlain:
        return model.model_dump(mode="json")


class _NotPlain(Exception):
    pass


def _plain_model(model: BaseModel) -> dict[str, Any]:
    cls = type(model)
    decorators = cls.__pydantic_decorators__
    if decorators.field_serializers or decorators.model_serializers or cls.model_computed_fields or model.__pydantic_extra__:
        raise _NotPlain
    return {name: _plain_value(getattr(model, name)) for name in cls.model_fields}


def _plain_value(v: Any) -> Any:
    kind = type(v)
    if v is None or kind is str or kind is int or kind is bool:
        return v
    if kind is float:
        if not math.isfinite(v):  # inf or nan: pydantic's JSON mode decides
            raise _NotPlain
        return v
    if kind is list:
        return [_plain_value(x) for x in v]
    if kind is dict:
        if any(type(k) is not str for k in v):
            raise _NotPlain
        return {k: _plain_value(x) for k, x in v.items()}
    if isinstance(v, Contract):
        return _plain_model(v)
    raise _NotPlain
