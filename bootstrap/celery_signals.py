"""Alias of `moonmind_worker.celery.job_signals` (the job hook's Celery signal handlers).

Importing this module gives that very module object.
"""

import sys

import moonmind_worker.celery.job_signals as _module

sys.modules[__name__] = _module
