"""The KnowledgeBase resource's typed home: its identity, its spec, its status, and the
CRD generated from them (`make crd` writes crds/knowledgebase.yaml)."""
