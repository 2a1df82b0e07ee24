"""``python -m fault_server``: the same as the ``fault-server`` command."""

from ._cli import main

raise SystemExit(main())
