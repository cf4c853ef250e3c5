"""What kind of process this is, for the rules that depend on it (standard library only, imported by the thin client).

`one_shot`: a `moonmind` command that ends right after its operation (cli.main.run). It may
hold the embedded store for its own operation; every process that lives on must either serve
the store it holds or let go of it after each operation (runtime.let_go_unless_serving).
"""

one_shot = False
