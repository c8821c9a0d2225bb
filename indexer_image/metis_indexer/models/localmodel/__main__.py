"""`python -m metis_indexer.models.localmodel`: the same as `metis models`."""

from metis_indexer.models.localmodel.server import main

raise SystemExit(main())
