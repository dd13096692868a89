"""``python -m kinesumer.cli``: the ``kinesumer`` command."""

import sys

from . import main

sys.exit(main())
