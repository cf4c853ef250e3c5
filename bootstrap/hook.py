"""Alias of `moonmind_worker.job_hook` (the job hook): importing this module gives that very module object."""

import sys

import moonmind_worker.job_hook as _module

sys.modules[__name__] = _module
