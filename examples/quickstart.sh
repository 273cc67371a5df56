#!/bin/sh
# podshim's main job: a real pod through podshimd, the CRI runtime. Start the daemon, run a pod and a
# container with podshimctl's crictl-shaped verbs, show the pod's IP and the container's logs, remove
# the pod, stop the daemon, and check that nothing is left.
#
# The daemon keeps its state and sockets in a directory of its own (so it never meets a podshimd this
# machine already runs) and runs inside a network namespace this script makes: the CNI bridge plugin
# gives the pod its address there, so nothing touches this machine's network. Run as root after
# `.ci/install` (it links podshimd, podshimctl and podshim into /usr/local/bin).
set -eu
cd "$(dirname "$0")"
for tool in podshimd podshimctl podshim ip nsenter python3; do
    command -v "$tool" >/dev/null || { echo "quickstart: no $tool on PATH: run .ci/install first" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "quickstart: run me as root (a runtime makes namespaces and cgroups)" >&2; exit 1; }

work=$(mktemp -d /tmp/podshim-quickstart.XXXXXX)
outer="podshim-qs-$(basename "$work" | cut -d. -f2)"
daemon="" pod="" registry=""
cleanup() {
    if [ -n "$pod" ]; then podshimctl rmp "$pod" >/dev/null 2>&1 || true; fi
    if [ -n "$daemon" ]; then kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; fi
    if [ -n "$registry" ]; then kill "$registry" 2>/dev/null || true; wait "$registry" 2>/dev/null || true; fi
    podshim template --stop --runtime-root "$work/run" >/dev/null 2>&1 || true
    ip netns del "$outer" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# Every podshimctl pod verb talks to this daemon's socket.
export PODSHIM_ENDPOINT="unix://$work/run/podshimd.sock"

echo "== a network namespace for the daemon and its CNI plugins, and a CNI config (bridge + host-local)"
ip netns add "$outer"
ip -n "$outer" link set lo up
mkdir -p "$work/net.d"
python3 - "$work" <<'EOF'
import json, sys
work = sys.argv[1]
with open("cni/10-podshim-bridge.conflist") as f:
    conf = json.load(f)
conf["plugins"][0]["ipam"]["dataDir"] = f"{work}/ipam"  # the leases stay in this run's directory
with open(f"{work}/net.d/10-podshim-bridge.conflist", "w") as f:
    json.dump(conf, f)
EOF

echo "== an image to run without a registry: this machine's sh, cat, hostname, ip and sleep, served on loopback"
nsenter --net="/var/run/netns/$outer" -- python3 demo_registry.py >"$work/registry.out" 2>"$work/registry.log" &
registry=$!
tries=0
until [ -s "$work/registry.out" ]; do
    tries=$((tries + 1))
    if [ "$tries" -gt 300 ] || ! kill -0 "$registry" 2>/dev/null; then
        echo "quickstart: the demo registry did not start:" >&2; cat "$work/registry.log" >&2; exit 1
    fi
    sleep 0.1
done
image=$(head -n 1 "$work/registry.out")
echo "$image"
# podshimd pulls from it over plain HTTP; the container config names it instead of busybox.
printf '[registries."%s"]\ninsecure = true\n' "${image%%/*}" >"$work/config.toml"
python3 - "$image" "$work/container-config.json" <<'EOF'
import json, sys
with open("container-config.json") as f:
    conf = json.load(f)
conf["image"]["image"] = sys.argv[1]
with open(sys.argv[2], "w") as f:
    json.dump(conf, f)
EOF

echo "== start podshimd (CRI v1 on $PODSHIM_ENDPOINT)"
nsenter --net="/var/run/netns/$outer" -- podshimd --config "$work/config.toml" --listen "$PODSHIM_ENDPOINT" \
    --runtime-root "$work/run" --state-root "$work/state" --cni-conf-dir "$work/net.d" --log-level warning \
    2>"$work/podshimd.log" &
daemon=$!
tries=0
until podshimctl pods -q >/dev/null 2>&1; do
    tries=$((tries + 1))
    if [ "$tries" -gt 300 ] || ! kill -0 "$daemon" 2>/dev/null; then
        echo "quickstart: podshimd did not start:" >&2; cat "$work/podshimd.log" >&2; exit 1
    fi
    sleep 0.1
done

echo "== runp: a pod from examples/pod-config.json"
pod=$(podshimctl runp pod-config.json)
echo "$pod"

echo "== create + start: a container of that image (pulled first) that shows the pod's hostname and interfaces"
ctr=$(podshimctl create --with-pull "$pod" "$work/container-config.json" pod-config.json)
podshimctl start "$ctr"
# The container runs briefly: wait until it has exited.
tries=0
until podshimctl ps -a --pod "$pod" --state exited -q | grep -q "$ctr"; do
    tries=$((tries + 1)); [ "$tries" -le 200 ] || { echo "quickstart: the container did not exit" >&2; exit 1; }
    sleep 0.05
done

echo "== pods / ps"
podshimctl pods
podshimctl ps -a

field() { podshimctl inspectp --json "$pod" | python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
ip=$(field 'd["network"]["ip"]')
pause_pid=$(field 'd["info"]["pid"]')
netns=$(field 'd["info"]["netns_path"]')
shim_pid=$(field 'd["info"]["shim"]["shim_pid"]')
echo "== the pod's IP: $ip (pause pid $pause_pid, network namespace $(readlink /proc/"$pause_pid"/ns/net) pinned at $netns)"

echo "== logs: what the container printed (hostname, then its interfaces: lo and the pod's eth0 with $ip)"
podshimctl logs "$ctr"
podshimctl logs "$ctr" | grep -q "inet $ip/" || { echo "quickstart: the container did not see the pod's IP" >&2; exit 1; }

echo "== stopp + rmp"
podshimctl stopp "$pod"
podshimctl rmp "$pod"
pod=""

echo "== stop podshimd, and the shim template it forked the pod's shim from"
kill "$daemon"
wait "$daemon" || { echo "quickstart: podshimd did not stop cleanly:" >&2; cat "$work/podshimd.log" >&2; exit 1; }
daemon=""
podshim template --stop --runtime-root "$work/run" | python3 -c 'import json,sys; print("template", json.load(sys.stdin)["pid"], "stopped")'

echo "== nothing left behind:"
left=0
[ -e "$netns" ] && { echo "netns $netns is still there"; left=1; }
[ -d "/proc/$pause_pid" ] && grep -q catatonit "/proc/$pause_pid/cmdline" 2>/dev/null && { echo "pause $pause_pid still runs"; left=1; }
[ -d "/proc/$shim_pid" ] && grep -q podshim "/proc/$shim_pid/cmdline" 2>/dev/null && { echo "shim $shim_pid still runs"; left=1; }
[ -e "$work/run/podshimd.sock" ] && { echo "the daemon's socket is still there"; left=1; }
[ -n "$(find "$work/state/pods" -name '*.json' 2>/dev/null)" ] && { echo "pod records are left"; left=1; }
[ -n "$(ls -A "$work/state/sandboxes/k8s.io" 2>/dev/null)" ] && { echo "sandbox bundles are left"; left=1; }
[ -n "$(ls -A "$work/run/s" 2>/dev/null)" ] && { echo "shim sockets are left"; left=1; }
[ -e "$work/run/template.sock" ] && { echo "the shim template's socket is left"; left=1; }
[ "$left" = 0 ] && echo "no pod, no pause, no shim, no netns, no socket, no record."
exit "$left"
