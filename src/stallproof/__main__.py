"""``python -m stallproof``: the ``stallproof`` command (``top``, ``diagnose``; see `_cli`)."""

from ._cli import main

raise SystemExit(main())
