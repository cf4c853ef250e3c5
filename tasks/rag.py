"""Alias of `moonmind_worker.celery.tasks` (the RAG tasks): importing this module gives that very module object."""

import sys

import moonmind_worker.celery.tasks as _module

sys.modules[__name__] = _module
