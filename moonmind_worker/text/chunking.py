"""Split a file into chunks that follow its structure.

Why structure: a chunk that starts at a `def`/`class` or a markdown/reST heading is
about one thing, so its embedding is sharper and its citation more useful.
Chunks are whole lines, never above `max_chars` (a single huge line is cut),
and carry exact character offsets and 1-based line numbers into the file.
Code with an installed tree-sitter grammar is cut where its syntax tree puts
definitions (`code_chunks`); other files, and files that do not parse, are cut
by per-language patterns for top-level definitions.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from .code_chunks import Definition, code_spans
from .secrets import redact as redact_secrets

LANGUAGES: dict[str, str] = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".jsx": "javascript", ".mjs": "javascript",
    ".cjs": "javascript", ".ts": "typescript", ".tsx": "typescript", ".go": "go", ".rs": "rust",
    ".java": "java", ".kt": "kotlin", ".scala": "scala", ".rb": "ruby", ".php": "php", ".c": "c",
    ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".hpp": "cpp", ".cs": "csharp", ".swift": "swift",
    ".sh": "shell", ".bash": "shell", ".md": "markdown", ".mdx": "markdown", ".markdown": "markdown", ".rst": "rst",
    ".txt": "text", ".toml": "toml", ".yaml": "yaml", ".yml": "yaml", ".json": "json", ".sql": "sql",
    ".html": "html", ".css": "css", ".proto": "proto", ".ini": "ini", ".cfg": "ini",
}

# A line that starts a top-level definition, per language family.
_DEF = {
    "python": re.compile(r"^(?:async\s+def|def|class)\s+([A-Za-z_]\w*)"),
    "javascript": re.compile(
        r"^(?:export\s+(?:default\s+)?)?(?:async\s+)?(?:function\*?|class|const|let|var)\s+([A-Za-z_$][\w$]*)"
    ),
    "go": re.compile(r"^(?:func|type)\s+(?:\([^)]*\)\s*)?([A-Za-z_]\w*)"),
    "rust": re.compile(
        r"^(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?(?:fn|struct|enum|trait|impl|mod)\s*(?:<[^>]*>\s*)?([A-Za-z_]\w*)"
    ),
    "java": re.compile(
        r"^\s{0,4}(?:(?:public|private|protected|static|final|abstract|sealed)\s+)*(?:class|interface|enum|record)\s+([A-Za-z_]\w*)"
    ),
    "ruby": re.compile(r"^\s{0,2}(?:def|class|module)\s+([A-Za-z_][\w.:]*)"),
    "c": re.compile(r"^(?:[A-Za-z_][\w\s\*]*?\s\**)?([A-Za-z_]\w*)\s*\([^;]*$"),
}
_DEF["typescript"] = _DEF["javascript"]
_DEF["kotlin"] = _DEF["java"]
_DEF["scala"] = _DEF["java"]
_DEF["csharp"] = _DEF["java"]
_DEF["cpp"] = _DEF["c"]
_DEF["php"] = re.compile(
    r"^\s{0,4}(?:(?:public|private|protected|static|final|abstract)\s+)*(?:function|class|interface|trait)\s+([A-Za-z_]\w*)"
)
_DEF["swift"] = re.compile(r"^(?:(?:public|private|internal|open|final)\s+)*(?:func|class|struct|enum|protocol|extension)\s+([A-Za-z_]\w*)")

_DECORATOR = re.compile(r"^@")
_CONTAINER = re.compile(r"\b(?:class|interface|trait|enum|record|struct|protocol|extension)\s")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
#: a reStructuredText hyperlink target naming the section below it (`.. _options:`)
_RST_LABEL = re.compile(r"^\.\. _[^:]+:\s*$")
#: a reStructuredText section adornment: one punctuation character repeated (under, maybe over, a title)
_RST_ADORNMENT = re.compile(r"^([=\-~^\"'`#*+:._<>!$%&,;?@\\/|])\1{2,}\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True)
class Chunk:
    text: str
    offset_start: int
    offset_end: int
    line_start: int
    line_end: int
    section_title: str
    chunk_sequence: int
    total_chunks: int
    #: the definitions that start in this chunk (1-based file lines), from the syntax tree: `rag symbols`
    definitions: tuple[Definition, ...] = ()

    @property
    def chunk_hash(self) -> str:
        return sha256_text(self.text)

    @property
    def token_count(self) -> int:
        """Estimated tokens: ~4 characters per token, the usual rule for code and English."""
        return estimate_tokens(self.text)


def sha256_text(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def estimate_tokens(text: str) -> int:
    return (len(text) + 3) // 4


def language_of(path: str) -> str:
    p = PurePosixPath(path)
    if p.name in ("Dockerfile", "Makefile"):
        return p.name.lower()
    return LANGUAGES.get(p.suffix.lower(), "text")


@dataclass
class _Block:
    start: int  # first line index (0-based)
    end: int  # one past the last line
    title: str
    scope: str = ""  # the class (or other container) split into these blocks; blocks pack only within one


def _blocks(lines: list[str], language: str) -> list[_Block]:
    """Cut the file at structure boundaries: definitions or headings."""
    starts: list[tuple[int, str]] = [(0, "")]
    scopes: dict[int, str] = {}
    if language == "markdown":
        _markdown_starts(lines, starts)
    elif language == "rst":
        starts.extend(_rst_sections(lines))
    else:
        pattern = _DEF.get(language)
        if pattern is not None:
            _definition_starts(lines, pattern, starts, scopes)
    blocks: list[_Block] = []
    starts = sorted({s: t for s, t in starts}.items())
    for n, (s, title) in enumerate(starts):
        e = starts[n + 1][0] if n + 1 < len(starts) else len(lines)
        if e > s:
            blocks.append(_Block(s, e, title, scopes.get(s, "")))
    # blocks with no title inherit the previous block's title (a module prelude stays untitled)
    for n in range(1, len(blocks)):
        if not blocks[n].title:
            blocks[n].title = blocks[n - 1].title
    return blocks


def _markdown_starts(lines: list[str], starts: list[tuple[int, str]]) -> None:
    """Append (line, heading path) for every markdown heading outside a fenced code block."""
    path: list[tuple[int, str]] = []
    in_fence = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        m = None if in_fence else _HEADING.match(line)
        if m:
            level = len(m.group(1))
            path = [(lv, t) for lv, t in path if lv < level] + [(level, m.group(2))]
            starts.append((i, " > ".join(t for _, t in path)))


def _definition_starts(lines: list[str], pattern: re.Pattern[str], starts: list[tuple[int, str]],
                       scopes: dict[int, str]) -> None:
    """Append (line, name) for every definition `pattern` finds (from its decorators); members' blocks get a scope."""
    pending_decorator: int | None = None
    container = ""  # the last unindented class/interface/trait: indented definitions are its members
    for i, line in enumerate(lines):
        if _DECORATOR.match(line):
            if pending_decorator is None:
                pending_decorator = i
            continue
        m = pattern.match(line)
        if m:
            name = m.group(1)
            if not line[:1].isspace():
                container = name if _CONTAINER.search(line) else ""
            elif container:  # PHP/Java/C# methods: `Class.method`, packed only within the class
                name = f"{container}.{name}"
                scopes[pending_decorator if pending_decorator is not None else i] = container
            starts.append((pending_decorator if pending_decorator is not None else i, name))
            pending_decorator = None
        elif line.strip() and not line.startswith((" ", "\t", ")", "]")):
            pending_decorator = None  # the decorator belonged to something else


def _rst_sections(lines: list[str]) -> list[tuple[int, str]]:
    """(first line, heading path) of every reStructuredText section.

    A title is a line at column 0 underlined (and maybe overlined) by one repeated punctuation
    character at least as long as it; levels follow the order in which adornment styles first
    appear, as docutils assigns them.
    """
    out: list[tuple[int, str]] = []
    styles: list[tuple[str, bool]] = []
    path: list[tuple[int, str]] = []
    for i in range(1, len(lines)):
        under, title = lines[i].rstrip("\r\n"), lines[i - 1].rstrip("\r\n")
        if not (_RST_ADORNMENT.match(under) and title.strip() and not title[0].isspace()):
            continue
        if _RST_ADORNMENT.match(title) or len(under.rstrip()) < len(title.rstrip()):
            continue
        over = i >= 2 and lines[i - 2].rstrip("\r\n") == under
        style = (under[0], over)
        if style not in styles:
            styles.append(style)
        level = styles.index(style) + 1
        path = [(lv, t) for lv, t in path if lv < level] + [(level, title.strip())]
        start = i - 2 if over else i - 1
        back = start  # a label right above the title (`.. _options:`) names this section: keep them together
        while back > 0 and (not lines[back - 1].strip() or _RST_LABEL.match(lines[back - 1])):
            back -= 1
        labels = [j for j in range(back, start) if _RST_LABEL.match(lines[j])]
        if labels:
            start = labels[0]
        out.append((start, " > ".join(t for _, t in path)))
    return out


def _split_block(lines: list[str], block: _Block, max_chars: int, overlap: int) -> list[tuple[int, int]]:
    """Split an over-long block into line ranges of at most max_chars, preferring blank lines."""
    out: list[tuple[int, int]] = []
    s = block.start
    while s < block.end:
        size = 0
        e = s
        last_blank = -1
        while e < block.end and (size + len(lines[e]) <= max_chars or e == s):
            size += len(lines[e])
            if not lines[e].strip() and e > s:
                last_blank = e
            e += 1
        if e < block.end and last_blank > s + (e - s) // 2:
            e = last_blank + 1
        out.append((s, e))
        if e >= block.end:
            break
        s = max(e - overlap, s + 1)
    return out


def _bare_heading(lines: list[str], language: str) -> bool:
    """True when a markdown/reST block is only headings (and reST labels) and blank lines: no body of its own."""
    if language == "rst":
        text = [line for line in lines if line.strip()]
        return all(
            _RST_ADORNMENT.match(line) or _RST_LABEL.match(line)
            or (k + 1 < len(text) and _RST_ADORNMENT.match(text[k + 1]))
            for k, line in enumerate(text)
        )
    return all(not line.strip() or _HEADING.match(line) for line in lines)


#: A packed chunk's title lists its definitions up to this length, then ends with ", …".
MAX_PACKED_TITLE = 200
_SCOPE_SEP = re.compile(r"\.|::")


def _packed_title(title: str, name: str, scope: str) -> str:
    """`title` (maybe already a list) with one more definition `name`: `Scope: a, b` or `a, b` at top level.

    A block titled with the scope itself is code between definitions, not a definition: it adds nothing.
    """
    if not name or name == scope or title.endswith(", …"):
        return title or name
    short = name
    for sep in (".", "::"):
        if scope and name.startswith(scope + sep):
            short = name[len(scope) + len(sep):]
    if not title:
        return name
    if title == scope:  # the opened class's head (it defines the class itself), then its first member
        return f"{scope}: {_SCOPE_SEP.split(scope)[-1]}, {short}"
    if scope and not title.startswith(scope + ": "):
        first = title
        for sep in (".", "::"):
            if title.startswith(scope + sep):
                first = title[len(scope) + len(sep):]
        title = f"{scope}: {first}"
    if short in title.split(": ", 1)[-1].split(", "):
        return title
    joined = f"{title}, {short}"
    return joined if len(joined) <= MAX_PACKED_TITLE else f"{title}, …"


def chunk_text(text: str, path: str, max_chars: int = 1500, overlap_lines: int = 2, *, redact: bool = True) -> list[Chunk]:
    """Chunk one file's text; deterministic for the same input and settings. With `redact`, the secrets
    in it are replaced first (text.secrets), so no chunk, embedding or stored term holds one."""
    if not text.strip():
        return []
    if redact:
        text = redact_secrets(text)[0]
    lines = text.splitlines(keepends=True)
    # a single line longer than max_chars is cut into pieces so no chunk exceeds the cap
    fixed: list[str] = []
    for line in lines:
        while len(line) > max_chars:
            fixed.append(line[:max_chars])
            line = line[max_chars:]
        fixed.append(line)
    lines = fixed
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    language = language_of(path)
    defs: list[Definition] = []
    spans = code_spans(text, lines, language, path, max_chars, defs)
    blocks = [_Block(*span) for span in spans] if spans is not None else _blocks(lines, language)
    ranges = _pack(blocks, lines, offsets, language, max_chars, overlap_lines)

    linenos = [1]
    for line in lines:  # pieces of a cut long line share that line's number
        linenos.append(linenos[-1] + (1 if line.endswith(("\n", "\r")) else 0))
    kept = [(s, e, t) for s, e, t in ranges if "".join(lines[s:e]).strip()]
    total = len(kept)
    owned = _owners(defs, kept, linenos)
    chunks = []
    for seq, (s, e, title) in enumerate(kept):
        chunks.append(
            Chunk(
                text="".join(lines[s:e]),
                offset_start=offsets[s],
                offset_end=offsets[e],
                line_start=linenos[s],
                line_end=linenos[e - 1],
                section_title=title,
                chunk_sequence=seq,
                total_chunks=total,
                definitions=owned.get(seq, ()),
            )
        )
    return chunks


def _pack(blocks: list[_Block], lines: list[str], offsets: list[int], language: str, max_chars: int,
          overlap_lines: int) -> list[tuple[int, int, str]]:
    """The chunks' (start, end, title) line ranges: small neighbouring blocks packed, over-long ones split."""
    ranges: list[tuple[int, int, str]] = []
    pending: _Block | None = None
    for block in blocks:
        size = offsets[block.end] - offsets[block.start]
        if size > max_chars:
            if pending:
                ranges.append((pending.start, pending.end, pending.title))
                pending = None
            ranges.extend((s, e, block.title) for s, e in _split_block(lines, block, max_chars, overlap_lines))
            continue
        # pack small neighbouring blocks together up to the cap, never across a class
        # boundary; markdown sections stay apart (one section, one heading path)
        # unless the pending one is a bare heading
        fits = (
            pending is not None
            and pending.scope == block.scope
            and offsets[block.end] - offsets[pending.start] <= max_chars
        )
        if pending and fits and language in ("markdown", "rst"):
            fits = _bare_heading(lines[pending.start : pending.end], language)
            if fits:
                pending.title = block.title
        if pending and fits:
            # several definitions packed together: the title names each of them (the definition
            # signal reads titles, so naming only the first one or the class hid the others)
            if pending.title != block.title:
                pending.title = _packed_title(pending.title, block.title, pending.scope)
            pending.end = block.end
        else:
            if pending:
                ranges.append((pending.start, pending.end, pending.title))
            pending = _Block(block.start, block.end, block.title, block.scope)
    if pending:
        ranges.append((pending.start, pending.end, pending.title))
    return ranges


def _owners(defs: list[Definition], kept: list[tuple[int, int, str]], linenos: list[int]) -> dict[int, tuple[Definition, ...]]:
    """Each definition, in file line numbers, under the first chunk holding its first line (split chunks overlap)."""
    from bisect import bisect_right

    starts = [s for s, _, _ in kept]
    out: dict[int, list[Definition]] = {}
    for d in defs:
        seq = bisect_right(starts, d.start) - 1
        while seq > 0 and kept[seq - 1][1] > d.start:  # an overlapping earlier chunk holds it first
            seq -= 1
        if seq < 0 or not kept[seq][0] <= d.start < kept[seq][1]:
            continue  # on blank lines no chunk kept
        out.setdefault(seq, []).append(d._replace(start=linenos[d.start], end=linenos[d.end]))
    return {seq: tuple(ds) for seq, ds in out.items()}

