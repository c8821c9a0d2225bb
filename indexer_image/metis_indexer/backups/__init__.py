"""A base's backups in S3-compatible object storage: its index and notes copied whole,
checked by their own checksums, and restored into an empty index without the model.

`manifest` decides (what a backup's objects are called, whether a downloaded object is
the one its manifest names, what a restore embeds again); `copies` makes and unpacks the
local files (the index copied consistently, the notes as a tarball); `objects` talks to
the object store (boto3). The service runs them (`service.backups`, `service.restoring`).
"""
