"""The storage provisioner of the local cluster's `standard` StorageClass: provisioner.py, a standalone
script (standard library only) that the node runs as a process of its own."""
