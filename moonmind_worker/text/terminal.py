"""Text that is safe to print: control, escape and invisible characters shown as `\\uXXXX`.

Why one module: file names, repository names, run ids and a server's error text reach the
terminal through many commands (`rag stats`, `rag packs`, `overlay list`, error and note lines),
and the context pack's markdown needs the same rule. An ESC sequence in a file name must not
rewrite the operator's terminal, and a bidi override must not reorder what they read. It imports
only `re` and `unicodedata`, so the thin CLI paths (queue mode, the owner's client) can use it.
"""

from __future__ import annotations

import re
import unicodedata

# Characters that may need escaping (everything but tab, newline and printable ASCII);
# the callback decides, so plain ASCII text costs one regex scan.
_CANDIDATE = re.compile(r"[^\t\n\x20-\x7e]")
_CANDIDATE_LINE = re.compile(r"[^\t\x20-\x7e]")
#: Unicode categories shown as escapes: controls, format characters (bidi overrides and
#: isolates, zero-width, BOM, soft hyphen, tag characters), line/paragraph separators, lone surrogates.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def _invisible(ch: str) -> bool:
    o = ord(ch)
    if 0xFE00 <= o <= 0xFE0F or 0xE0100 <= o <= 0xE01EF:  # variation selectors can smuggle data
        return True
    return unicodedata.category(ch) in _ESCAPED_CATEGORIES


def escape_char(ch: str) -> str:
    o = ord(ch)
    return f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}"


def _escape_match(m: re.Match) -> str:
    ch = m.group()
    if ch == "\r" and m.string[m.end() : m.end() + 1] == "\n" and m.re is _CANDIDATE:
        return ch
    if ch <= "\x7f" or _invisible(ch):
        return escape_char(ch)
    return ch


def printable(text: str, *, single_line: bool = False) -> str:
    """`text` with control and invisible characters as `\\uXXXX`; visible Unicode is kept as is.

    Tab and newline stay (and CR when it ends a CRLF line) unless `single_line`, where newlines
    are escaped too: a name, a citation or a table cell must stay one line.
    """
    return (_CANDIDATE_LINE if single_line else _CANDIDATE).sub(_escape_match, text)
