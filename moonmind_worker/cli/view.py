"""The short, citations-first view of a context pack: what a person at a terminal reads.

Why: the full pack (`context_text`) is written for an agent's prompt. Every item carries its
whole chunk inside a fence and a trust line, which makes ~280 lines for 8 hits on a terminal.
A person scanning results wants the citations first: `path#Lstart-Lend`, the score, the
enclosing symbol, and a few lines of each hit. `rag search` prints this view when its
stdout is a terminal and the full pack when it is piped or redirected (what an agent pastes);
`--short` and `--full` choose either way, `--json` prints the ContextPack.

Colour only on a terminal, never when NO_COLOR is set (https://no-color.org) or TERM=dumb.
Standard library only (and `text.terminal`): the thin client prints it.
"""

from __future__ import annotations

import os

from ..text.terminal import printable

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from typing import Any, TextIO

#: Lines of each hit shown under its citation.
SNIPPET_LINES = 4

_RESET = "\x1b[0m"
_STYLES = {"cite": "\x1b[1;36m", "lines": "\x1b[36m", "score": "\x1b[32m", "title": "\x1b[33m",
           "overlay": "\x1b[1;35m", "dim": "\x1b[2m"}


def colour_wanted(stream: TextIO) -> bool:
    """Colour for `stream`: a terminal, NO_COLOR unset (or empty), TERM not `dumb`."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def short_view(pack: dict[str, Any], *, colour: bool = False, width: int = 80, lines: int = SNIPPET_LINES) -> str:
    """The pack as numbered citations, each with its score and symbol, then `lines` lines of the hit.

    The lines shown start at the hit's line that holds the most of the query's words (its first line
    when none does), each with its line number in the file.
    """

    def paint(style: str, text: str) -> str:
        return f"{_STYLES[style]}{text}{_RESET}" if colour and text else text

    items = pack.get("items") or []
    query = str(pack.get("query") or "")
    if not items:
        return f"No matching context for {_quoted(query)}.\n"
    terms = {w for w in _words(query) if len(w) > 2 and w not in _COMMON}
    with_repo = len({(item.get("payload") or {}).get("repo") for item in items}) > 1  # then each hit names its repo
    count = f"{len(items)} result{'s' if len(items) != 1 else ''}"
    out = [paint("dim", f"{count} for {_quoted(query)}") + "\n"]
    digits = len(str(len(items)))
    indent = " " * (digits + 2)
    for n, item in enumerate(items, 1):
        path = str(item.get("source", ""))
        if with_repo and (item.get("payload") or {}).get("repo"):
            path = f"{item['payload']['repo']}:{path}"
        first = int(item.get("line_start") or 1)
        cite = paint("cite", printable(path, single_line=True)) + paint("lines", f"#L{first}-L{item.get('line_end')}")
        head = f"{n:>{digits}}. {cite}  {paint('score', format(float(item.get('score', 0.0)), '.3f'))}"
        title = printable(str(item.get("section_title") or ""), single_line=True)
        if title:
            head += "  " + paint("title", title)
        if item.get("trust_class") == "overlay":
            head += "  " + paint("overlay", "[overlay: this run's uncommitted edit]")
        out.append("\n" + head + "\n")
        at, body, more = _snippet(str(item.get("text", "")), lines, terms)
        numbers = len(str(first + at + max(len(body) - 1, 0)))
        room = max(width - len(indent) - numbers - 1, 20)
        for i, line in enumerate(body):
            shown = printable(line, single_line=True)
            if len(shown) > room:
                shown = shown[: room - 1] + "…"
            out.append(f"{indent}{paint('dim', str(first + at + i).rjust(numbers))} {shown}".rstrip() + "\n")
        if more:
            out.append(indent + paint("dim", f"… {more} more line{'s' if more != 1 else ''} in this hit") + "\n")
    out.append("\n" + paint("dim", "the whole context pack: --full (what a pipe gets); the ContextPack: --json") + "\n")
    if pack.get("next_cursor"):  # the rest of the ranked list, a page at a time
        total = pack.get("total_results")
        out.append(paint("dim", f"more of {total} results: the same search with --cursor {printable(str(pack['next_cursor']))}") + "\n")
    return "".join(out)


#: Query words that say nothing about which line of a hit to show.
_COMMON = frozenset("the and for are was were how where what which who why when does this that with from into "
                    "can find show get all any use used".split())


def _words(text: str) -> list[str]:
    """Lower-case words of letters and digits, crudely stemmed (`check_bearer_tokens` is check, bearer, token)."""
    return [_stem(w) for w in "".join(ch.lower() if ch.isalnum() else " " for ch in text).split()]


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _quoted(text: str) -> str:
    text = printable(text, single_line=True)
    return '"' + (text if len(text) <= 60 else text[:59] + "…") + '"'


def _snippet(text: str, lines: int, terms: set[str]) -> tuple[int, list[str], int]:
    """`lines` lines of a hit from the one holding most query `terms` (the first line when none does):
    its index in the hit, the lines (common indentation removed) and how many lines of the hit are not shown."""
    all_lines = [line.expandtabs(4).rstrip() for line in text.splitlines()]
    best, at = 0, 0
    for i, line in enumerate(all_lines):
        hits = len(terms.intersection(_words(line)))
        if hits > best:
            best, at = hits, i
    if best == 0:  # no line names the query: the hit's first line with text
        at = next((i for i, line in enumerate(all_lines) if line.strip()), 0)
    shown = all_lines[at : at + lines]
    while shown and not shown[-1].strip():
        shown.pop()
    margin = min((len(line) - len(line.lstrip(" ")) for line in shown if line.strip()), default=0)
    return at, [line[margin:] for line in shown], len(all_lines) - len(shown)
