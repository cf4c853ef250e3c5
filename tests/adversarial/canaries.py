"""A tree seeded with secrets of many kinds, as files and inline in code, and the canaries that must never leave it.

Each canary is a unique string inside a secret; finding one in any output, pack, log, event or store file
means that secret got out. The values have the shapes of real credentials (so the rules must recognise the
format, not the canary) and are random: none is a live key.
"""

from __future__ import annotations

from pathlib import Path

#: kind -> (path, text); the canary in each is the part after "CANARY" up to the next non-word character
SECRET_FILES = {
    "dotenv": (".env", "OPENAI_API_KEY=sk-CANARYdotenv0001aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU\nDEBUG=1\n"),
    "dotenv variant": ("config/prod.env", "DATABASE_URL=postgres://app:CANARYprodenv7Yq2@db:5432/app\n"),
    "ssh key": ("deploy/id_rsa", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAACANARYidrsa00\n"
                                 "-----END OPENSSH PRIVATE KEY-----\n"),
    "pem": ("certs/server.pem", "-----BEGIN CERTIFICATE-----\nMIIBCANARYpem0000Q\n-----END CERTIFICATE-----\n"),
    "credentials json": ("credentials.json", '{"client_secret": "CANARYcredjson9fK2mZ81xQ", "client_id": "x"}\n'),
    "aws credentials": (".aws/credentials", "[default]\naws_secret_access_key = CANARYawscred8hJ3kL0pZx\n"),
    "terraform state": ("infra/terraform.tfstate", '{"outputs": {"db_password": {"value": "CANARYtfstate4Xb9"}}}\n'),
    "netrc": (".netrc", "machine api.example.com login bot password CANARYnetrc55hJ\n"),
}

#: kind -> (path, text) of source files that are indexed, each holding one secret written inline
INLINE_SECRETS = {
    "aws-access-key": ("app/aws.py", 'ACCESS_KEY_ID = "AKIACANARYAWS0000001"\n\n\ndef client():\n    return boto(ACCESS_KEY_ID)\n'),
    "github-token": ("app/gh.py", 'GH = "ghp_CANARYgithubTok3n0123456789abcdefABCDEF"\n'),
    "private-key": ("tests/fixtures_keys.py", 'KEY = """\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBCANARYinlinekey00\n'
                                             'AAAAB3NzaC1yc2EAAAADAQABAAABAQ\n-----END RSA PRIVATE KEY-----\n"""\n'),
    "url-password": ("app/db.py", 'DSN = "postgresql://admin:CANARYurlpass8Kq@db.internal:5432/main"\n'),
    "secret-assignment": ("app/settings.py", 'SECRET_KEY = "x9$CANARYsecretkey7Hq2#mZp41Lw"\nDEBUG = False\n'),
    "slack-token": ("ops/notify.js", 'const token = "xoxb-CANARYslack-1234567890-abcdefABCDEF";\n'),
    "stripe-key": ("billing/pay.rb", 'Stripe.api_key = "sk_live_CANARYstripe0123456789ab"\n'),
    "google-api-key": ("web/maps.ts", 'export const MAPS = "AIzaSyCANARYgoogle0123456789abcdefghijk";\n'),
    "api-key": ("llm/client.go", 'const key = "sk-proj-CANARYopenai0123456789ABCDEFabcdef"\n'),
    "jwt": ("api/auth_test.py", 'TOKEN_EXAMPLE = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJDQU5BUlkifQ.CANARYjwtSig0123456789"\n'),
    "connection-string-secret": ("config/azure.cs",
                                 'var cs = "DefaultEndpointsProtocol=https;AccountName=x;AccountKey=CANARYazure0Ab9==;";\n'),
    "npm-token": ("tools/publish.sh", "export NPM_TOKEN=npm_CANARYnpm0123456789abcdefABCDEF01234\n"),
}

#: Ordinary code beside them, so a search has something to find and the index is not only secrets.
PLAIN = {
    "app/orders.py": 'def place_order(cart, user):\n    """Check out a cart: reserve stock, charge the card, send a receipt."""\n'
                     "    return charge(cart.total, user)\n",
    "README.md": "# Shop\n\nOrders, billing and notifications.\n",
}


def canaries() -> list[str]:
    """Every canary, as it must never be found (the unique part of each secret)."""
    out = []
    for _path, text in [*SECRET_FILES.values(), *INLINE_SECRETS.values()]:
        at = text.index("CANARY")
        end = at
        while end < len(text) and (text[end].isalnum()):
            end += 1
        out.append(text[at:end])
    return out


def seed(root: Path) -> Path:
    """Write the tree (no .gitignore: nothing here is ignored by git rules)."""
    for rel, text in [*SECRET_FILES.values(), *INLINE_SECRETS.values(), *PLAIN.items()]:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def found_in(paths: list[Path] | Path, texts: tuple[str, ...] = ()) -> list[str]:
    """Each 'canary @ where' found in the files under `paths` (read as bytes) and in `texts`.

    The raw bytes alone can miss one: Qdrant Edge compresses its payload pages, so a stored canary may sit
    behind a back-reference. Scan the payloads read back through the store as `texts` too (test_canaries.py).
    """
    hits = []
    needles = canaries()
    for i, text in enumerate(texts):
        hits += [f"{c} @ text {i}" for c in needles if c in text]
    for base in [paths] if isinstance(paths, Path) else paths:
        for f in [base] if base.is_file() else (p for p in base.rglob("*") if p.is_file() and not p.is_symlink()):
            try:
                data = f.read_bytes()
            except OSError:
                continue
            hits += [f"{c} @ {f}" for c in needles if c.encode() in data]
    return hits
