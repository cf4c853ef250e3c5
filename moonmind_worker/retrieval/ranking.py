"""Turn the two candidate lists of one batched search (dense, BM25) into one ranked list.

Why a module of its own: what an agent sees first decides whether retrieval
helped. Cosine similarity and BM25 each miss things the other catches, and
neither knows that `OAuth2PasswordBearer` is *defined* in one chunk and merely
used in twenty, or that a question about "background tasks" is probably about
`background.py`. The ranking adds those general, repository-agnostic signals.

Every candidate's `score` is a weighted sum of signals that are each in [0, 1],
with weights that sum to 1, times a path prior in (0, 1] and a diversity
discount in (0, 1] — so the score is in [0, 1]:

    score = (w_sem * cosine + w_lex * bm25 / best_bm25 + w_path * path_match
             + w_def * defines_queried_symbol + w_file * file_support) * prior * diversity

* cosine — query/chunk similarity under the embedding model (negative → 0);
* bm25 / best_bm25 — identifier-aware BM25 relative to the best lexical match;
* path_match — share of the query's content words found in the file's name or
  its directory's name (`background tasks` → `background.py`);
* defines_queried_symbol — the chunk defines (class/def/function/struct/…) an
  identifier named in the query;
* file_support — how much of the candidate evidence sits in this chunk's file,
  relative to the best-supported file (several good chunks → a central file);
* prior — test files, examples, re-export stubs (`__init__.py`, `index.js`) and
  files under hidden tool directories (`.github/`) count less (× 0.6–0.8) unless
  the query asks for tests or examples; in a code repository (most candidate
  files are code) prose counts less (× 0.75, change logs × 0.6) unless the query
  asks for documentation ("how do I", install, configure, why, ...);
* diversity — the n-th chunk of the same file is discounted by 0.6^(n-1), so one
  long file cannot fill top_k; in a documentation corpus a file's sections are
  discounted by 0.9^(n-1), so a chapter's sections on the topic stay on top.

Symbol-like queries (`HTTPException`, `field_validator`, `Sinatra::Base`) shift
weight from cosine to BM25 and to definitions. A query none of whose words occurs
among the candidates is scored × 0.5: only the cosine speaks for it, and a static
model's cosine for unrelated text is far above 0. Nothing here names a repository.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import PurePosixPath

from ..store import Hit
from ..text import lexical


@dataclass(frozen=True)
class Weights:
    semantic: float
    lexical: float
    path: float
    definition: float
    file: float


#: Natural-language queries: meaning first, words second, structure as tie-breakers.
NL_WEIGHTS = Weights(semantic=0.40, lexical=0.25, path=0.15, definition=0.10, file=0.10)
#: Symbol queries: the exact identifier and where it is defined matter most.
SYMBOL_WEIGHTS = Weights(semantic=0.15, lexical=0.30, path=0.10, definition=0.35, file=0.10)

DIVERSITY_DECAY = 0.6
#: Scores of a query none of whose words occurs among the candidates (gibberish, typos of every word).
UNCONFIRMED_FACTOR = 0.5
#: In a documentation corpus (a book) each section is its own unit: a chapter's second and third
#: sections on the asked topic must not fall below passing mentions elsewhere.
BOOK_DIVERSITY_DECAY = 0.9
TEST_PRIOR = 0.6
EXAMPLE_PRIOR = 0.7
REEXPORT_PRIOR = 0.8
HIDDEN_PRIOR = 0.7
VENDORED_PRIOR = 0.7
#: Prose (README, docs/*.md|rst) in a repository whose candidates are mostly code, for a query
#: that does not ask for documentation: the answer to "how are X parsed" is the parsing module.
PROSE_PRIOR = 0.75
#: Change logs mention every feature by name in one line each; they answer only "what changed".
CHANGELOG_PRIOR = 0.6
#: A candidate pool with at least this share of code files is a code repository's.
CODE_REPOSITORY_SHARE = 0.5

_SYMBOL_QUERY = re.compile(
    r"^(?:[A-Za-z_][\w]*(?:(?:::|\.|->|#)[A-Za-z_][\w]*)+"  # qualified: a.b, A::B
    r"|_\w*"  # _private, __init__
    r"|[A-Za-z][A-Za-z0-9]*[A-Z_][\w]*"  # camelCase, PascalCase, snake_case
    r"|[A-Z][A-Za-z0-9]*)$"  # Capitalised / ACRONYM
)
_IDENT_IN_TEXT = re.compile(r"[A-Za-z_][\w]*(?:(?:::|\.)[A-Za-z_][\w]*)*")
_BARE_WORD = re.compile(r"^[A-Za-z_$][\w$]+$")
_CODEY = re.compile(r"[a-z][A-Z]|[A-Z][a-z]+[A-Z]|_")
_DEF_KEYWORDS = (
    "class|def|async def|function|func|fn|pub fn|pub struct|pub enum|pub trait|struct|interface|enum|trait|type|"
    "module|defmodule|object|record|protocol|typedef|macro_rules!|const|let|var|val|fun|impl"
)
_TEST_PATH = re.compile(
    r"(?:^|/)(?:tests?|__tests__|spec|specs|testing)/|(?:^|/)test_[^/]*$|_test\.\w+$|\.(?:test|spec)\.\w+$"
    r"|(?:Tests?|Spec)\.\w+$"
)
_EXAMPLE_PATH = re.compile(r"(?:^|/)(?:_?examples?|docs_src|samples?|demo)/")
_REEXPORT_NAMES = frozenset({"__init__.py", "index.js", "index.ts", "mod.rs", "package-info.java"})
_DECLARATION_SUFFIXES = (".pyi", ".d.ts", ".d.mts", ".d.cts", ".js.flow")  # type stubs: TypeScript, Flow
_VENDORED_PATH = re.compile(r"(?:^|/)(?:third[_-]?party|vendor(?:ed)?|external|node_modules|_vendor)/", re.IGNORECASE)
_ASKS_FOR_TESTS = re.compile(r"\b(?:tests?|testing|spec|fixtures?|mock\w*)\b", re.IGNORECASE)
_ASKS_FOR_DOCS = re.compile(
    r"\b(?:how (?:do|can|should) (?:i|you|we)|install\w*|set ?up|configur\w*|tutorial|guide|docs?|documentation"
    r"|readme|why|getting started|changelog|changes?|release\w*|version\w*|deprecat\w*)\b",
    re.IGNORECASE,
)
_PROSE_SUFFIXES = frozenset({".md", ".mdx", ".markdown", ".rst", ".txt", ".adoc", ".asciidoc", ".rdoc", ".org", ".textile"})
_DATA_SUFFIXES = frozenset({".json", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".lock", ".csv", ".xml", ".svg",
                            ".html", ".css", ".map", ""})
_CHANGELOG_NAME = re.compile(r"^(?:change(?:s|log)|history|news|release[-_ ]?notes)\b", re.IGNORECASE)
_ASKS_FOR_EXAMPLES = re.compile(r"\b(?:examples?|samples?|demo|tutorial|usage)\b", re.IGNORECASE)


@dataclass
class Candidate:
    payload: dict
    cosine: float
    bm25: float
    score: float = 0.0
    id: str = ""
    signals: dict[str, float] = field(default_factory=dict)


def is_symbol_query(text: str) -> bool:
    """A bare identifier (or a qualified one): look for its definition, lean on exact terms."""
    return _SYMBOL_QUERY.match(text.strip()) is not None


def query_symbols(text: str) -> set[str]:
    """Identifiers the query names: the whole query if it is one, else code-looking words inside it."""
    stripped = text.strip()
    if is_symbol_query(stripped):
        names = {stripped}
        for sep in ("::", ".", "->", "#"):
            if sep in stripped:
                names.add(re.split(r"::|\.|->|#", stripped)[-1])
        return names
    if _BARE_WORD.match(stripped):  # `evolve`, `db`: may name a function or a module global; look for its definition
        return {stripped}
    return {w for w in _IDENT_IN_TEXT.findall(text) if _CODEY.search(w) and len(w) > 2}


#: a definition keyword starts a line or follows a space, or an opening bracket, comma or `=` written without
#: a space: `transformRequest: [function transformRequest(data) {`, `(function setup() {`, `x=function y(`
_DEF_PREFIX = re.compile(rf"(?:^|[\s\[(,=])(?:{_DEF_KEYWORDS})\s+(?:\([^)]*\)\s*)?(?:[A-Za-z_]\w*(?:\.|::))*$")


_ASSIGNED = re.compile(r"[ \t]*(?::[^=\n]+)?=(?!=)")


def _is_word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


#: C and C++ name a type before defining it (`class logger;`, `enum level_enum : int;` in a `fwd.h`):
#: such a line declares, the definition is elsewhere. (Rust's `struct Unit;` is a definition: C family only.)
_C_FAMILY_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".h++", ".c", ".cc", ".cpp", ".cxx", ".c++", ".ipp", ".inl")
_FORWARD_DECLARATION = re.compile(r"[ \t]*(?::[ \t]*[\w:<> \t]+)?;")
_FORWARD_KEYWORD = re.compile(r"(?:^|\s)(?:class|struct|enum|union)(?:\s+class)?\s+(?:[A-Za-z_]\w*::)*$")


def defines_in_text(text: str, name: str, c_family: bool = False) -> bool:
    """True when a line of `text` defines `name`: a definition keyword, then the (qualified) name.

    In C and C++ (`c_family`), a forward declaration (`class logger;`) is not a definition.

    Scans occurrences with str.find and checks only the line prefix before each:
    a regex over the whole chunk is far slower on large chunks.
    """
    start = 0
    while (i := text.find(name, start)) >= 0:
        end = i + len(name)
        start = end
        if (end < len(text) and _is_word_char(text[end])) or (i > 0 and _is_word_char(text[i - 1])):
            continue
        if text.startswith("::", end):  # `let Value::Object(m) = v`: a path through the name, a use
            continue
        line_start = text.rfind("\n", 0, i) + 1
        if _DEF_PREFIX.search(text[line_start:i]):
            if c_family and _FORWARD_DECLARATION.match(text, end) and _FORWARD_KEYWORD.search(text[line_start:i]):
                continue
            return True
        if i == line_start and _ASSIGNED.match(text, end):  # a module global: `NOTHING = ...`, `db: Engine = ...`
            return True
    return False


def defines(payload: dict, names: set[str]) -> bool:
    """True when the chunk defines one of `names` (its enclosing symbol or a definition line in it)."""
    title = payload.get("section_title") or ""
    # a packed chunk's title lists its definitions: `Scope: a, b` or `res.send, res.json`
    for entry in title.split(": ", 1)[-1].split(", "):
        last = re.split(r"\.|::|>", entry)[-1].strip()
        if last and last in names:
            return True
    text = payload.get("text") or ""
    c_family = str(payload.get("path", "")).lower().endswith(_C_FAMILY_SUFFIXES)
    return any(defines_in_text(text, name, c_family) for name in names)


def _content_words(text: str) -> set[str]:
    return {t for t in lexical.terms(text) if len(t) > 2}


#: Abbreviations file names use for the words a question uses (`args.go` answers "positional arguments").
#: Values are prefixes: a query word starting with one matches (`authenticat` ~ authentication, -ed).
_ABBREVIATIONS = {
    "arg": "argument", "args": "argument", "cmd": "command", "cmds": "command", "cfg": "config", "conf": "config",
    "param": "parameter", "params": "parameter", "auth": "authenticat", "db": "database", "msg": "message",
    "req": "request", "res": "response", "resp": "response", "err": "error", "errs": "error", "ctx": "context",
    "fmt": "format", "util": "utilit", "utils": "utilit", "impl": "implement", "str": "string", "num": "number",
    "env": "environment", "dir": "director", "doc": "document", "docs": "document", "pkg": "package",
    "lib": "librar", "init": "initiali", "tmpl": "template", "src": "source", "srv": "server", "proc": "process",
    "conn": "connection", "addr": "address", "buf": "buffer", "iter": "iterat", "val": "value", "mgr": "manager",
}


@lru_cache(maxsize=4096)
def _path_words(path: str) -> frozenset[str]:
    """Words of a file's stem and of its parent directory, split like identifiers and stemmed."""
    p = PurePosixPath(path)
    stem = p.name.split(".")[0]
    words = set(lexical.terms(stem))
    if p.parent.name:
        words |= set(lexical.terms(p.parent.name))
    if stem in ("__init__", "index", "mod", "main", "utils") and p.parent.name:
        words |= set(lexical.terms(p.parent.name))
    words |= {_ABBREVIATIONS[w] for w in words if w in _ABBREVIATIONS}
    return frozenset(w for w in words if len(w) > 2)


def path_match(path: str, words: frozenset[str]) -> float:
    """Share of the query's content words that name this file or its directory (prefix-tolerant)."""
    return _path_match(path, frozenset(words))


@lru_cache(maxsize=8192)
def _path_match(path: str, words: frozenset[str]) -> float:
    if not words:
        return 0.0
    parts = _path_words(path)
    hit = 0
    for w in words:
        if w in parts or any(
            # a 3-letter query word may start a run-together file name (`url` -> urlmap.rb); a 3-letter
            # name part must not swallow longer query words (`app` is no prefix match for "apply")
            len(short) >= (3 if short == w else 4) and long.startswith(short)
            for part in parts
            for short, long in ((w, part) if len(w) <= len(part) else (part, w),)
        ):
            hit += 1
    return hit / len(words)


@lru_cache(maxsize=8192)
def _prior(path: str, tests_wanted: bool, examples_wanted: bool) -> float:
    prior = 1.0
    if not tests_wanted and _TEST_PATH.search(path):
        prior *= TEST_PRIOR
    if not examples_wanted and _EXAMPLE_PATH.search(path):
        prior *= EXAMPLE_PRIOR
    dirs, _, name = path.rpartition("/")
    if dirs and any(part.startswith(".") for part in dirs.split("/")):
        prior *= HIDDEN_PRIOR  # tool configuration (.github/, .vscode/, ...): ripgrep skips these by default
    if _VENDORED_PATH.search(path):
        prior *= VENDORED_PRIOR  # someone else's code copied in: rarely what a question about this project means
    if name in _REEXPORT_NAMES or name.endswith(_DECLARATION_SUFFIXES):
        prior *= REEXPORT_PRIOR  # a type stub restates the implementation's signatures, without the code
    return prior


@lru_cache(maxsize=8192)
def _prose_prior(path: str) -> float:
    """The prior of a prose file in a code repository (1.0 for anything else): change logs count least."""
    if not is_prose(path):
        return 1.0
    return CHANGELOG_PRIOR if _CHANGELOG_NAME.match(PurePosixPath(path).name) else PROSE_PRIOR


@lru_cache(maxsize=8192)
def is_prose(path: str) -> bool:
    """Documentation: markdown, reST and other text markup, or an upper-case file name (README, PKG-INFO)."""
    p = PurePosixPath(path)
    suffix = p.suffix.lower()
    return suffix in _PROSE_SUFFIXES or (not suffix and p.name.upper() == p.name and any(ch.isalpha() for ch in p.name))


@lru_cache(maxsize=8192)
def is_code(path: str) -> bool:
    """A source file: neither prose nor data. A language we have no name for (`.lua`, `.vue`) is code."""
    return not is_prose(path) and PurePosixPath(path).suffix.lower() not in _DATA_SUFFIXES


#: How many hits beyond a branch's pool the store is asked for, so that a tie at the pool's edge is cut by id.
TIE_MARGIN = 8


def cut_ties(hits: list[Hit], limit: int, asked: int) -> list[Hit]:
    """A branch's best `limit` hits (of the `asked` requested), equal scores in id order; a tie at the edge that may
    run past the hits returned is left out whole.

    Why: the engine orders equal scores by its own offsets, which two builds of one tree lay out
    differently, and one other candidate at the pool's edge moves every score of a pack (file support
    sums the candidates). Cut here, an exact search of the same points gives the same pack.
    """
    ordered = sorted(hits, key=lambda h: (-h.score, h.id))
    if len(ordered) <= limit:
        return ordered
    edge = ordered[limit - 1].score
    if ordered[limit].score != edge or ordered[-1].score != edge or len(ordered) < asked:
        return ordered[:limit]  # no tie at the edge, or all of it was returned: cut inside it by id
    return [h for h in ordered if h.score > edge]


def merge(dense_hits: list[Hit], sparse_hits: list[Hit]) -> list[Candidate]:
    """One candidate per point: its cosine (from the dense branch, or the sparse branch's rescoring) and BM25."""
    by_id: dict[str, Candidate] = {}
    for h in dense_hits:
        by_id[h.id] = Candidate(h.payload, cosine=h.score, bm25=h.bm25 or 0.0, id=h.id)
    for h in sparse_hits:
        c = by_id.get(h.id)
        if c is None:
            cosine = h.cosine if h.cosine is not None else 0.0
            by_id[h.id] = Candidate(h.payload, cosine=cosine, bm25=h.score, id=h.id)
        else:
            c.bm25 = h.score
    return list(by_id.values())


def file_of(c: Candidate) -> tuple[str, str, str]:
    """The file a candidate comes from: the same path in two repositories (or tenants) is two files."""
    p = c.payload
    return p.get("repo", ""), p.get("tenant", ""), p["path"]


def order_key(c: Candidate):
    return (-round(c.score, 9), c.payload["path"], c.payload["offset_start"])


def score(query: str, candidates: list[Candidate]) -> list[Candidate]:
    """Score every candidate (see the module docstring) and return them ranked, deduplicated by chunk."""
    # one candidate per (path, chunk_hash): identical chunks in one file are one result
    unique: dict[tuple[tuple[str, str, str], str], Candidate] = {}
    for c in candidates:
        key = (file_of(c), c.payload["chunk_hash"])
        if key not in unique or (c.cosine, c.bm25) > (unique[key].cosine, unique[key].bm25):
            unique[key] = c
    cands = sorted(unique.values(), key=lambda c: (c.payload["path"], c.payload["offset_start"]))
    if not cands:
        return []
    w = SYMBOL_WEIGHTS if is_symbol_query(query) else NL_WEIGHTS
    names = query_symbols(query)
    words = frozenset(_content_words(query))
    best_bm25 = max(c.bm25 for c in cands)
    # no word of the query occurs in any candidate ("qwxz plorf"): only the cosine speaks, and a static
    # model's cosine for unrelated text is far above 0, so the relative signals would crown noise
    unconfirmed = UNCONFIRMED_FACTOR if best_bm25 <= 0 and lexical.terms(query) else 1.0

    base: dict[int, float] = {}
    for i, c in enumerate(cands):
        cos = min(max(c.cosine, 0.0), 1.0)
        lex = c.bm25 / best_bm25 if best_bm25 > 0 else 0.0
        c.signals = {
            "cosine": cos,
            "lexical": lex,
            "path": path_match(c.payload["path"], words),
            "definition": 1.0 if names and defines(c.payload, names) else 0.0,
        }
        base[i] = (w.semantic * cos + w.lexical * lex) / (w.semantic + w.lexical)

    # file support: the sum of a file's candidate evidence, relative to the best file
    per_file: dict[tuple[str, str, str], float] = {}
    for i, c in enumerate(cands):
        per_file[file_of(c)] = per_file.get(file_of(c), 0.0) + base[i]
    best_file = max(per_file.values()) or 1.0
    tests_wanted, examples_wanted = bool(_ASKS_FOR_TESTS.search(query)), bool(_ASKS_FOR_EXAMPLES.search(query))
    # a code repository (judged from what this query found) and a question not about documentation:
    # prose there restates the code in passing, so it counts less; a book keeps its prose whole
    files = {file_of(c) for c in cands}  # files, not chunks: one long change log is one file
    code_share = sum(1 for f in files if is_code(f[2])) / len(files)
    prose_down = code_share >= CODE_REPOSITORY_SHARE and not _ASKS_FOR_DOCS.search(query)

    for i, c in enumerate(cands):
        s = c.signals
        s["file"] = per_file[file_of(c)] / best_file
        s["prior"] = _prior(c.payload["path"], tests_wanted, examples_wanted)
        if s["definition"] and PurePosixPath(c.payload["path"]).name in _REEXPORT_NAMES:
            s["prior"] /= REEXPORT_PRIOR  # it defines what was asked: not a re-export stub (mod.rs, index.js)
        if prose_down:
            s["prior"] *= _prose_prior(c.payload["path"])
        raw = (
            w.semantic * s["cosine"]
            + w.lexical * s["lexical"]
            + w.path * s["path"]
            + w.definition * s["definition"]
            + w.file * s["file"]
        )
        c.score = min(1.0, raw * s["prior"] * unconfirmed)

    # diversity: the n-th chunk of a file is discounted by decay^(n-1); prose sections of a book decay less
    ranked = sorted(cands, key=order_key)
    seen: dict[tuple[str, str, str], int] = {}
    for c in ranked:
        n = seen.get(file_of(c), 0)
        seen[file_of(c)] = n + 1
        book_section = code_share < CODE_REPOSITORY_SHARE and not is_code(c.payload["path"])
        c.signals["diversity"] = (BOOK_DIVERSITY_DECAY if book_section else DIVERSITY_DECAY) ** n
        c.score *= c.signals["diversity"]
    return sorted(ranked, key=order_key)
