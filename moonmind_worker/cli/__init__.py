"""`moonmind`: the command line (`main.py` parses and dispatches; one module per command group, imported only when called)."""
