"""Print moonmind's queue events as they arrive, one JSON object per line.

    CELERY_BROKER_URL=redis://localhost:6379/0 python docs/examples/events_consumer.py [--pattern rag.#]
        [--count N] [--timeout SECONDS] [--queue NAME]

Events are published by whichever process does the work (`moonmind rag search`, the box's owner,
a Celery worker, `moonmind job start/finish`) to the topic exchange `moonmind.events` with the
routing key `rag.<event>` (docs/celery.md, "Queue events"). A consumer binds its own queue to the
exchange: `rag.#` for every event, `rag.doctor_failed` for one. Only events published while the
queue is bound arrive; without `--queue` the queue is private and goes when this consumer stops,
with `--queue NAME` it is durable and keeps events while no one listens.

The broker is MOONMIND_EVENTS_URL if set, else CELERY_BROKER_URL (as for the publisher).
Exit status: 0 after `--count` events (or on Ctrl-C), 1 when `--timeout` passed first.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import uuid

from kombu import Connection, Exchange, Queue

EXCHANGE = Exchange("moonmind.events", type="topic", durable=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pattern", default="rag.#", help="routing-key pattern to bind (default: rag.#, every event)")
    ap.add_argument("--count", type=int, default=0, help="stop after this many events (default: never)")
    ap.add_argument("--timeout", type=float, default=0, help="give up after this many seconds (default: never)")
    ap.add_argument("--queue", default=None, help="a durable queue of this name (default: a private one)")
    a = ap.parse_args(argv)

    url = os.environ.get("MOONMIND_EVENTS_URL") or os.environ.get("CELERY_BROKER_URL")
    if not url or url == "off":
        print("Set CELERY_BROKER_URL (or MOONMIND_EVENTS_URL) to the broker moonmind publishes to.", file=sys.stderr)
        return 2
    if a.queue:
        queue = Queue(a.queue, EXCHANGE, routing_key=a.pattern, durable=True)
    else:
        queue = Queue(f"moonmind-events-{uuid.uuid4().hex[:12]}", EXCHANGE, routing_key=a.pattern,
                      durable=False, auto_delete=True)
    seen = 0

    def on_message(body, message) -> None:
        nonlocal seen
        event = body if isinstance(body, dict) else json.loads(body)
        print(json.dumps(event, sort_keys=True), flush=True)
        message.ack()
        seen += 1

    deadline = time.monotonic() + a.timeout if a.timeout else None
    with Connection(url) as conn:
        with conn.Consumer(queue, callbacks=[on_message], accept=["json"]):  # declares and binds the queue
            print(f"listening: {conn.as_uri()} exchange={EXCHANGE.name} pattern={a.pattern} queue={queue.name}",
                  file=sys.stderr, flush=True)
            try:
                while not a.count or seen < a.count:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        print(f"timed out after {a.timeout:g}s with {seen} event(s)", file=sys.stderr)
                        return 1
                    try:
                        conn.drain_events(timeout=min(left, 1.0) if left is not None else 1.0)
                    except socket.timeout:
                        continue
            except KeyboardInterrupt:
                pass
            finally:
                if not a.queue:  # a private queue goes with its consumer (Redis keeps bindings otherwise)
                    queue(conn.default_channel).delete()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
