# Sourced by kube-env/up with KUBE_ENV_KUBELET=1 (it uses up's variables and
# helpers: dir, logs, pki, bin, lamina, start, wait_for, fail, say, cert,
# kubeconfig, kubectl). Node 1 (kube-env-node) becomes a real node: Debian's
# containerd and runc with a CNI bridge, a kubelet and kube-scheduler from
# the pinned k8s.io/kubernetes module, images made here from files (no
# registry), and Lamina's node plugin registered with the kubelet.
# docs/kube-env.md says what each setting is for; kube-env/down undoes it.
#
# One such environment per machine: the kubelet's cgroups (kubepods), its
# port 10250 and the bridges are the machine's.

kubelet_ip=$node_ip           # the node's address (kube-env/up; the kubelet refuses a loopback one)
pod_subnet=10.213.128.0/24     # the CNI bridge's pods
node_bridge=lamina-kenv        # holds the node's address
cni_bridge=lamina-kenv-cni     # the pods' bridge (made by the CNI bridge plugin)
node=kube-env-node

for tool in containerd containerd-shim-runc-v2 runc ctr umoci busybox ip; do
  command -v "$tool" >/dev/null || fail kubelet "$tool is not installed (apt-get install containerd runc umoci busybox-static iproute2)"
done
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] \
  || fail kubelet "the CNI plugins are not installed (apt-get install containernetworking-plugins)"
# The kubelet's root directory: DIR/kubelet, or KUBE_ENV_KUBELET_ROOT
# (kube-env/storage-e2e/run asks for /var/lib/kubelet, which Kubernetes' storage tests
# look in on the host). A root that has mounts or pods, or a running
# kubelet, is refused (below): it may be a real kubelet's. (Every kubelet
# makes /var/lib/kubelet/device-plugins, whatever its root.)
kubelet_root=${KUBE_ENV_KUBELET_ROOT:-$dir/kubelet}
case "$kubelet_root" in /*) ;; *) fail kubelet "KUBE_ENV_KUBELET_ROOT must be an absolute path, not $kubelet_root" ;; esac
# The node's bridge is the machine's lock on its one kubelet environment:
# making it is atomic, and kube-env/down deletes it last, once its kubelet,
# pods, mounts and cgroups are gone. Another environment's bridge is
# waited for up to KUBE_ENV_NODE_WAIT seconds (default 0: refused at once),
# so that CI can run Kubernetes' storage tests beside the kube-e2e
# scenarios, whose environments then take the node in turn.
node_wait=${KUBE_ENV_NODE_WAIT:-0}
case "$node_wait" in ''|*[!0-9]*) fail kubelet "KUBE_ENV_NODE_WAIT must be a number of seconds, not $node_wait" ;; esac
node_deadline=$((SECONDS + node_wait))
waited=0
until ip link add "$node_bridge" type bridge 2>/dev/null; do
  ip link show "$node_bridge" >/dev/null 2>&1 || fail kubelet "ip link add $node_bridge failed"
  [ "$SECONDS" -lt "$node_deadline" ] \
    || fail kubelet "the link $node_bridge exists: another kube-env with a kubelet runs on this machine (kube-env/down it first)$([ "$node_wait" = 0 ] || echo "; waited $node_wait s for it")"
  [ "$waited" = 1 ] || say "another kube-env has the machine's node ($node_bridge): waiting up to $node_wait s"
  waited=1
  sleep 2
done
[ "$waited" = 0 ] || say "the machine's node is free: taking it"
if [ "$kubelet_root" != "$dir/kubelet" ]; then
  if findmnt -rn -o TARGET | awk -v r="$kubelet_root" '$0 == r || index($0, r "/") == 1' | grep -q . \
     || [ -n "$(ls -A "$kubelet_root/pods" 2>/dev/null)" ] \
     || pgrep -x kubelet >/dev/null; then
    ip link del "$node_bridge" 2>/dev/null
    fail kubelet "$kubelet_root has mounts or pods, or a kubelet runs: another kubelet's root, or one a kube-env left (kube-env/down its directory)"
  fi
fi
# The node is this environment's now. kube-env/down reads these to know
# there is a node to take apart (and a bridge to free), with which
# kubectl, and where the kubelet's root was.
echo "$bin" > "$dir/kubelet.on"
echo "$kubelet_root" > "$dir/kubelet.root"

# ---- the node's address, on a bridge of its own
ip addr add "$kubelet_ip/32" dev "$node_bridge" && ip link set "$node_bridge" up \
  || fail kubelet "cannot give $node_bridge the address $kubelet_ip"

# ---- images, from files: the pause image (kube-env/go/pause, built by
# kube-env/build) and busybox (Debian's busybox-static), under the names
# Kubernetes' e2e framework asks for (test/utils/image/manifest.go)
pause_image=registry.k8s.io/pause:3.10.2
busybox_image=registry.k8s.io/e2e-test-images/busybox:1.37.0-2
images=$dir/images
mkdir -p "$images"
# image NAME:TAG ROOTFS-SETUP-FUNCTION CONFIG-ARGS...: an OCI image of one
# layer, made with umoci and imported into containerd's k8s.io namespace
# (ctr names it NAME plus the layout's tag)
image() {
  local ref=$1 setup=$2; shift 2
  local name=${ref%:*} tag=${ref##*:}
  local layout=$images/${name##*/}
  rm -rf "$layout" "$layout.bundle"
  {
    umoci init --layout "$layout" &&
    umoci new --image "$layout:$tag" &&
    umoci unpack --image "$layout:$tag" "$layout.bundle" &&
    "$setup" "$layout.bundle/rootfs" &&
    umoci repack --image "$layout:$tag" "$layout.bundle" &&
    umoci config --image "$layout:$tag" "$@" &&
    (cd "$layout" && tar -cf "$layout.tar" .) &&
    ctr --address "$ctrd/containerd.sock" -n k8s.io images import --base-name "$name" "$layout.tar"
  } >> "$logs/images.log" 2>&1 || fail images "making and importing $ref failed"
  rm -rf "$layout" "$layout.bundle" "$layout.tar"
}
pause_rootfs() { cp "$bin/pause" "$1/pause"; }
busybox_rootfs() {
  mkdir -p "$1/bin" "$1/etc" "$1/tmp" && cp "$(command -v busybox)" "$1/bin/busybox" &&
  for applet in $(busybox --list); do [ "$applet" = busybox ] || ln -sf busybox "$1/bin/$applet"; done &&
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$1/etc/passwd" &&
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$1/etc/group"
}

# The host's GNU dd, with the libraries it links, over busybox's: the
# storage suite's multiVolume specs write with `dd oflag=nocache`, which
# busybox's dd refuses, in an image of its own (glibc-dns-testing, Debian's
# tools upstream). The shell is the host's dash too: Debian's busybox shell
# runs its own applets before any file of the same name.
glibc_rootfs() {
  busybox_rootfs "$1" && rm "$1/bin/dd" "$1/bin/sh" &&
  cp /usr/bin/dd "$1/bin/dd" && cp /usr/bin/dash "$1/bin/sh" &&
  for lib in $(ldd /usr/bin/dd /usr/bin/dash | awk '/^\t/ { for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' | sort -u); do
    mkdir -p "$1$(dirname "$lib")" && cp -L "$lib" "$1$lib" || return 1
  done
}

# ---- containerd, its own root, state and socket; the CRI plugin as the
# kubelet needs it here
ctrd=$dir/containerd
mkdir -p "$ctrd" "$dir/cni/net.d" "$dir/cni/ipam"
cat > "$ctrd/config.toml" <<EOF
version = 2
root = "$ctrd/root"
state = "$ctrd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$ctrd/containerd.sock"
[ttrpc]
  address = "$ctrd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$ctrd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  # root here lacks CAP_SYS_RESOURCE: without this runc fails every
  # sandbox ("can't get final child's PID from pipe")
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
EOF
# No masquerading and no iptables rules: pods reach the node (its address
# and, through kube-proxy with KUBE_ENV_NODE_POD=1, the Services), nothing
# else: no default route.
cat > "$dir/cni/net.d/10-kube-env.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "kube-env", "plugins": [
  {"type": "bridge", "bridge": "$cni_bridge", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$pod_subnet"}]], "dataDir": "$dir/cni/ipam",
            "routes": [{"dst": "$kubelet_ip/32"}, {"dst": "10.96.0.0/24"}]}}]}
EOF
start containerd containerd --config "$ctrd/config.toml"
wait_for containerd 30 ctr --address "$ctrd/containerd.sock" version
image "$pause_image" pause_rootfs --config.entrypoint /pause --config.user 65535:65535
image "$busybox_image" busybox_rootfs --config.cmd /bin/sh
# Kubernetes' storage e2e suite (kube-env/storage-e2e/run sets KUBE_ENV_E2E_BIN to the
# directory holding agnhost, built from the pinned module): agnhost is
# busybox plus the agnhost program, as upstream's image is a shell and tools
# plus it; the suite runs only shell commands in its "nginx" image
# (testsuites/volumes.go), so that name is busybox alone, and in its
# "glibc-dns-testing" one (the multiVolume specs: sleep, GNU dd,
# sha256sum), which is busybox with GNU dd and dash (glibc_rootfs). The
# suite's host commands enter PID 1's mount namespace, which this VM's PID 1 refuses
# even to root: agnhost's nsenter enters the kubelet's (the host's mount
# namespace all the same) when PID 1's cannot be opened.
if [ -n "${KUBE_ENV_E2E_BIN:-}" ]; then
  agnhost_rootfs() {
    busybox_rootfs "$1" && cp "$KUBE_ENV_E2E_BIN/agnhost" "$1/agnhost" && rm "$1/bin/nsenter" &&
    cat > "$1/bin/nsenter" <<'NSENTER' && chmod 755 "$1/bin/nsenter"
#!/bin/busybox sh
# kube-env's agnhost: PID 1's mount namespace when it can be entered, else
# the kubelet's (kube-env/kubelet.sh says why)
n=$#
for a in "$@"; do
  if [ "$a" = --mount=/rootfs/proc/1/ns/mnt ] && ! /bin/busybox nsenter "$a" -- true 2>/dev/null; then
    for p in /rootfs/proc/[0-9]*; do
      [ "$(/bin/busybox cat "$p/comm" 2>/dev/null)" = kubelet ] && { a="--mount=$p/ns/mnt"; break; }
    done
  fi
  set -- "$@" "$a"
done
shift "$n"
exec /bin/busybox nsenter "$@"
NSENTER
  }
  image registry.k8s.io/e2e-test-images/agnhost:2.66.1 agnhost_rootfs --config.entrypoint /agnhost --config.cmd pause
  image registry.k8s.io/e2e-test-images/nginx:1.27.0-2 busybox_rootfs --config.cmd /bin/sh
  image registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1 glibc_rootfs --config.cmd /bin/sh
fi

# ---- the kubelet: a client certificate of the node's identity (the Node
# authorizer and NodeRestriction hold it to its node), its own root
# directory, the cgroupfs driver on this host's cgroup v1
cert kubelet "/O=system:nodes/CN=system:node:$node" "$pki/client.ext"
kubeconfig "$dir/kubelet.kubeconfig" "client-certificate: $pki/kubelet.crt" "client-key: $pki/kubelet.key"
mkdir -p "$kubelet_root"
cat > "$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $kubelet_ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $p_kubelet_healthz
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$ctrd/containerd.sock
cgroupDriver: cgroupfs
# this host mounts cgroup v1, has swap on, and kube-env adds no iptables rules
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
resolvConf: ""
serializeImagePulls: false
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
# no image garbage collection: the images are made here, and no registry
# gives them back (at the default 85% of a shared disk the kubelet removed
# the pause image, and every new pod failed)
imageGCHighThresholdPercent: 100
# a running pod's volumes grown online are grown on the node at its next
# sync: every 10 s here, not the default minute
syncFrequency: 10s
volumePluginDir: $kubelet_root/volume-plugins
EOF
start kubelet "$bin/kubelet" --config "$dir/kubelet.yaml" --kubeconfig "$dir/kubelet.kubeconfig" \
  --root-dir "$kubelet_root" --hostname-override "$node" --node-ip "$kubelet_ip" \
  --node-labels "topology.lamina.io/node=$node,lamina.io/storage=true" --v=2
node_ready() {
  [ "$(kubectl get node "$node" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
wait_for kubelet 90 node_ready

# ---- kube-scheduler, as itself
cert scheduler "/CN=system:kube-scheduler" "$pki/client.ext"
kubeconfig "$dir/scheduler.kubeconfig" "client-certificate: $pki/scheduler.crt" "client-key: $pki/scheduler.key"
start kube-scheduler "$bin/kube-scheduler" --kubeconfig "$dir/scheduler.kubeconfig" \
  --authentication-kubeconfig "$dir/scheduler.kubeconfig" --authorization-kubeconfig "$dir/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$p_sched" --leader-elect=false
wait_for kube-scheduler 60 curl -skf "https://127.0.0.1:$p_sched/healthz"

csinode_has_driver() {
  [ "$(kubectl get csinode "$node" -o 'jsonpath={.spec.drivers[?(@.name=="lamina.csi.io")].nodeID}' 2>/dev/null)" = "$node" ]
}
if [ "$node_pod" = 0 ]; then
# ---- Lamina's node plugin, registered with the kubelet by kube-env's
# registrar (kube-env/go/kubernetes/registrar, standing in for
# node-driver-registrar, which the Go module proxy does not serve): the
# kubelet adds the driver to the CSINode and labels the Node with its
# topology
csi_socket=$kubelet_root/plugins/lamina.csi.io/csi.sock
start lamina-csi-node "$lamina" csi --mode node --node-id "$node" --endpoint "unix://$csi_socket" \
  --data-dir "$dir/lamina" --state-dir "$dir/csi-node"
wait_for lamina-csi-node 30 test -S "$csi_socket"
start registrar "$bin/registrar" --driver-name lamina.csi.io --kubelet-endpoint "$csi_socket" \
  --registration-socket "$kubelet_root/plugins_registry/lamina.csi.io-reg.sock"
wait_for registrar 60 csinode_has_driver
else
# ---- KUBE_ENV_NODE_POD=1: kube-proxy (iptables mode), so that pods reach
# the Services (kubernetes, the API server; lamina-api, the daemon) as in a
# cluster. Its rules match only the Service range (10.96.0.0/24) and the
# node's address; kube-env/down removes them (kube-proxy --cleanup).
cert kube-proxy "/CN=system:kube-proxy" "$pki/client.ext"
kubeconfig "$dir/kube-proxy.kubeconfig" "client-certificate: $pki/kube-proxy.crt" "client-key: $pki/kube-proxy.key"
cat > "$dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $dir/kube-proxy.kubeconfig}
hostnameOverride: $node
mode: iptables
clusterCIDR: $pod_subnet
nodePortAddresses: [$kubelet_ip/32]
metricsBindAddress: 127.0.0.1:$p_proxy_metrics
healthzBindAddress: 127.0.0.1:$p_proxy_healthz
# the machine's conntrack table and timeouts, and its route_localnet: left
# as they are (0 leaves a setting alone)
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false}
EOF
echo "$bin" > "$dir/kube-proxy.on"
start kube-proxy "$bin/kube-proxy" --config "$dir/kube-proxy.yaml" --v=2
# its rule for the Service kubernetes: the API server's endpoint is synced
service_rules() { iptables -w -t nat -S KUBE-SERVICES 2>/dev/null | grep -q -- "-d 10.96.0.1/32"; }
wait_for kube-proxy 60 service_rules

# ---- KUBE_ENV_NODE_POD=1: the chart's node pods, from the image. Node 1's
# daemon, node plugin and keeper are not host processes: the chart's node
# and keeper DaemonSets (rendered by helm; its controller and operator
# Deployments follow, controller_pod and operator_pods below) run them in
# pods from LAMINA_IMAGE (an OCI archive, deploy/image/build), as a
# cluster runs them. The registrar container runs kube-env's registrar
# (node-driver-registrar's flags) from an image made here. The daemon's
# data directory is DIR/lamina, made a shared mount so that the FUSE mounts
# the daemon makes in its container reach the host and the plugin
# (mountPropagation: Bidirectional), as the kubelet does with its root.
lamina_tag=$(python3 -c '
import json, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    index = next(m for m in t.getmembers() if m.name.lstrip("./") == "index.json")
    print(json.load(t.extractfile(index))["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])' "$LAMINA_IMAGE") \
  || fail images "$LAMINA_IMAGE has no tagged image (deploy/image/build makes one)"
ctr --address "$ctrd/containerd.sock" -n k8s.io images import --base-name docker.io/library/lamina \
  "$LAMINA_IMAGE" >> "$logs/images.log" 2>&1 || fail images "importing $LAMINA_IMAGE failed"
registrar_image=lamina.io/kube-env/registrar:dev
registrar_rootfs() { cp "$bin/registrar" "$1/registrar"; }
image "$registrar_image" registrar_rootfs --config.entrypoint /registrar
# The controller pod's sidecars, under the chart's image names: the same
# releases (kube-env/go pins them at the chart's tags), built here, each
# image one static binary.
sidecar_rootfs() { cp "$bin/$sidecar" "$1/$sidecar"; }
for s in provisioner snapshotter resizer; do
  ref=$(awk -v k="$s:" '$1 == k {getline; if ($1 == "image:") print $2; exit}' "$repo/deploy/helm/lamina/values.yaml")
  [ -n "$ref" ] || fail images "the chart's values.yaml names no sidecars.$s.image"
  sidecar=${ref##*/} sidecar=${sidecar%%:*}
  [ -x "$bin/$sidecar" ] || fail images "kube-env/build made no $sidecar for $ref"
  image "$ref" sidecar_rootfs --config.entrypoint "/$sidecar"
done
mkdir -p "$dir/lamina"
mount --bind "$dir/lamina" "$dir/lamina" && mount --make-rshared "$dir/lamina" \
  || fail node-pod "cannot make $dir/lamina a shared mount"
(cd "$repo/deploy/tools" && go build -o "$dir/helm" helm.sh/helm/v3/cmd/helm) > "$logs/helm.log" 2>&1 \
  || fail helm "building helm (deploy/tools) failed"
# The token Secret the daemon reads its bearer token from (the chart's
# token.create writes the same); its endpoint is added once the pod has
# an address.
kubectl -n lamina create secret generic lamina-token --from-literal=token="$lamina_token" >> "$logs/rbac.log" 2>&1 \
  && kubectl -n lamina label secret lamina-token "lamina.io/node=$node" >> "$logs/rbac.log" 2>&1 \
  || fail rbac "creating the node Secret lamina-token failed"
"$dir/helm" template lamina "$repo/deploy/helm/lamina" --namespace lamina \
  --set image.repository=lamina --set image.tag="$lamina_tag" --set image.pullPolicy=Never \
  --set sidecars.pullPolicy=Never --set sidecars.nodeDriverRegistrar.image="$registrar_image" \
  --set dataDir="$dir/lamina" --set kubeletDir="$kubelet_root" --set keeper.socketDir="$dir/keeper" \
  --set storageNode="$node" > "$dir/chart.yaml" 2> "$logs/helm.log" || fail helm "helm template failed"
# chart_docs KIND COMPONENT...: the chart's objects of that kind and those
# components (app.kubernetes.io/component), one of each
chart_docs() {
  python3 - "$dir/chart.yaml" "$@" <<'PY'
import sys
docs = open(sys.argv[1]).read().split("\n---\n")
kind, comps = sys.argv[2], sys.argv[3:]
keep = [d for d in docs if f"\nkind: {kind}\n" in "\n" + d
        and any(f"app.kubernetes.io/component: {c}\n" in d for c in comps)]
if len(keep) != len(comps):
    sys.exit(1)
print("\n---\n".join(keep))
PY
}
chart_docs DaemonSet node keeper > "$dir/node-pods.yaml" || fail helm "no node or keeper DaemonSet in the chart"
chart_docs Service node > "$dir/api-service.yaml" || fail helm "no Service of the node pods in the chart"
chart_docs Deployment controller > "$dir/controller-pod.yaml" || fail helm "no controller Deployment in the chart"
chart_docs Deployment operator > "$dir/operator-pod.yaml" || fail helm "no operator Deployment in the chart"
kubectl apply -f "$dir/node-pods.yaml" > "$logs/node-pods.log" 2>&1 || fail node-pods "kubectl apply of the node DaemonSets failed"
node_pod_ready() {
  kubectl -n lamina wait --for condition=Ready pod -l app.kubernetes.io/component=node --timeout 5s
}
# node_pods_wait SECONDS CMD...: wait_for for the pods, whose state and
# containers' logs land in logs/node-pods.log if CMD does not succeed in time
node_pods_wait() {
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      { kubectl -n lamina describe pods
        for p in $(kubectl -n lamina get pods -o name); do
          kubectl -n lamina logs "$p" --all-containers --prefix --tail 40
        done; } >> "$logs/node-pods.log" 2>&1
      fail node-pods "not ready within the time (waiting for: $*)"
    fi
    sleep 0.5
  done
}
node_pods_wait 180 node_pod_ready
node_pods_wait 60 csinode_has_driver
pod_ip=$(kubectl -n lamina get pod -l app.kubernetes.io/component=node -o 'jsonpath={.items[0].status.podIP}')
api_port=$(awk '$1 == "apiPort:" {print $2}' "$repo/deploy/helm/lamina/values.yaml")
lamina_endpoint=http://$pod_ip:$api_port
node_pods_wait 30 "$lamina" --endpoint "$lamina_endpoint" --token "$lamina_token" status
kubectl -n lamina patch secret lamina-token -p "{\"stringData\": {\"endpoint\": \"$lamina_endpoint\"}}" \
  >> "$logs/rbac.log" 2>&1 || fail rbac "adding the endpoint to the node Secret failed"
fi

# controller_pod (KUBE_ENV_NODE_POD=1, called by kube-env/up once the node
# Secret names the daemon): the chart's controller Deployment, the CSI
# driver's controller side and its sidecars in one pod, and the Service it
# reaches the daemon through. kube-env has no cluster DNS: the pod's
# /etc/hosts names the Service's address (hostAliases), the one thing
# changed in what the chart renders; kube-proxy does the rest.
controller_pod() {
  kubectl apply -f "$dir/api-service.yaml" > "$logs/controller-pod.log" 2>&1 \
    || fail controller-pod "kubectl apply of the chart's Service failed"
  local api_ip api_host
  api_ip=$(kubectl -n lamina get -f "$dir/api-service.yaml" -o 'jsonpath={.spec.clusterIP}')
  api_host=$(sed -n 's|.*--lamina-endpoint=http://\([^:/]*\).*|\1|p' "$dir/controller-pod.yaml" | head -n 1)
  [ -n "$api_ip" ] && [ -n "$api_host" ] || fail controller-pod "no Service address ($api_ip) or daemon host name ($api_host)"
  kubectl patch --local -f "$dir/controller-pod.yaml" --type merge -o yaml \
    -p "{\"spec\":{\"template\":{\"spec\":{\"hostAliases\":[{\"ip\":\"$api_ip\",\"hostnames\":[\"$api_host\"]}]}}}}" \
    > "$dir/controller-pod.applied.yaml" 2>> "$logs/controller-pod.log" \
    && kubectl apply -f "$dir/controller-pod.applied.yaml" >> "$logs/controller-pod.log" 2>&1 \
    || fail controller-pod "kubectl apply of the chart's controller Deployment failed"
  controller_ready() {
    kubectl -n lamina wait --for condition=Ready pod -l app.kubernetes.io/component=controller --timeout 5s
  }
  provisioner_started() {
    kubectl -n lamina logs deployment/lamina-controller -c csi-provisioner | grep -q "Started provisioner controller"
  }
  node_pods_wait 120 controller_ready
  node_pods_wait 60 lease_held lamina lamina-csi-io
  # its informers synced (a verb missing from the chart's RBAC stops it here)
  node_pods_wait 60 provisioner_started
  node_pods_wait 60 lease_held lamina external-snapshotter-leader-lamina-csi-io
  node_pods_wait 60 lease_held lamina external-resizer-lamina-csi-io
  # The chart's RBAC is enough for what the sidecars did so far.
  local c
  for c in csi-provisioner csi-snapshotter csi-resizer; do
    kubectl -n lamina logs deployment/lamina-controller -c "$c" > "$logs/$c.log" 2>&1
    grep -q forbidden "$logs/$c.log" && fail "$c" "forbidden by the chart's RBAC"
  done
  return 0
}

# operator_pods (KUBE_ENV_NODE_POD=1, called by kube-env/up after Lamina's
# CRDs and the operator's RBAC): the chart's operator Deployment, Lamina's
# own controllers (`lamina controller`, its replicas one active by the
# Lease lamina-operator), which reach the daemon at the node Secret's
# endpoint.
operator_pods() {
  kubectl apply -f "$dir/operator-pod.yaml" > "$logs/operator-pods.log" 2>&1 \
    || fail operator-pods "kubectl apply of the chart's operator Deployment failed"
  operators_ready() {
    kubectl -n lamina rollout status deployment/lamina-operator --timeout 5s
  }
  node_pods_wait 120 operators_ready
  node_pods_wait 60 lease_held lamina lamina-operator
}
