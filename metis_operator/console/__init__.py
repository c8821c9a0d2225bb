"""The cluster console (`metis-console`): every knowledge base the console may see,
live, a page per base, and the Search page over one or several of them (Compare).

It reads the cluster with the operator's client (metis_operator/kube.py), a base's
status through the models the operator writes it with (metis_operator/api/status_types.py),
and serves its Bases pages (views.py, pages.py) beside the Search page `metis serve`
shows for its one base (metis_indexer.console).
"""
