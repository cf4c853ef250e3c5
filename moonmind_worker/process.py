"""What kind of process this is, for the rules that depend on it (standard library only, imported by the thin client).

`one_shot`: a `moonmind` command that ends right after its operation (cli.main.run). It may
hold the embedded store for its own operation; every process that lives on must either serve
the store it holds or let go of it after each operation (runtime.let_go_unless_serving).
"""

one_shot = False


def alive(pid: int) -> bool:
    """True while process `pid` exists (another user's included)."""
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True
