"""``python -m epochsync_dev VERB``: the development tools (:mod:`epochsync_dev.cli`)."""

import sys

from epochsync_dev.cli import main

sys.exit(main())
