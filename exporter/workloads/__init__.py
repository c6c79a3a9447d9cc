"""Who uses each GPU: Kubernetes pods (the kubelet's pod-resources API) and Slurm jobs (process cgroups)."""
