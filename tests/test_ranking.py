"""Result shaping: symbol definitions, path matches, file diversity, priors, and a score in [0, 1]."""

from __future__ import annotations

from moonmind_worker.retrieval.ranking import (
    Candidate,
    cut_ties,
    defines_in_text,
    is_code,
    is_prose,
    is_symbol_query,
    path_match,
    score,
)
from moonmind_worker.store import Hit


def cand(path: str, text: str, cosine: float, bm25: float, offset: int = 0, title: str = "") -> Candidate:
    payload = {
        "path": path, "text": text, "offset_start": offset, "chunk_hash": f"sha256:{path}:{offset}",
        "section_title": title,
    }
    return Candidate(payload, cosine=cosine, bm25=bm25)


def test_symbol_query_puts_the_definition_above_heavier_usages():
    ranked = score("TokenStore", [
        cand("api/views.py", "store = TokenStore()\nstore.add(TokenStore.hash(t))", 0.5, 9.0),
        cand("auth/store.py", "class TokenStore:\n    '''Hashed tokens.'''", 0.3, 4.0),
    ])
    assert ranked[0].payload["path"] == "auth/store.py"
    assert ranked[0].signals["definition"] == 1.0 and ranked[1].signals["definition"] == 0.0


def test_one_long_file_cannot_fill_top_k():
    big = [cand("core.py", f"def f{i}(): pass", 0.6, 5.0, offset=i * 100) for i in range(10)]
    other = [cand(f"mod{i}.py", "def g(): pass", 0.45, 3.0) for i in range(5)]
    top = score("how does the core work", big + other)[:8]
    assert len({c.payload["path"] for c in top}) >= 5
    assert top[0].payload["path"] == "core.py"


def test_query_words_that_name_a_file_lift_that_file():
    ranked = score("background tasks", [
        cand("app/routing.py", "tasks are added to the response", 0.40, 5.0),
        cand("app/background.py", "class Runner: run callables after the response", 0.38, 4.5),
    ])
    assert ranked[0].payload["path"] == "app/background.py"
    assert path_match("pkg/dependencies/utils.py", frozenset({"dependency"})) == 1.0


def test_tests_count_less_unless_the_query_asks_for_tests():
    def chunks():
        return [cand("tests/test_pool.py", "pool acquire", 0.5, 5.0), cand("db/pool.py", "pool acquire", 0.5, 5.0)]
    assert score("connection pool acquire", chunks())[0].payload["path"] == "db/pool.py"
    assert score("tests for connection pool acquire", chunks())[0].payload["path"] == "tests/test_pool.py"


def test_scores_stay_in_unit_range_and_ranked_by_score():
    ranked = score("OAuth2PasswordBearer", [
        cand("security/oauth2.py", "class OAuth2PasswordBearer(OAuth2):", 1.0, 20.0, title="OAuth2PasswordBearer"),
        cand("security/__init__.py", "from .oauth2 import OAuth2PasswordBearer", 0.9, 25.0),
        cand("x.py", "nothing", -0.2, 0.0),
    ])
    scores = [c.score for c in ranked]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert ranked[0].payload["path"] == "security/oauth2.py"


def test_definition_and_symbol_detection_across_languages():
    assert is_symbol_query("field_validator") and is_symbol_query("Sinatra::Base") and is_symbol_query("HTTPException")
    assert not is_symbol_query("background tasks") and not is_symbol_query("session")
    assert defines_in_text("    async def run_endpoint(x):", "run_endpoint")
    assert defines_in_text("func (s *Server) Serve(l net.Listener) error {", "Serve")
    assert defines_in_text("pub struct Router<S> {", "Router")
    assert defines_in_text("export const createStore = () => {}", "createStore")
    assert not defines_in_text("x = OAuth2PasswordBearer(tokenUrl='t')", "OAuth2PasswordBearer")
    assert not defines_in_text("class OAuth2PasswordBearerX:", "OAuth2PasswordBearer")


def test_prose_counts_less_than_code_in_a_code_repository_unless_the_query_asks_for_docs():
    def chunks():
        return [
            cand("CHANGELOG.md", "query string parser now handles arrays", 0.55, 6.0),
            cand("README.md", "the query string parser turns ?a=1 into a dict", 0.55, 6.0),
            cand("lib/query.js", "function parseQuery(str) { return qs.parse(str) }", 0.5, 5.0),
            cand("lib/router.js", "function route(req) {}", 0.3, 1.0),
        ]
    assert score("how are query strings parsed", chunks())[0].payload["path"] == "lib/query.js"
    assert score("how do I configure the query string parser", chunks())[0].payload["path"] != "lib/query.js"


def test_a_book_keeps_its_prose_and_a_chapter_can_hold_several_of_the_top_places():
    book = [cand("docs/ros2/install.md", f"install ROS 2 step {i}", 0.7 - i * 0.02, 6.0 - i, offset=i * 100,
                 title=f"Install > Step {i}") for i in range(3)]
    book += [cand(f"docs/module-{m}/intro.md", "needs a ROS 2 installation first", 0.5, 3.0) for m in range(3)]
    top = score("ROS2 installation", book)[:5]
    assert sum(c.payload["path"] == "docs/ros2/install.md" for c in top) == 3
    code = [cand("core.py", f"def install_{i}(): pass", 0.7 - i * 0.02, 6.0 - i, offset=i * 100) for i in range(3)]
    code += [cand(f"mod{m}.py", "def setup(): install()", 0.5, 3.0) for m in range(3)]
    top = score("installation", code)[:4]
    assert sum(c.payload["path"] == "core.py" for c in top) < 3


def test_a_bare_word_query_lifts_the_chunk_that_defines_it():
    ranked = score("evolve", [
        cand("src/make.py", "new = evolve(inst, x=1)  # evolve returns a copy; evolve it again", 0.55, 9.0),
        cand("src/funcs.py", "def evolve(inst, **changes):\n    return copy", 0.5, 7.0),
    ])
    assert ranked[0].payload["path"] == "src/funcs.py" and ranked[0].signals["definition"] == 1.0
    assert not is_symbol_query("evolve")  # still a natural-language query: meaning keeps its weight


def test_a_query_whose_words_occur_nowhere_scores_below_the_default_threshold():
    from moonmind_worker.retrieval.pipeline import THRESHOLDS

    # a static model gives unrelated text a cosine near 0.5: without a word in common that is noise
    noise = [cand(f"src/m{i}.py", "def build(): return make()", 0.56 - i * 0.02, 0.0, title="build") for i in range(5)]
    assert max(c.score for c in score("qwxz plorf", noise)) < THRESHOLDS["moonmind-static-code-256"]
    real = [cand(f"src/m{i}.py", "def build(): return make()", 0.56 - i * 0.02, 3.0 - i * 0.5) for i in range(5)]
    assert max(c.score for c in score("build make", real)) >= THRESHOLDS["moonmind-static-code-256"]


def test_type_stubs_count_less_than_the_module_they_describe():
    ranked = score("include or exclude attributes", [
        cand("src/attr/filters.pyi", "def include(*what: type | str) -> Callable: ...", 0.6, 6.0),
        cand("src/attr/filters.py", "def include(*what):\n    cls, names = _split_what(what)", 0.56, 5.5),
    ])
    assert ranked[0].payload["path"] == "src/attr/filters.py"


def test_a_path_through_a_name_is_a_use_and_a_module_file_defining_it_is_no_stub():
    assert not defines_in_text("if let Value::Object(map) = v {", "Value")
    ranked = score("Value", [
        cand("src/value/de.rs", "let Value::Object(map) = v;\nmatch v { Value::Null => 0 }", 0.6, 9.0, title="visit"),
        cand("src/value/mod.rs", "pub enum Value {\n    Null,\n    Object(Map),\n}", 0.55, 8.0),
    ])
    assert ranked[0].payload["path"] == "src/value/mod.rs" and ranked[0].signals["prior"] == 1.0


def test_an_abbreviated_file_name_matches_the_word_it_abbreviates():
    assert path_match("args.go", frozenset({"positional", "argument"})) == 0.5
    assert path_match("pkg/cmd/root.go", frozenset({"command"})) == 1.0
    assert path_match("lib/auth.rb", frozenset({"authentication"})) == 1.0


def test_a_module_global_assignment_is_its_definition():
    assert defines_in_text("import x\ndb = SQLAlchemy()", "db")
    assert defines_in_text("DEFAULTS: dict[str, int] = {}", "DEFAULTS")
    assert not defines_in_text("    db = local()", "db") and not defines_in_text("db == other", "db")
    ranked = score("db", [
        cand("app/views.py", "rows = db.session.query(User)\ndb.session.commit()", 0.5, 6.0),
        cand("app/extensions.py", "db = SQLAlchemy()", 0.45, 5.0),
    ])
    assert ranked[0].payload["path"] == "app/extensions.py"


def test_book_pages_in_mdx_are_prose():
    assert is_prose("docs/module-1/ros2-setup.mdx") and not is_code("docs/module-1/ros2-setup.mdx")


def test_source_in_a_language_without_a_grammar_is_code_not_prose():
    ranked = score("how are routes matched", [
        cand("docs/guide.md", "routes are matched in the order they were added", 0.55, 6.0),
        cand("src/dispatch.lua", "local function match(routes, path) for _, r in ipairs(routes) do", 0.5, 5.0),
        cand("src/app.lua", "local app = {}", 0.3, 1.0),
        cand("src/util.lua", "local util = {}", 0.3, 1.0),
    ])
    assert ranked[0].payload["path"] == "src/dispatch.lua"


def test_a_three_letter_query_word_matches_the_start_of_a_run_together_file_name():
    assert path_match("lib/rack/urlmap.rb", frozenset({"url"})) == 1.0  # urlmap = url + map
    assert path_match("lib/rack/urlmap.rb", frozenset({"urlmapping"})) == 1.0
    assert path_match("lib/rack/url.rb", frozenset({"urg"})) == 0.0


def test_vendored_third_party_code_counts_less_than_the_project():
    ranked = score("format a number", [
        cand("third_party/fmt/format.h", "inline auto format_number(int n) -> std::string", 0.55, 6.0),
        cand("src/format.h", "std::string format_number(int n);", 0.5, 5.5),
    ])
    assert ranked[0].payload["path"] == "src/format.h"


def test_a_cpp_forward_declaration_is_not_the_definition():
    # `fwd.h` names the type so other headers can refer to it; `common.h` defines it (spdlog's layout)
    assert not defines_in_text("namespace level {\nenum level_enum : int;\n}", "level_enum", c_family=True)
    assert not defines_in_text("class logger;\nclass async_logger;", "logger", c_family=True)
    assert defines_in_text("enum level_enum : int\n{\n    trace,", "level_enum", c_family=True)
    assert defines_in_text("class logger\n{", "logger", c_family=True)
    assert defines_in_text("pub struct Unit;", "Unit")  # Rust: a unit struct is a definition
    ranked = score("level_enum", [
        cand("include/fwd.h", "namespace level {\nenum level_enum : int;\n}\nclass logger;", 0.6, 9.0),
        cand("include/common.h", "enum level_enum : int\n{\n    trace = 0,\n    debug,\n};", 0.55, 8.0),
    ])
    assert ranked[0].payload["path"] == "include/common.h"


def test_a_function_keyword_after_a_bracket_defines_the_name():
    # axios' defaults: `transformRequest: [function transformRequest(data, headers) {`
    assert defines_in_text("  transformRequest: [function transformRequest(data, headers) {", "transformRequest")
    assert defines_in_text("(function setup() {", "setup")
    assert not defines_in_text("  transformRequest: [transformRequest, other],", "transformRequest")
    ranked = score("transformRequest", [
        cand("lib/core/dispatchRequest.js", "config.data = transformData.call(config, config.transformRequest);",
             0.6, 9.0),
        cand("lib/defaults/index.js", "const defaults = {\n  transformRequest: [function transformRequest(data, headers) {",
             0.55, 8.0),
    ])
    assert ranked[0].payload["path"] == "lib/defaults/index.js"


def test_a_flow_declaration_file_counts_like_a_type_stub():
    # immer ships src/types/index.js.flow beside its TypeScript sources: signatures without the code
    ranked = score("apply patches to a base state", [
        cand("src/types/index.js.flow", "declare export function applyPatches<S>(state: S, patches: Patch[]): S", 0.6, 6.0),
        cand("src/plugins/patches.ts", "function applyPatches_(draft: any, patches: Patch[]) {\n  patches.forEach(", 0.56, 5.5),
    ])
    assert ranked[0].payload["path"] == "src/plugins/patches.ts"


def _hit(n: int, score: float) -> Hit:
    return Hit(id=f"id-{n:03d}", score=score, payload={})


def test_a_tie_at_the_pools_edge_is_cut_by_id_not_by_the_engines_order():
    """Two builds of one tree lay equal scores out in different engine orders; the pool keeps the same ones."""
    hits = [_hit(n, 1.0 - n / 100) for n in range(6)] + [_hit(n, 0.5) for n in (9, 7, 8, 6)]
    first = cut_ties(hits, 8, asked=12)
    again = cut_ties(list(reversed(hits)), 8, asked=12)
    assert [h.id for h in first] == [h.id for h in again]
    assert [h.id for h in first][6:] == ["id-006", "id-007"]


def test_a_tie_that_may_run_past_the_hits_returned_is_left_out_whole():
    """The store returned all it was asked for and the last hit still ties at the edge: points of that score
    may be missing, so none of them is kept; fewer hits than asked means the tie was returned whole."""
    hits = [_hit(n, 1.0 - n / 100) for n in range(6)] + [_hit(n, 0.5) for n in range(6, 12)]
    assert [h.id for h in cut_ties(hits, 8, asked=12)] == [f"id-{n:03d}" for n in range(6)]
    assert len(cut_ties(hits, 8, asked=13)) == 8
    assert len(cut_ties(hits[:7], 8, asked=12)) == 7
