"""`python -m moonmind_worker`: the `moonmind` command, for when the console script is not on PATH."""

from .cli.main import run

if __name__ == "__main__":
    run()
