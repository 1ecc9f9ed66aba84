"""``python -m hpctrain`` is the ``hpctrain`` command."""

import sys

from hpctrain.cli.main import main

sys.exit(main())
