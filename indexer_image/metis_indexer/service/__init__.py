"""The indexer as a running service, its layers top down: `service` (the lifecycle: the parts
made and wired, the tasks, the writer lock, standby) | `following` (the configuration
followed), `answers` (what the API asks), `backups` (the base's backups to its object
store) | `passes` (the pass loop: the index loaded, rebuilt, kept; the changes composed) |
`notebook` (the base's own notes), `model_watch` (the embedding model waited for),
`restoring` (an empty index restored from a backup at start) | `progress` (the phase and
counts a status shows)."""
