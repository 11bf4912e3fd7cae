"""``python -m sparsefinder …``: the same CLI as the ``sparsefinder`` script."""

from sparsefinder.cli import main

raise SystemExit(main())
