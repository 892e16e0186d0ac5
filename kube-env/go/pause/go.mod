// kube-env's pause image: the process that holds a pod's namespaces.
module lamina.io/kube-env/pause

go 1.26.0
