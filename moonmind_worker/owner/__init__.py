"""One warm owner per box: the process holding the embedded store serves every other process.

Qdrant Edge is a single-process engine, so exactly one process opens the embedded store.
Whatever process holds it (a Celery worker, `moonmind gateway serve`, `moonmind serve`)
also answers local clients on a Unix domain socket beside the store's lock file, and
every other `moonmind` command on the box becomes a thin client of it:

* `protocol` — the socket's path and its framing (JSON lines), standard library only;
* `client` — find the owner, send one operation, read progress and the result; imports
  no numpy, pydantic, qdrant, celery or fastapi, so a client pays for none of them;
* `dispatch` — run one operation on the owner when one is alive, else in this process;
* `ops` — the operations themselves (search, index, overlay, stats, checks, sync),
  run by the owner for its clients, or in-process by a one-shot command when no owner
  is alive: one function per operation whichever process runs it;
* `server` — the socket server an owning process runs in a background thread.
"""
