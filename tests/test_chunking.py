"""Chunking that follows the code: tree-sitter definition boundaries, the line-aware fallback."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moonmind_worker.text import chunking, code_chunks
from moonmind_worker.text.chunking import Chunk, chunk_text


def _body(n: int, indent: str = "    ", comment: str = "#") -> str:
    """n lines of filler so a definition has a predictable size."""
    return "".join(f"{indent}{comment} step {i} of the work done here\n" for i in range(n))


def _py_body(n: int, indent: str = "    ") -> str:
    """n Python statements: a body made only of comments would not parse."""
    return "".join(f"{indent}total += {i}  # step {i} of the work done here\n" for i in range(n))


def _assert_exact(text: str, chunks: list[Chunk]) -> None:
    for c in chunks:
        assert c.text == text[c.offset_start : c.offset_end]
        assert c.line_start == text.count("\n", 0, c.offset_start) + 1
        assert c.line_end == c.line_start + c.text.count("\n") - c.text.endswith("\n")


def _regex_only(monkeypatch: pytest.MonkeyPatch, text: str, path: str, **kw) -> list[Chunk]:
    with monkeypatch.context() as m:
        m.setattr(chunking, "code_spans", lambda *a: None)
        return chunk_text(text, path, **kw)


BIG_CLASS = (
    "import os\n\n\nclass Store:\n    \"\"\"Keeps records.\"\"\"\n\n"
    "    def __init__(self):\n" + _py_body(12, " " * 8) + "\n"
    "    def load(self, key):\n" + _py_body(12, " " * 8) + "\n"
    "    @property\n    def size(self):\n" + _py_body(12, " " * 8) + "\n\n"
    "def helper():\n    return os.sep\n"
)


def test_python_class_over_the_cap_is_split_at_methods_with_qualified_titles():
    chunks = chunk_text(BIG_CLASS, "store.py", max_chars=700)
    titles = [c.section_title for c in chunks]
    assert "Store.load" in titles and "Store.size" in titles
    load = next(c for c in chunks if c.section_title == "Store.load")
    assert load.text.lstrip().startswith("def load(self, key):")


def test_decorators_stay_with_their_definition():
    chunks = chunk_text(BIG_CLASS, "store.py", max_chars=700)
    size = next(c for c in chunks if c.section_title == "Store.size")
    assert size.text.lstrip().startswith("@property\n    def size(self):")


def test_comment_directly_above_a_definition_belongs_to_it():
    text = "def a():\n" + _py_body(20) + "\n# Build the index.\n# Twice if needed.\ndef b():\n" + _py_body(20)
    b = next(c for c in chunk_text(text, "m.py", max_chars=900) if c.section_title == "b")
    assert b.text.startswith("# Build the index.\n# Twice if needed.\ndef b():")


def test_small_top_level_statements_are_grouped_into_one_chunk():
    text = "import os\nimport sys\n\nLIMIT = 10\nNAME = 'x'\n\n\ndef run():\n" + _py_body(40)
    chunks = chunk_text(text, "m.py", max_chars=1500)
    assert chunks[0].text == "import os\nimport sys\n\nLIMIT = 10\nNAME = 'x'\n\n\n"
    assert chunks[1].section_title == "run"


def test_members_of_a_split_class_do_not_pack_with_the_next_top_level_definition():
    chunks = chunk_text(BIG_CLASS, "store.py", max_chars=700)
    helper = next(c for c in chunks if "def helper" in c.text)
    assert helper.section_title == "helper" and "def size" not in helper.text


def test_several_small_methods_packed_together_are_titled_with_each_of_their_names():
    methods = "".join(f"    def m{i}(self):\n        return {i}\n\n" for i in range(30))
    text = "class Many:\n" + methods
    chunks = chunk_text(text, "many.py", max_chars=400)
    assert len(chunks) > 2
    assert all(c.section_title.startswith("Many") for c in chunks)
    packed = next(c for c in chunks if "def m5" in c.text and "def m6" in c.text)
    assert packed.section_title.startswith("Many: ") and {"m5", "m6"} <= set(packed.section_title[6:].split(", "))


def test_chained_and_export_assignments_are_titled_with_every_name():
    text = (
        "res.contentType =\nres.type = function contentType(type) {\n  return type;\n};\n\n"
        "module.exports.limit = 10;\n"
    )
    titles = [c.section_title for c in chunk_text(text, "response.js", max_chars=80)]
    assert titles == ["res.contentType, res.type", "module.exports.limit"]


def test_php_methods_are_titled_with_their_class():
    text = "<?php\nclass StreamHandler\n{\n    public function write(array $r): void\n    {\n" + "        $x = 1;\n" * 20 + "    }\n}\n"
    titles = [c.section_title for c in chunk_text(text, "StreamHandler.php", max_chars=200)]
    assert "StreamHandler.write" in titles


LANGUAGE_SOURCES = {
    "app.js": ("function alpha(x) {\n{body}}\n\nexport const beta = async (y) => {\n{body}};\n", ["alpha", "beta"], "//"),
    "app.ts": ("export function alpha(x: number): number {\n{body}  return x;\n}\n\n"
               "interface Beta {\n  a: string;\n{body}}\n", ["alpha", "Beta"], "//"),
    "view.tsx": ("export function alpha() {\n{body}  return <div className=\"a\">hi</div>;\n}\n\n"
                 "function beta() {\n{body}  return <span/>;\n}\n", ["alpha", "beta"], "//"),
    "main.go": ("package main\n\nfunc alpha() {\n{body}}\n\nfunc beta() {\n{body}}\n", ["alpha", "beta"], "//"),
    "lib.rs": ("fn alpha() {\n{body}}\n\npub struct Beta {\n{body}    x: u32,\n}\n", ["alpha", "Beta"], "//"),
    "App.java": ("class Alpha {\n{body}}\n\ninterface Beta {\n{body}}\n", ["Alpha", "Beta"], "//"),
    "prog.c": ("#include <stdio.h>\n\nstatic int *alpha(void) {\n{body}  return 0;\n}\n\n"
               "int beta(int x) {\n{body}  return x;\n}\n", ["alpha", "beta"], "//"),
    "prog.cpp": ("template <typename T>\nT alpha(T x) {\n{body}  return x;\n}\n\nint Beta::beta() {\n{body}  return 1;\n}\n",
                 ["alpha", "beta"], "//"),
    "lib.rb": ("def alpha\n{body}end\n\nclass Beta\n{body}end\n", ["alpha", "Beta"], "#"),
}


@pytest.mark.parametrize("path", sorted(LANGUAGE_SOURCES))
def test_definitions_in_each_grammar_language_become_chunks_named_after_them(path):
    template, names, comment = LANGUAGE_SOURCES[path]
    text = template.replace("{body}", _body(10, "  ", comment))
    chunks = chunk_text(text, path, max_chars=600)
    assert chunking.code_spans(text, text.splitlines(keepends=True), chunking.language_of(path), path, 600)
    for name in names:
        owner = [c for c in chunks if c.section_title.split("::")[-1] == name]
        assert owner, f"{name} has no chunk: {[c.section_title for c in chunks]}"
    _assert_exact(text, chunks)


def test_java_class_over_the_cap_is_split_at_methods_with_javadoc_attached():
    body = _body(10, " " * 8, "//")
    text = (
        "package a;\n\npublic class Pool {\n    private int size;\n\n"
        f"    public void close() {{\n{body}    }}\n\n"
        f"    /** Opens a connection. */\n    @Override\n    public void open() {{\n{body}    }}\n\n"
        f"    public Pool() {{\n{body}    }}\n}}\n"
    )
    chunks = chunk_text(text, "Pool.java", max_chars=600)
    open_ = next(c for c in chunks if c.section_title == "Pool.open")
    assert open_.text.lstrip().startswith("/** Opens a connection. */\n    @Override")
    assert any(c.section_title == "Pool.Pool" for c in chunks)


def test_go_method_title_carries_its_receiver_type():
    text = "package p\n\n// Handle serves.\nfunc (r *Router[T]) Handle(p string) error {\n" + _body(30, "\t", "//") + "}\n"
    chunks = chunk_text(text, "router.go", max_chars=600)
    assert chunks[0].section_title == ""
    assert chunks[1].section_title == "Router.Handle" and chunks[1].text.startswith("// Handle serves.\nfunc")


def test_rust_impl_members_are_qualified_and_keep_their_attributes():
    body = _body(10, " " * 8, "//")
    text = (
        "use std::fmt;\n\nimpl<T> fmt::Display for Wrapper<T> {\n"
        f"    fn height(&self) -> usize {{\n{body}        1\n    }}\n\n"
        f"    /// Formats it.\n    #[inline]\n    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {{\n{body}        Ok(())\n    }}\n\n"
        f"    fn width(&self) -> usize {{\n{body}        0\n    }}\n}}\n"
    )
    chunks = chunk_text(text, "wrap.rs", max_chars=600)
    fmt = next(c for c in chunks if c.section_title == "Wrapper::fmt")
    assert fmt.text.lstrip().startswith("/// Formats it.\n    #[inline]\n    fn fmt")
    assert any(c.section_title == "Wrapper::width" for c in chunks)
    assert chunks[1].section_title == "Wrapper: fmt::Display for Wrapper, height" and chunks[1].text.startswith("impl<T> fmt::Display")


def test_file_with_a_syntax_error_falls_back_to_the_line_splitter(monkeypatch):
    text = "def ok():\n    return 1\n\ndef broken(:\n    pass\n\nclass Later:\n    x = 1\n"
    assert code_chunks.code_spans(text, text.splitlines(keepends=True), "python", "bad.py", 1500) is None
    chunks = chunk_text(text, "bad.py", max_chars=40)
    assert chunks == _regex_only(monkeypatch, text, "bad.py", max_chars=40)
    assert [c.section_title for c in chunks] == ["ok", "broken", "Later"]
    _assert_exact(text, chunks)


def test_missing_grammar_falls_back_silently(monkeypatch):
    monkeypatch.setitem(code_chunks.SYNTAX, "go", replace(code_chunks.SYNTAX["go"], grammar=("no_such_grammar", "language")))
    monkeypatch.setattr(code_chunks, "_LANGUAGES", {})
    monkeypatch.setattr(code_chunks, "_LOCAL", threading.local())
    text = "package p\n\nfunc alpha() {\n" + _body(30, "\t", "//") + "}\n\nfunc beta() {}\n"
    assert code_chunks.code_spans(text, text.splitlines(keepends=True), "go", "a.go", 600) is None
    assert chunk_text(text, "a.go", max_chars=600) == _regex_only(monkeypatch, text, "a.go", max_chars=600)


def test_languages_without_a_grammar_use_the_line_splitter(monkeypatch):
    text = "fun alpha() {\n}\n\nclass Beta {\n}\n"
    assert code_chunks.grammar_for("kotlin", "a.kt") is None
    assert chunk_text(text, "a.kt") == _regex_only(monkeypatch, text, "a.kt")


def test_oversized_definition_is_split_inside_and_every_chunk_respects_the_cap():
    text = "def huge():\n" + _py_body(200) + "\n\ndef small():\n    return 1\n"
    chunks = chunk_text(text, "huge.py", max_chars=500)
    assert all(len(c.text) <= 500 for c in chunks)
    assert [c.section_title for c in chunks].count("huge") > 5
    _assert_exact(text, chunks)


def test_offsets_and_lines_are_exact_with_multibyte_text_crlf_and_a_line_over_the_cap():
    text = (
        "# -*- coding: utf-8 -*-\r\nNAME = 'naïve café ☕'\r\n\r\n"
        "def über(x):\r\n    return 'ü' * 3\r\n\r\n"
        "DATA = '" + "é" * 700 + "'\r\n\r\n"
        "class Ñandú:\r\n    def ñ(self):\r\n        return '→'\r\n"
    )
    chunks = chunk_text(text, "intl.py", max_chars=300)
    _assert_exact(text, chunks)
    assert all(len(c.text) <= 300 for c in chunks)
    assert "Ñandú" in {c.section_title for c in chunks}
    assert any(c.section_title == "über" and "\r\ndef über(x):\r\n" in c.text for c in chunks)


def test_chunking_is_deterministic_across_calls_and_threads():
    text = BIG_CLASS * 3
    first = chunk_text(text, "store.py", max_chars=700)
    out: list[list[Chunk]] = []
    threads = [threading.Thread(target=lambda: out.append(chunk_text(text, "store.py", max_chars=700))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(o == first for o in out) and chunk_text(text, "store.py", max_chars=700) == first


_FRAGMENTS = st.sampled_from([
    "import os\n", "X = 1\n", "\n", "# note\n", "@dec\n", "def f(a):\n    return a\n",
    "class C:\n    def m(self):\n        return 1\n\n    y = 2\n", "    pass\n", "def g(:\n", "'" + "x" * 90 + "'\n",
    "async def h():\n    '''doc é'''\n", "if True:\n    def inner():\n        pass\n",
])


@settings(max_examples=60, deadline=None)
@given(st.lists(_FRAGMENTS, max_size=40), st.integers(min_value=40, max_value=400))
def test_any_python_text_chunks_exactly_within_the_cap(fragments, cap):
    text = "".join(fragments)
    chunks = chunk_text(text, "gen.py", max_chars=cap)
    _assert_exact(text, chunks)
    assert all(len(c.text) <= cap for c in chunks)
    covered = set()
    for c in chunks:
        covered.update(range(c.line_start, c.line_end + 1))
    assert all(n in covered for n, line in enumerate(text.splitlines(), 1) if line.strip())


RST = (
    "==========\nUser Guide\n==========\n\nIntro text.\n\n"
    "Options\n=======\n\n" + "Options are named parameters.\n" * 30 + "\n"
    "Boolean Flags\n-------------\n\n" + "A flag is on or off.\n" * 30 + "\n"
    "Example::\n\n    not a title\n    ===========\n\n"
    "Arguments\n=======\n\n" + "Positional values.\n" * 20
)


MDX = (
    "---\ntitle: Setting up ROS 2\nsidebar_position: 2\n---\n\nimport Tabs from '@theme/Tabs';\n\n"
    "# Installing ROS 2\n\n" + "ROS 2 is the robot operating system.\n" * 12 + "\n"
    "## Prerequisites\n\n" + "Ubuntu 22.04 with a UTF-8 locale.\n" * 12 + "\n```bash\n# not a heading\nsudo apt install locales\n```\n\n"
    "## Install the packages\n\n<Tabs>\n" + "Run apt install ros-humble-desktop.\n" * 12 + "</Tabs>\n"
)


def test_an_mdx_page_is_cut_at_its_headings_like_markdown():
    """A Docusaurus-style book's pages: frontmatter, imports and JSX around markdown sections."""
    chunks = chunk_text(MDX, "docs/ros2/setup.mdx", max_chars=500)
    assert [c.section_title for c in chunks] == [c.section_title for c in chunk_text(MDX, "docs/ros2/setup.md", max_chars=500)]
    titles = [c.section_title for c in chunks]
    assert "Installing ROS 2 > Prerequisites" in titles and "Installing ROS 2 > Install the packages" in titles
    assert next(c for c in chunks if c.section_title.endswith("Prerequisites")).text.startswith("## Prerequisites")
    assert not any("not a heading" in t for t in titles)  # a comment in a code block stays a comment
    _assert_exact(MDX, chunks)


def test_rst_sections_are_chunks_titled_with_their_heading_path():
    chunks = chunk_text(RST, "docs/guide.rst", max_chars=700)
    titles = [c.section_title for c in chunks]
    assert "User Guide > Options" in titles
    assert "User Guide > Options > Boolean Flags" in titles
    flag = next(c for c in chunks if c.section_title.endswith("Boolean Flags"))
    assert flag.text.startswith("Boolean Flags\n-------------")
    _assert_exact(RST, chunks)


def test_rst_underline_shorter_than_its_title_or_indented_is_not_a_heading():
    chunks = chunk_text(RST, "docs/guide.rst", max_chars=700)
    titles = {c.section_title for c in chunks}
    assert not any("Arguments" in t for t in titles)  # "=======" is shorter than "Arguments"
    assert not any("not a title" in t for t in titles)  # inside an indented literal block


def test_rst_label_above_a_title_stays_with_its_section():
    text = ".. _guide:\n\nGuide\n=====\n\nIntro.\n\n.. _flags:\n\nFlags\n-----\n\n" + "A flag is on or off.\n" * 40
    chunks = chunk_text(text, "docs/guide.rst", max_chars=400)
    assert chunks[0].text.startswith(".. _guide:\n\nGuide\n=====") and chunks[0].section_title == "Guide"
    flags = next(c for c in chunks if c.section_title == "Guide > Flags")
    assert flags.text.startswith(".. _flags:\n\nFlags\n-----")
    assert not any(c.text.strip() in (".. _guide:", ".. _flags:") for c in chunks)  # no label-only chunk
    _assert_exact(text, chunks)


def test_cpp_header_with_a_namespace_macro_is_still_cut_at_its_definitions():
    body = "".join(f"        int v{i} = {i};\n" for i in range(12))
    text = (
        "#pragma once\nLIB_NAMESPACE_BEGIN\nnamespace detail\n{\n\n"
        f"class parse_error : public exception\n{{\n  public:\n    int position() const\n    {{\n{body}        return 0;\n    }}\n}};\n\n"
        f"class type_error : public exception\n{{\n  public:\n    int code() const\n    {{\n{body}        return 1;\n    }}\n}};\n\n"
        "}  // namespace detail\nLIB_NAMESPACE_END\n"
    )
    titles = [c.section_title for c in chunk_text(text, "exceptions.hpp", max_chars=400)]
    assert titles[1].endswith("parse_error") and titles[2] == "detail::type_error"


def test_a_rust_trait_impl_is_titled_trait_for_type_not_as_the_type():
    text = "pub enum Value {\n    Null,\n}\n\nimpl fmt::Display for Value {\n    fn fmt(&self) {}\n}\n"
    titles = [c.section_title for c in chunk_text(text, "value.rs", max_chars=40)]
    assert titles == ["Value", "fmt::Display for Value", "Value::fmt"]
