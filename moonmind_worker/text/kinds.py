"""Which kind of resource a chunk is: the `resource_type` filter (code, docs, config).

Derived from the chunk's stored `language` (itself derived from the file name, `chunking.language_of`),
at filter time: a `resource_type=docs` filter becomes "language is one of markdown, rst, text".
Why derived, not stored: every index already holds `language`, indexed as a keyword, so the filter
works on indexes written before it existed, with no re-index and no payload schema change.
"""

from __future__ import annotations

from ..contracts import RESOURCE_TYPES
from .chunking import LANGUAGES

#: Prose: documentation, and files of no known kind (stored as language "text").
DOCS: tuple[str, ...] = ("markdown", "rst", "text")
#: Settings and build descriptions.
CONFIG: tuple[str, ...] = ("dockerfile", "ini", "json", "makefile", "toml", "yaml")
#: Every other known language (a language added to LANGUAGES is code unless listed above).
CODE: tuple[str, ...] = tuple(sorted(set(LANGUAGES.values()) - set(DOCS) - set(CONFIG)))

#: resource type -> the stored `language` values it covers.
LANGUAGES_OF: dict[str, tuple[str, ...]] = {"code": CODE, "docs": DOCS, "config": CONFIG}
assert tuple(LANGUAGES_OF) == RESOURCE_TYPES


def resource_type(language: str) -> str:
    """The resource type of a chunk stored with `language`."""
    for kind, languages in LANGUAGES_OF.items():
        if language in languages:
            return kind
    return "code"
