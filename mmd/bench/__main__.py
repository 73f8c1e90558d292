"""``python -m mmd.bench [docs/bench.md]``: rewrite the column tables of docs/bench.md from :mod:`.rows`
(``-m mmd.bench.rows`` would import the module twice: the package imports it first)."""

from .rows import main

raise SystemExit(main())
