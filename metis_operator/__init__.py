"""Metis operator: reconciles KnowledgeBase resources into running, observable indexers."""
