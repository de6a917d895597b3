"""The OCI image builder: images without a registry or a Docker daemon, imported into the node's containerd.

- spec: image.json, validated, and finding the spec that builds a reference;
- builder: the cached build (debootstrap rootfs via rootfs, recipe, OCI tar via oci);
- containerd: importing a built image into the running node's containerd;
- cli: `python3 localkube/images/build.py …` (build.py is the script that runs it).

Every .py file of this directory is part of each image's cache key (builder.input_hash). Like the rest of
localkube: standard library and localkube only, never pg_operator.
"""
