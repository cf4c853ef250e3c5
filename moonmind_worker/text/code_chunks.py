"""Definition boundaries from real syntax trees (tree-sitter), for `chunking`.

Why a parser: a regex sees only top-level lines, so a 3,000-character class is
cut at blank lines wherever they fall, a Java method or a Rust `impl` member is
never a boundary, and a comment or attribute above a definition can end up in
the chunk before it. The syntax tree knows where each definition starts and
ends. A definition that fits the size cap is one span; a class (impl, module,
namespace) that does not is opened at its members, each titled `Class.method`
(`Type::method` in Rust and C++). Comments, decorators and attributes directly
above a definition belong to it; other statements between definitions (imports,
constants) form one span per run, so the caller packs them together.

Grammars come from the per-language wheels on PyPI (`tree-sitter-python`, ...),
which ship the compiled grammar. `tree-sitter-language-pack` is not used: it
downloads grammars on first use. A language without an installed grammar, or a
file the grammar cannot parse cleanly, returns None and the caller falls back to
its line-aware splitter, so results never depend on the parser being there.
"""

from __future__ import annotations

import importlib
import re
import threading
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # imported when first needed: commands that never chunk do not pay for it
    from tree_sitter import Language, Node, Parser


class Span(NamedTuple):
    """Lines [start, end) of the file that are about one thing."""

    start: int
    end: int
    title: str  # the (qualified) definition name, "" for module-level code
    scope: str  # the opened container these lines lie in, "" at top level


class Definition(NamedTuple):
    """A name the syntax tree defines, for `rag symbols` (lines index the caller's `lines`, both inclusive)."""

    name: str  # qualified: `Class.method`, `Type::method`
    kind: str  # function, method, class, struct, interface, type, ...
    start: int  # the definition's own first line (not the comments or decorators above it)
    end: int
    signature: str  # that first line, stripped


@dataclass(frozen=True)
class _Syntax:
    grammar: tuple[str, str]  # wheel module, function returning the language
    kinds: dict[str, str]  # definition node type -> field of its member list ("" = never opened)
    wrappers: frozenset[str] = frozenset()  # nodes around one definition (export, decorators, template)
    leading: frozenset[str] = frozenset()  # siblings that belong to the definition below them
    flatten: frozenset[str] = frozenset()  # groupings whose children count as siblings (#ifdef)
    separator: str = "."
    # C/C++ headers open namespaces and classes with macros (`NLOHMANN_JSON_NAMESPACE_BEGIN`,
    # `Q_OBJECT`) that no grammar can expand: nearly every such file has a local parse error, and
    # the line splitter sees only unindented definitions. Their ERROR nodes are opened like #ifdef.
    tolerate_errors: bool = False


_COMMENTS = frozenset({"comment"})
_JS_KINDS = {
    "function_declaration": "", "generator_function_declaration": "", "class_declaration": "body",
    "class": "body", "method_definition": "", "lexical_declaration": "", "variable_declaration": "",
    "expression_statement": "", "field_definition": "",
}
_TS_KINDS = _JS_KINDS | {
    "abstract_class_declaration": "body", "interface_declaration": "body", "type_alias_declaration": "",
    "enum_declaration": "", "internal_module": "body", "module": "body", "function_signature": "",
    "abstract_method_signature": "", "method_signature": "", "public_field_definition": "",
}
_JS: dict[str, Any] = dict(wrappers=frozenset({"export_statement"}), leading=frozenset({"comment", "decorator"}))
_TS: dict[str, Any] = dict(wrappers=frozenset({"export_statement", "ambient_declaration", "expression_statement"}),
           leading=frozenset({"comment", "decorator"}))
_C_KINDS = {"function_definition": "", "struct_specifier": "", "union_specifier": "", "enum_specifier": "",
            "type_definition": ""}
_C_FLATTEN = frozenset({"preproc_ifdef", "preproc_if", "preproc_else", "preproc_elif", "preproc_elifdef",
                        "linkage_specification", "declaration_list", "ERROR"})

SYNTAX: dict[str, _Syntax] = {
    "python": _Syntax(("tree_sitter_python", "language"),
                      {"function_definition": "", "class_definition": "body"},
                      wrappers=frozenset({"decorated_definition"}), leading=_COMMENTS),
    "javascript": _Syntax(("tree_sitter_javascript", "language"), _JS_KINDS, **_JS),
    "typescript": _Syntax(("tree_sitter_typescript", "language_typescript"), _TS_KINDS, **_TS),
    "tsx": _Syntax(("tree_sitter_typescript", "language_tsx"), _TS_KINDS, **_TS),
    "go": _Syntax(("tree_sitter_go", "language"),
                  {"function_declaration": "", "method_declaration": "", "type_declaration": ""},
                  leading=_COMMENTS),
    "rust": _Syntax(("tree_sitter_rust", "language"),
                    {"function_item": "", "function_signature_item": "", "struct_item": "", "enum_item": "",
                     "union_item": "", "type_item": "", "macro_definition": "", "trait_item": "body",
                     "impl_item": "body", "mod_item": "body"},
                    leading=frozenset({"line_comment", "block_comment", "attribute_item"}), separator="::"),
    "java": _Syntax(("tree_sitter_java", "language"),
                    {"class_declaration": "body", "interface_declaration": "body", "enum_declaration": "body",
                     "record_declaration": "body", "annotation_type_declaration": "body",
                     "method_declaration": "", "constructor_declaration": "",
                     "compact_constructor_declaration": ""},
                    leading=frozenset({"line_comment", "block_comment"}),
                    flatten=frozenset({"enum_body_declarations"})),
    "c": _Syntax(("tree_sitter_c", "language"), _C_KINDS, leading=_COMMENTS, flatten=_C_FLATTEN,
                 tolerate_errors=True),
    "cpp": _Syntax(("tree_sitter_cpp", "language"),
                   _C_KINDS | {"class_specifier": "body", "struct_specifier": "body",
                               "namespace_definition": "body", "concept_definition": "",
                               "alias_declaration": ""},
                   wrappers=frozenset({"template_declaration"}), leading=_COMMENTS, flatten=_C_FLATTEN,
                   separator="::", tolerate_errors=True),
    "ruby": _Syntax(("tree_sitter_ruby", "language"),
                    {"method": "", "singleton_method": "", "class": "body", "module": "body"},
                    leading=_COMMENTS),
}

#: What each definition node is, in words an agent asks for (`rag symbols`); a function in a class-like container is a method.
KINDS: dict[str, str] = {
    "function_definition": "function", "function_declaration": "function", "generator_function_declaration": "function",
    "function_item": "function", "function_signature_item": "function", "function_signature": "function",
    "lexical_declaration": "function", "variable_declaration": "function", "expression_statement": "function",
    "method_definition": "method", "method_declaration": "method", "method_signature": "method",
    "abstract_method_signature": "method", "field_definition": "method", "public_field_definition": "method",
    "method": "method", "singleton_method": "method",
    "constructor_declaration": "constructor", "compact_constructor_declaration": "constructor",
    "class_definition": "class", "class_declaration": "class", "class": "class", "abstract_class_declaration": "class",
    "class_specifier": "class", "interface_declaration": "interface", "trait_item": "trait", "impl_item": "impl",
    "struct_item": "struct", "struct_specifier": "struct", "union_item": "union", "union_specifier": "union",
    "enum_item": "enum", "enum_declaration": "enum", "enum_specifier": "enum",
    "type_alias_declaration": "type", "type_item": "type", "type_definition": "type", "alias_declaration": "type",
    "type_declaration": "type", "record_declaration": "record", "annotation_type_declaration": "annotation",
    "internal_module": "namespace", "namespace_definition": "namespace", "module": "module", "mod_item": "module",
    "macro_definition": "macro", "concept_definition": "concept",
}
_CLASS_LIKE = frozenset({"class", "struct", "interface", "trait", "impl", "record", "enum"})
#: Go's `type X struct {...}` / `type Y interface {...}`: the spec's type says which.
_GO_TYPES = {"struct_type": "struct", "interface_type": "interface"}
_MAX_SIGNATURE = 200

_FUNCTION_VALUES = frozenset({"arrow_function", "function_expression", "function", "generator_function",
                              "class", "class_expression"})
_MAX_TITLE = 120
#: A line that is only an upper-case macro (`NLOHMANN_JSON_NAMESPACE_BEGIN`, `Q_OBJECT`): it expands to
#: something the grammar cannot see, and left in place it swallows the declaration after it.
_BARE_MACRO = re.compile(rb"(?m)^[ \t]*[A-Z][A-Z0-9_]{2,}[ \t]*$")
_EXPORT_TARGETS = ("module.exports", "exports.")

_LANGUAGES: dict[str, Language | None] = {}
_LOCAL = threading.local()


def _language(name: str) -> Language | None:
    """The grammar of `name`, loaded once per process; None when its wheel is not installed."""
    if name not in _LANGUAGES:
        module, entry = SYNTAX[name].grammar
        try:
            from tree_sitter import Language

            _LANGUAGES[name] = Language(getattr(importlib.import_module(module), entry)())
        except Exception:  # a missing or incompatible grammar wheel: the caller falls back
            _LANGUAGES[name] = None
    return _LANGUAGES[name]


def _parser(name: str) -> Parser | None:
    """One parser per thread and language: a Parser holds parse state and is not shared."""
    parsers: dict[str, Parser | None] = getattr(_LOCAL, "parsers", None) or {}
    _LOCAL.parsers = parsers
    if name not in parsers:
        language = _language(name)
        if language is None:
            parsers[name] = None
        else:
            from tree_sitter import Parser

            parsers[name] = Parser(language)
    return parsers[name]


def grammar_for(language: str, path: str) -> str | None:
    """The grammar for a file: TSX needs its own; None when no grammar is defined for the language."""
    if language == "typescript" and path.lower().endswith(".tsx"):
        return "tsx"
    return language if language in SYNTAX else None


@dataclass
class _Walk:
    """State for one file: source bytes, line table, and the cuts found so far."""

    syntax: _Syntax
    src: bytes
    line_bytes: list[int]  # byte offset where each line starts (plus the end)
    line_chars: list[int]  # char offset where each line starts (plus the end)
    max_chars: int
    cuts: list[tuple[int, str, str]] = field(default_factory=list)
    defs: list[Definition] = field(default_factory=list)

    def line_of(self, byte: int) -> int:
        return min(max(bisect_right(self.line_bytes, byte) - 1, 0), len(self.line_bytes) - 2)

    def text(self, node: Node) -> str:
        return " ".join(self.src[node.start_byte : node.end_byte].decode("utf-8", "replace").split())

    def chars(self, start_line: int, node: Node) -> int:
        end_line = self.line_of(max(node.end_byte - 1, node.start_byte)) + 1
        return self.line_chars[end_line] - self.line_chars[start_line]


def code_spans(
    text: str, lines: list[str], language: str, path: str, max_chars: int, definitions: list[Definition] | None = None,
) -> list[Span] | None:
    """Spans at definition boundaries covering every line, or None to use the line-aware splitter.

    `lines` are the caller's lines (``"".join(lines) == text``); spans index into them. `definitions`,
    when given, receives every definition the tree holds (members of classes too small to open included).
    """
    name = grammar_for(language, path)
    if name is None or not lines:
        return None
    parser = _parser(name)
    if parser is None:
        return None
    try:
        src = text.encode("utf-8", "surrogatepass")
        if SYNTAX[name].tolerate_errors:  # blank bare macro lines, keeping every byte offset
            tree = parser.parse(_BARE_MACRO.sub(lambda m: b" " * len(m.group(0)), src))
        else:
            tree = parser.parse(src)
        if tree.root_node.has_error and not SYNTAX[name].tolerate_errors:
            return None
        line_chars = [0]
        for line in lines:
            line_chars.append(line_chars[-1] + len(line))
        if text.isascii():
            line_bytes = line_chars
        else:
            line_bytes = [0]
            for line in lines:
                line_bytes.append(line_bytes[-1] + len(line.encode("utf-8", "surrogatepass")))
        walk = _Walk(SYNTAX[name], src, line_bytes, line_chars, max_chars)
        _region(walk, tree.root_node.named_children, 0, "", "")
    except (UnicodeError, ValueError, RecursionError):
        return None
    if definitions is not None:
        definitions.extend(walk.defs)
    cuts: dict[int, tuple[str, str]] = {}
    for at, title, scope in walk.cuts:  # on a shared line the later (inner) definition wins
        cuts[at] = (title, scope)
    starts = sorted(cuts)
    spans = []
    for n, s in enumerate(starts):
        e = starts[n + 1] if n + 1 < len(starts) else len(lines)
        if e > s:
            spans.append(Span(s, e, *cuts[s]))
    return spans


def _siblings(nodes: list[Node], flatten: frozenset[str]) -> Iterator[Node]:
    for node in nodes:
        if node.type in flatten:
            yield from _siblings(node.named_children, flatten)
        else:
            yield node


def _end_row(node: Node) -> int:
    """Last row holding the node's text (a line comment's end point is column 0 of the next row)."""
    end = node.end_point
    return end.row - 1 if end.column == 0 and end.row > node.start_point.row else end.row


def _region(walk: _Walk, nodes: list[Node], first_line: int, title: str, prefix: str, container: str = "") -> None:
    """Cut the lines of one member list: a head span, then one per definition or run of other code."""
    syntax = walk.syntax
    walk.cuts.append((first_line, title, prefix))
    items = list(_siblings(nodes, syntax.flatten))
    last_was_definition = False
    lead: Node | None = None
    prev_end = -1
    for i, node in enumerate(items):
        if node.type in syntax.leading:
            if node.start_point.row <= prev_end:
                continue  # a trailing comment on the previous statement's line stays with it
            nxt = items[i + 1] if i + 1 < len(items) else None
            if nxt is not None and nxt.start_point.row <= _end_row(node) + 1:
                lead = lead or node
                prev_end = _end_row(node)
                continue
        start = walk.line_of((lead or node).start_byte)
        lead = None
        prev_end = _end_row(node)
        inner = _unwrap(node, syntax)
        name = _name(inner, walk) if inner.type in syntax.kinds else None
        if name is None:  # other code: one span per run, after a definition
            if last_was_definition:
                walk.cuts.append((start, title, prefix))
            last_was_definition = False
            continue
        qualified = f"{prefix}{syntax.separator}{name}" if prefix and name else (name or prefix)
        own = _trait_impl_title(inner, walk, qualified)
        kind = _define(walk, inner, qualified if name else "", container)
        body_field = syntax.kinds[inner.type]
        body = inner.child_by_field_name(body_field) if body_field else None
        if body is not None and walk.chars(start, node) > walk.max_chars:
            _region(walk, body.named_children, start, own, qualified, kind)
        else:
            walk.cuts.append((start, own, prefix))
            if body is not None:  # not opened for chunking, but its members are definitions all the same
                _members(walk, body.named_children, qualified, kind)
        last_was_definition = True


def _define(walk: _Walk, node: Node, qualified: str, container: str) -> str:
    """Record `node` as the definition of `qualified` (nothing for an anonymous one); its kind."""
    kind = KINDS.get(node.type, "definition")
    if kind == "type" and node.type == "type_declaration":  # Go: the spec's type says struct or interface
        spec = next((c for c in node.named_children if c.type in ("type_spec", "type_alias")), None)
        value = spec.child_by_field_name("type") if spec is not None else None
        kind = _GO_TYPES.get(value.type, kind) if value is not None else kind
    elif kind == "function" and container in _CLASS_LIKE:
        kind = "method"
    if qualified:
        start = walk.line_of(node.start_byte)
        end = walk.line_of(max(node.end_byte - 1, node.start_byte))
        first = walk.src[walk.line_bytes[start]:walk.line_bytes[start + 1]].decode("utf-8", "replace").strip()
        walk.defs.append(Definition(qualified, kind, start, end, first[:_MAX_SIGNATURE]))
    return kind


def _members(walk: _Walk, nodes: list[Node], prefix: str, container: str) -> None:
    """Record the definitions of a member list that is not cut (its class fits one chunk)."""
    syntax = walk.syntax
    for node in _siblings(nodes, syntax.flatten):
        inner = _unwrap(node, syntax)
        if inner.type not in syntax.kinds:
            continue
        name = _name(inner, walk)
        if not name:
            continue
        qualified = f"{prefix}{syntax.separator}{name}"
        kind = _define(walk, inner, qualified, container)
        body_field = syntax.kinds[inner.type]
        body = inner.child_by_field_name(body_field) if body_field else None
        if body is not None:
            _members(walk, body.named_children, qualified, kind)


def _trait_impl_title(node: Node, walk: _Walk, qualified: str) -> str:
    """`Display for Wrapper` for a Rust trait impl: it implements the trait *for* the type, it does not
    define the type, so its title must not claim the type's name (members stay `Wrapper::fmt`)."""
    trait = node.child_by_field_name("trait") if node.type == "impl_item" else None
    return f"{walk.text(trait)} for {qualified}"[:_MAX_TITLE] if trait is not None else qualified


def _unwrap(node: Node, syntax: _Syntax) -> Node:
    """The definition inside an export, decorator or template wrapper (the node itself otherwise)."""
    while node.type in syntax.wrappers:
        inner = node.child_by_field_name("definition") or node.child_by_field_name("declaration")
        if inner is None:
            inner = next((c for c in node.named_children if c.type in syntax.kinds or c.type in syntax.wrappers), None)
        if inner is None:
            return node
        node = inner
    return node


def _function_valued(node: Node | None) -> bool:
    return node is not None and node.type in _FUNCTION_VALUES


def _name(node: Node, walk: _Walk) -> str | None:
    """The definition's name ("" when anonymous), or None when the node defines nothing worth a cut."""
    kind = node.type
    if kind in ("lexical_declaration", "variable_declaration"):  # const handler = () => ...
        return _declared_function_name(node, walk)
    if kind == "expression_statement":  # exports.run = function () {...}; Foo.prototype.bar = ...
        return _assigned_name(node, walk)
    if kind in ("field_definition", "public_field_definition"):  # handleClick = () => {...}
        if not _function_valued(node.child_by_field_name("value")):
            return None
        target = node.child_by_field_name("name") or node.child_by_field_name("property")
        return walk.text(target)[:_MAX_TITLE] if target is not None else ""
    if kind == "method_declaration" and node.child_by_field_name("receiver") is not None:  # Go
        name = node.child_by_field_name("name")
        receiver = _receiver_type(node.child_by_field_name("receiver"))
        base = walk.text(name) if name is not None else ""
        return (f"{walk.text(receiver)}.{base}" if receiver is not None else base)[:_MAX_TITLE]
    if kind == "type_declaration":  # Go: type X struct {...}, or a group of types
        spec = next((c for c in node.named_children if c.type in ("type_spec", "type_alias")), None)
        target = spec.child_by_field_name("name") if spec is not None else None
        return walk.text(target)[:_MAX_TITLE] if target is not None else ""
    if kind == "impl_item":  # Rust: impl Trait for Type -> Type
        target = node.child_by_field_name("type")
        while target is not None and target.type == "generic_type":
            target = target.child_by_field_name("type")
        return walk.text(target)[:_MAX_TITLE] if target is not None else ""
    target = node.child_by_field_name("name")
    if target is None and (target := node.child_by_field_name("declarator")) is not None:  # C/C++: int *f(void)
        while (inner := target.child_by_field_name("declarator")) is not None:
            target = inner
    return walk.text(target)[:_MAX_TITLE] if target is not None else ""


def _declared_function_name(node: Node, walk: _Walk) -> str | None:
    """The name a JS/TS declaration binds to a function value (`const handler = () => ...`), or None."""
    for d in node.named_children:
        if d.type == "variable_declarator" and _function_valued(d.child_by_field_name("value")):
            target = d.child_by_field_name("name")
            return walk.text(target)[:_MAX_TITLE] if target is not None else ""
    return None


def _assigned_name(node: Node, walk: _Walk) -> str | None:
    """The targets of an assignment statement that defines a function or an export, or None."""
    expr = node.named_children[0] if node.named_child_count else None
    targets: list[str] = []
    while expr is not None and expr.type == "assignment_expression":  # res.type = res.contentType = fn
        left = expr.child_by_field_name("left")
        if left is not None:
            targets.append(walk.text(left))
        expr = expr.child_by_field_name("right")
    if not targets:
        return None
    # a function value defines its names; an export (`module.exports.x = ...`) defines one whatever its value
    if not (_function_valued(expr) or any(t.startswith(_EXPORT_TARGETS) for t in targets)):
        return None
    return ", ".join(targets)[:_MAX_TITLE]


def _receiver_type(receiver: Node | None) -> Node | None:
    """The type name in a Go receiver `(r *Router[T])` -> Router."""
    if receiver is None:
        return None
    stack = list(receiver.named_children)
    while stack:
        node = stack.pop(0)
        if node.type == "type_identifier":
            return node
        stack = list(node.named_children) + stack
    return None
