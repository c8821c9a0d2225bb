"""`python -m metis_indexer.localmodel`: the same as `metis models`."""

from metis_indexer.localmodel.server import main

raise SystemExit(main())
