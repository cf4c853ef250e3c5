"""Alias of `moonmind_worker.celery.worker` (the Celery app and its worker lifecycle).

Importing this module gives that very module object.
"""

import sys

import moonmind_worker.celery.worker as _module

sys.modules[__name__] = _module
