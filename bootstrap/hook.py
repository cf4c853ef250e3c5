"""Alias of `moonmind_worker.jobs.hook` (the job hook): importing this module gives that very module object."""

import sys

import moonmind_worker.jobs.hook as _module

sys.modules[__name__] = _module
