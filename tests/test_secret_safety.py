"""Nothing secret goes into the index (issue 52): secret files are skipped, secrets in text are redacted.

The end-to-end canary suite (every entry point, every output and store file scanned) is
tests/adversarial/test_canaries.py; these are the rules, one behaviour each, in process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "adversarial"))

from canaries import INLINE_SECRETS, SECRET_FILES, canaries  # noqa: E402

from moonmind_worker.text.chunking import chunk_text  # noqa: E402
from moonmind_worker.text.files import Skipped, WalkRules, excluded_reason, walk  # noqa: E402
from moonmind_worker.text.secrets import redact, secret_file  # noqa: E402


@pytest.mark.parametrize("kind", sorted(INLINE_SECRETS))
def test_a_secret_written_in_code_is_replaced_by_a_marker_naming_its_kind(kind):
    _path, text = INLINE_SECRETS[kind]
    out, found = redact(text)
    assert f"[redacted: {kind}]" in out
    assert found == {kind: 1}
    assert not any(c in out for c in canaries())


@pytest.mark.parametrize("kind", sorted(INLINE_SECRETS))
def test_redaction_keeps_every_line_where_it_was(kind):
    _path, text = INLINE_SECRETS[kind]
    out, _ = redact(text)
    assert out.count("\n") == text.count("\n")
    # the lines around a secret are untouched
    kept = [line for line in text.splitlines() if "CANARY" not in line and "PRIVATE KEY" not in line and line.strip()]
    for line in kept:
        if not line.startswith(("MIIE", "AAAA")):  # a key block's body lines go with it
            assert line in out.splitlines()


@pytest.mark.parametrize("text", ["api_key: Zx81kLmQ9pR2sT4vW\n", "DB_PASSWORD=p4ss-W0rd-2f9Kq\n",
                                  '"client_secret": "9fK2mZ81xQ7pLw3v"'])
def test_a_bare_or_quoted_value_of_a_secret_named_key_is_redacted_in_config_files(text):
    out, found = redact(text)
    assert found == {"secret-assignment": 1}
    assert out.split("[redacted: secret-assignment]")[0] == text[: out.index("[")]


@pytest.mark.parametrize("text", [
    'secret_key = settings.SECRET_KEY',                           # an attribute: code
    'password_change_template = "custom_admin/password_change_form.html"',  # a path
    'password1_field_name="password1",',                           # an identifier
    'SECRET_KEY_INSECURE_PREFIX = "django-insecure-"',             # words
    'DATABASE_URL = "postgres://user:password@localhost/db"',      # a placeholder password
    'password = "${DB_PASSWORD}"',                                  # a template
    'api_key: {{ api_key }}',
    'token = env("API_TOKEN")',                                     # read at run time
    'TOKEN_TYPES = ("BLOCK_TAG_START", "VARIABLE_TAG_START")',
    '.sk-progress-bar { color: red }',
    "git clone https://github.com/org/repo.git",
    "task-12345678901234567890123456789012345",                     # 'sk-' inside a word
    "self.eat(Token::RightBracket)?;",                              # a path, not an assignment (Rust, held-out toml)
    "request.withCredentials = !!_config.withCredentials;",        # an expression (held-out axios)
    'assertContains(response, f"<h1>Set password: {test_user.username}</h1>")',
    'if password == "correct-horse-battery":',                      # a comparison
])
def test_what_a_reader_needs_is_not_a_secret(text):
    assert redact(text) == (text, {})


def test_chunks_are_cut_from_the_redacted_text_and_keep_the_files_line_numbers():
    _path, text = INLINE_SECRETS["private-key"]
    source = "import os\n\n" + text + "\n\ndef load():\n    return KEY\n"
    chunks = chunk_text(source, "keys.py", 1500, 0)
    joined = "".join(c.text for c in chunks)
    assert "[redacted: private-key]" in joined and "CANARY" not in joined
    assert chunks[-1].line_end == source.count("\n")
    assert "CANARY" in "".join(c.text for c in chunk_text(source, "keys.py", 1500, 0, redact=False))


@pytest.mark.parametrize("kind", sorted(SECRET_FILES))
def test_a_secret_file_is_known_by_its_name(kind):
    path, _text = SECRET_FILES[kind]
    assert secret_file(path) is not None


@pytest.mark.parametrize("path", [".env.example", ".env.sample", "config/settings.py", "keys.md", "docs/ssh.md",
                                  "environment.py", "certificate_test.go", "credentials_form.py"])
def test_templates_and_ordinary_files_are_not_secret_files(path):
    assert secret_file(path) is None


def _seed(root: Path) -> Path:
    for path, text in [*SECRET_FILES.values(), ("app.py", "def f():\n    return 1\n"), (".env.example", "KEY=\n")]:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def test_the_walk_skips_secret_files_and_says_which_setting_indexes_them(tmp_path):
    skipped: list[Skipped] = []
    walked = [rel for rel, _ in walk(_seed(tmp_path), skipped)]
    assert walked == [".env.example", "app.py"]
    reasons = {s.path: s.reason for s in skipped}
    assert set(reasons) == {path for path, _ in SECRET_FILES.values()}
    assert all(r.startswith("secret file: ") and "MOONMIND_INDEX_SECRET_FILES=on" in r for r in reasons.values())
    assert reasons[".env"] == "secret file: dotenv file (MOONMIND_INDEX_SECRET_FILES=on indexes them)"


def test_the_setting_indexes_secret_files_and_a_named_path_is_held_to_the_same_rule(tmp_path):
    root = _seed(tmp_path)
    everything = [rel for rel, _ in walk(root, rules=WalkRules(secret_files=True))]
    assert set(everything) == {".env.example", "app.py"} | {path for path, _ in SECRET_FILES.values()}
    assert "MOONMIND_INDEX_SECRET_FILES" in excluded_reason(root, "deploy/id_rsa")
    assert excluded_reason(root, "deploy/id_rsa", rules=WalkRules(secret_files=True)) is None


def test_files_git_ignores_through_core_excludes_file_are_not_walked(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "app.py").write_text("x = 1\n")
    (root / "notes.private").write_text("mine\n")
    (root / "scratch").mkdir()
    (root / "scratch" / "a.py").write_text("y = 2\n")
    excludes = tmp_path / "global-ignore"
    excludes.write_text("*.private\nscratch/\n")
    config = tmp_path / "gitconfig"
    config.write_text(f"[core]\n\texcludesFile = {excludes}\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout
    assert status.split() == ["??", "app.py"]  # git agrees: the others are ignored
    assert [rel for rel, _ in walk(root)] == ["app.py"]
    assert excluded_reason(root, "notes.private") is not None
    assert excluded_reason(root, "scratch/a.py") is not None


def test_the_trees_own_gitignore_can_take_back_what_the_users_excludes_file_leaves_out(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "a.log").write_text("kept\n")
    (root / "b.log").write_text("left out\n")
    (root / ".gitignore").write_text("!a.log\n")
    xdg = tmp_path / "xdg"
    (xdg / "git").mkdir(parents=True)
    (xdg / "git" / "ignore").write_text("*.log\n")  # git's default place, with core.excludesFile unset
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-config"))
    assert [rel for rel, _ in walk(root)] == [".gitignore", "a.log"]


def test_ignore_rules_read_once_for_many_paths_give_each_path_the_walks_answer(tmp_path):
    """The watcher's batches share one cache of each directory's rules (a 225k-rename storm read them 225k times)."""
    (tmp_path / ".gitignore").write_text("*.log\nbuild/\n")
    (tmp_path / "pkg" / "keep").mkdir(parents=True)
    (tmp_path / "pkg" / ".gitignore").write_text("!important.log\n*.tmp\n")
    paths = ["a.py", "a.log", "build/x.py", "pkg/important.log", "pkg/other.log", "pkg/x.tmp", "pkg/keep/y.py", ".env"]
    cache: dict = {}
    shared = [excluded_reason(tmp_path, p, cache=cache) for p in paths]
    assert shared == [excluded_reason(tmp_path, p) for p in paths]
    assert [r is None for r in shared] == [True, False, False, True, False, False, True, False]
    assert set(cache) == {"", "pkg", "pkg/keep"}  # each directory read once; build/ is ignored whole, never opened
