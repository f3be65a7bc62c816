"""The control plane of the local cluster: etcd, kube-apiserver, kube-controller-manager and kube-scheduler
(plane.py), their certificates (pki.py) and rate limits (profiles.py), the API server's way to the kubelets
(kubeletaccess.py), server-side apply (apply.py) and the cluster's Prometheus (prometheus.py, prometheus_build.py)."""
