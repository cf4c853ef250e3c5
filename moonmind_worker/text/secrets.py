"""What must never reach the index: secret files by name, and secrets written inside indexed text.

A context pack is pasted into an agent's prompt, often sent to a hosted model, and the store and
cached packs are files on disk. So secrets are kept out before chunking: a secret file is skipped
like a lock file (reported, with the setting that indexes it), and a secret inside a text file is
replaced by a marker naming its kind (`[redacted: aws-access-key]`) before anything is chunked,
embedded or stored. Line breaks inside a redacted span are kept, so every line number stays true.

Why not detect-secrets: on Django's 25 MB it projects to ~94 s with its regex plugins alone and
~226 s with its entropy plugins (the whole cold index takes ~10 s), and its keyword plugin flags
identifiers (`password_field_name="password1"`); figures: BENCHMARKS.md ("Secrets"). The formats
below are those of detect-secrets' and gitleaks' rules for the same providers. Each rule runs only
on a text holding its literal anchor, so a file without one costs a few substring scans.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Callable

#: Part of the chunk recipe (indexing.indexer.chunk_recipe): a change to the rules re-chunks every
#: file on the next run, so a secret the old rules let through leaves the store.
RULES_VERSION = 1

#: The override named in every secret-file skip.
INDEX_SECRET_FILES = "MOONMIND_INDEX_SECRET_FILES=on indexes them"

# --------------------------------------------------------------- secret files ---

#: Exact file names, and what they hold.
_SECRET_NAMES = {
    ".env": "dotenv file",
    ".envrc": "dotenv file",
    ".netrc": "credentials file", "_netrc": "credentials file", ".pgpass": "credentials file",
    ".git-credentials": "credentials file", ".npmrc": "credentials file", ".pypirc": "credentials file",
    ".htpasswd": "credentials file", ".boto": "credentials file", ".s3cfg": "credentials file",
    "credentials.json": "credentials file", "credentials.yml": "credentials file", "credentials.yaml": "credentials file",
    "secrets.json": "credentials file", "secrets.yml": "credentials file", "secrets.yaml": "credentials file",
    "master.key": "private key", "id_rsa": "private key", "id_dsa": "private key", "id_ecdsa": "private key",
    "id_ed25519": "private key", "id_ecdsa_sk": "private key", "id_ed25519_sk": "private key",
    "kubeconfig": "cloud or cluster config", "terraform.tfstate": "Terraform state",
}
#: Suffixes (lower-cased name), and what they hold.
_SECRET_SUFFIXES = (
    (".pem", "private key or certificate"), (".key", "private key or certificate"), (".p12", "keystore"),
    (".pfx", "keystore"), (".p8", "private key or certificate"), (".ppk", "private key"), (".jks", "keystore"),
    (".keystore", "keystore"), (".kdbx", "keystore"), (".crt", "private key or certificate"),
    (".cer", "private key or certificate"), (".der", "private key or certificate"), (".gpg", "private key"),
    (".tfstate", "Terraform state"), (".tfstate.backup", "Terraform state"), (".tfvars", "Terraform variables"),
    (".ovpn", "VPN profile"),
)
#: `.env.<x>` files that are templates, written to be shared (no values, or example ones): indexed.
_ENV_TEMPLATES = frozenset(("example", "sample", "template", "dist", "defaults", "schema"))
#: A file name in a tool's credentials directory: (directory, name) -> what it holds.
_SECRET_IN_DIR = {
    (".aws", "credentials"): "cloud or cluster config", (".aws", "config"): "cloud or cluster config",
    (".kube", "config"): "cloud or cluster config", (".docker", "config.json"): "credentials file",
    (".ssh", "*"): "SSH directory", (".gnupg", "*"): "private key",
}


def secret_file(rel: str) -> str | None:
    """What kind of secret the file at `rel` (a POSIX path in the tree) holds by its name, or None."""
    path = PurePosixPath(rel)
    name = path.name.lower()
    kind = _SECRET_NAMES.get(name)
    if kind is not None:
        return kind
    if name.startswith(".env."):
        return None if name[5:] in _ENV_TEMPLATES else "dotenv file"
    if name.endswith(".env") and not name.startswith("."):  # prod.env, local.env
        return "dotenv file"
    if name.startswith(("client_secret", "service-account", "service_account")) and name.endswith(".json"):
        return "credentials file"
    for suffix, what in _SECRET_SUFFIXES:
        if name.endswith(suffix):
            return what
    parent = path.parent.name.lower()
    return _SECRET_IN_DIR.get((parent, name)) or _SECRET_IN_DIR.get((parent, "*"))


def secret_file_reason(kind: str) -> str:
    """The skip reason a report shows for a secret file of `kind`."""
    return f"secret file: {kind} ({INDEX_SECRET_FILES})"


# ------------------------------------------------------------- inline secrets ---


@dataclass(frozen=True)
class _Rule:
    kind: str
    #: literal substrings every match starts with; each place one stands is where `tail` is tried
    anchors: tuple[str, ...]
    #: matched right after an anchor (never searched through the text: a scan per rule cost seconds on Django)
    tail: re.Pattern[str]
    #: the groups of `tail` whose text is replaced, the first that took part in the match (0: the anchor and all
    #: `tail` matched)
    groups: tuple[int, ...] = (0,)
    #: a test on the replaced text: False leaves the match as it is
    accept: Callable[[str], bool] | None = None
    #: anchors are sought in the lower-cased text (the tail then ignores case)
    fold: bool = False
    #: the anchor must not follow a letter or digit (a token's prefix, not a piece of a longer word)
    bounded: bool = True


def _entropy(s: str) -> float:
    """Shannon entropy in bits per character."""
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


#: Values that stand for a secret in docs and examples, not one (compared lower-cased, symbols left out).
_PLACEHOLDERS = frozenset("""password passwd pass pwd secret token changeme changeit example test testing dummy
    fake sample placeholder redacted hidden none null xxx xxxx xxxxxx xxxxxxxx yourpassword mypassword
    yoursecret mysecret secretkey apikey yourapikey yourtoken""".split())


_CODE_REFERENCE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


_TEMPLATE = re.compile(r"\$\{|\$\(|^\$[A-Za-z_]|\{\{|\{[A-Za-z_]*\}|%\(\w+\)|%[sd]|^<[^>]*>$|\w\(|\[")


def _credential_value(value: str) -> bool:
    """Whether a URL's password or a config value may be a real secret: not a placeholder, a template or code."""
    bare = re.sub(r"[^A-Za-z0-9]", "", value).lower()
    if not bare or bare in _PLACEHOLDERS or set(value) <= set("*x.X-_"):
        return False
    # a template or an expression fills it at run time: ${DB_PASS}, {{ pw }}, {password}, %(pw)s, <password>, env(...)
    return _TEMPLATE.search(value) is None


def _assigned_secret(value: str) -> bool:
    """Whether a value given to a secret-named name is a secret: long, random-looking, not code or words.

    What a reader needs stays: an identifier or an attribute (`settings.SECRET_KEY`, `password_field_name`),
    words and paths (`"custom_admin/password_change_form.html"`), a placeholder."""
    if len(value) < 12 or not _credential_value(value):
        return False
    if _CODE_REFERENCE.fullmatch(value) and ("." in value or len(re.findall(r"\d", value)) < 2):
        return False
    has_digit, has_upper, has_lower = (bool(re.search(p, value)) for p in (r"\d", r"[A-Z]", r"[a-z]"))
    if not (has_digit or (has_upper and has_lower)):
        return False  # lower-case words and separators, or a CONSTANT_NAME
    return _entropy(value) >= 3.0


_TOKEN_END = r"(?![A-Za-z0-9_-])"
#: After a secret-named word (`DB_PASSWORD`, `"client_secret"`): the rest of the name, an assignment, the value.
_ASSIGNED = (r"[A-Za-z0-9_.-]{0,40}['\"]?\s{0,8}(?::=|=>|=(?!=)|:(?!:))\s{0,8}"
             # a quoted value, or a bare one (.env, YAML) of a token's characters: not an expression (`!!x.y`, `::Path`)
             r"(?:[rbuf]?(['\"`])([^\s'\"`,;]{12,512})\1|()([A-Za-z0-9][A-Za-z0-9+/=_~@#%^&*!$-]{11,511})(?![^\s,;]))")

_RULES = (
    _Rule("private-key", ("-----BEGIN",), re.compile(
        r"[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----|\Z)", re.S), bounded=False),
    _Rule("aws-access-key", ("AKIA", "ASIA", "ABIA", "ACCA"), re.compile(r"[0-9A-Z]{16}(?![0-9A-Za-z])")),
    _Rule("github-token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), re.compile(r"[A-Za-z0-9]{36,255}" + _TOKEN_END)),
    _Rule("github-token", ("github_pat_",), re.compile(r"[A-Za-z0-9_]{22,255}" + _TOKEN_END)),
    _Rule("gitlab-token", ("glpat-",), re.compile(r"[A-Za-z0-9_-]{20,255}")),
    _Rule("slack-token", ("xox",), re.compile(r"[abposr]-[A-Za-z0-9-]{10,255}")),
    _Rule("slack-webhook", ("https://hooks.slack.com/services/",), re.compile(r"[A-Za-z0-9/_-]{20,255}")),
    _Rule("stripe-key", ("sk_live_", "rk_live_", "sk_test_", "rk_test_"), re.compile(r"[0-9A-Za-z]{16,255}")),
    _Rule("google-api-key", ("AIza",), re.compile(r"[0-9A-Za-z_-]{35}" + _TOKEN_END)),
    # OpenAI's and Anthropic's keys: sk-…, sk-proj-…, sk-ant-api03-…; mixed case and digits (not a CSS name)
    _Rule("api-key", ("sk-",), re.compile(r"[A-Za-z0-9_-]{32,255}"),
          accept=lambda s: bool(re.search(r"\d", s)) and bool(re.search(r"[A-Z]", s))),
    _Rule("npm-token", ("npm_",), re.compile(r"[A-Za-z0-9]{36}" + _TOKEN_END)),
    _Rule("pypi-token", ("pypi-AgE",), re.compile(r"[A-Za-z0-9_-]{50,}")),
    _Rule("jwt", ("eyJ",), re.compile(r"[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}")),
    # scheme://user:password@host: the password alone goes, the user and host stay
    _Rule("url-password", ("://",), re.compile(r"[^\s/:@'\"`]{1,128}:([^\s/@'\"`]{1,256})@"), groups=(1,),
          accept=_credential_value, bounded=False),
    # a connection string's field: ...;AccountKey=...;Password=...;
    _Rule("connection-string-secret", (";accountkey", ";sharedaccesskey", ";password", ";pwd"), re.compile(
        r"\s{0,4}=\s{0,4}([^;\s'\"`]{4,})"), groups=(1,), accept=_credential_value, fold=True, bounded=False),
    # SECRET_KEY = "…", "api_key": "…", password: …: a random-looking value given to a secret-named name
    _Rule("secret-assignment", ("passw", "pwd", "secret", "token", "credential"), re.compile(_ASSIGNED), groups=(2, 4),
          accept=_assigned_secret, fold=True, bounded=False),
    _Rule("secret-assignment", ("api", "access", "account", "private", "auth"), re.compile(r"[_-]?key" + _ASSIGNED),
          groups=(2, 4), accept=_assigned_secret, fold=True, bounded=False),
)


def redact(text: str) -> tuple[str, Counter[str]]:
    """`text` with every secret the rules find replaced by `[redacted: KIND]`, and how many of each kind.

    Line breaks inside a replaced span stay, so a chunk's line numbers are the file's.
    """
    folded = text.lower()
    if len(folded) != len(text):  # a few Unicode letters lower to two: fold ASCII alone, place for place
        folded = text.translate(_ASCII_LOWER)
    spans: list[tuple[int, int, int, str]] = []  # (start, rule's place, end, kind): the first rule names a span
    for place, rule in enumerate(_RULES):
        seek = folded if rule.fold else text
        for anchor in rule.anchors:
            at = seek.find(anchor)
            while at >= 0:
                after = at + len(anchor)
                if not (rule.bounded and at and (text[at - 1].isalnum())):
                    m = rule.tail.match(text, after)
                    group = next((g for g in rule.groups if m.group(g) is not None), 0) if m is not None else 0
                    if m is not None and (rule.accept is None or rule.accept(m.group(group))):
                        start, end = (at, m.end()) if group == 0 else m.span(group)
                        spans.append((start, place, end, rule.kind))
                at = seek.find(anchor, after)
    if not spans:
        return text, Counter()
    return _replace(text, sorted(spans))


_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def _replace(text: str, spans: list[tuple[int, int, int, str]]) -> tuple[str, Counter[str]]:
    out, last, found = [], 0, Counter[str]()
    for start, _place, end, kind in spans:
        if start < last:  # inside one already replaced
            continue
        out.append(text[last:start])
        out.append(f"[redacted: {kind}]" + "\n" * text.count("\n", start, end))
        found[kind] += 1
        last = end
    out.append(text[last:])
    return "".join(out), found
