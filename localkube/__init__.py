"""localkube: a real Kubernetes built from upstream sources, for development and tests.

What the package holds (`python3 localkube/cluster.py up|down|status|kubeconfig|reset` drives it):
- cli: the commands and the profiles `kwok` and `full`;
- common: paths, detached processes, waiting, clear errors; pki: certificates and kubeconfigs;
- controlplane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler; kwoknodes: fake nodes;
- the full profile's real node: host (prerequisites, kernel settings, cgroups), network (bridge, CNI,
  iptables), node (containerd, kubelet, kube-proxy; start, stop), addons (CoreDNS, storage), teardown
  (what a node leaves behind, and its removal);
- its N real nodes (PGOP_FULL_NODES): topology (layout, zones, power states), nodenet (a network
  namespace per node on a host bridge), nodes (their start, and poweroff/poweron/partition/heal);
- images: the OCI image builder; hostpath: the storage provisioner (a script the node runs).

What it may import: the standard library and its own modules, nothing else. It runs on a fresh machine
before any virtualenv exists, with whatever python3 the host has, so it never imports pg_operator or a
third-party package; the dependency runs the other way (tests and benchmarks import localkube).
"""
