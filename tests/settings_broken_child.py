"""The test settings, except that a process-pool child cannot load them (a broken deploy)."""

import os

from tests.settings import *  # noqa: F403

if os.environ.get("ALKSTORE_CHILD_FDS"):
    raise RuntimeError("this deploy cannot start its process-pool children")
