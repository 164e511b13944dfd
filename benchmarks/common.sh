# Shell helpers shared by the benchmark scripts (sourced, not run).

# An error naming the script, and exit 1.
die() { echo "$(basename "$0" .sh): error: $*" >&2; exit 1; }
# The script's header comment (from line 2 to `set -euo`), for --help.
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
# Fails unless flag $1 has a non-empty value $2.
need_value() { { [ "$#" -ge 2 ] && [ -n "$2" ]; } || die "$1 needs a value (see --help)"; }

load1() { cut -d' ' -f1 /proc/loadavg; }

# "busy total" jiffies of all CPUs so far (first line of /proc/stat; iowait counts as idle).
cpu_jiffies() {
  local _cpu user nice system idle iowait irq softirq steal _rest
  read -r _cpu user nice system idle iowait irq softirq steal _rest </proc/stat
  local busy=$((user + nice + system + irq + softirq + steal))
  echo "$busy $((busy + idle + iowait))"
}

# Whole-machine CPU utilisation in % between two cpu_jiffies snapshots.
cpu_percent() {
  local b0 t0 b1 t1
  read -r b0 t0 <<<"$1"; read -r b1 t1 <<<"$2"
  if [ "$t1" -gt "$t0" ]; then echo $((100 * (b1 - b0) / (t1 - t0))); else echo 0; fi
}

# Waits up to $1 seconds until the machine is idle (under 15% of all CPUs busy over 5 s).
wait_quiet() {
  local limit="$1" waited=0 before
  while [ "$waited" -lt "$limit" ]; do
    before="$(cpu_jiffies)"; sleep 5; waited=$((waited + 5))
    [ "$(cpu_percent "$before" "$(cpu_jiffies)")" -ge 15 ] || return 0
  done
}

# Identity of a binary, to notice a rebuild under a running benchmark.
fingerprint() { stat -L -c '%Y %s %i' "$1"; }

# Two "nodes" for the network benchmarks (needs root): network namespaces NS0 and NS1 joined by a veth pair DEV0 and
# DEV1, node 0 at $2.1 and node 1 at $2.2 (a /24: e.g. 10.78.0), each with its loopback up. $1 (two letters) tells
# one script's names from another's; the shell's pid, one run's from another's. netns_pair_delete removes them.
netns_pair_make() {
  local tag="$1" net="$2" n ns dev
  NS0="hetseq-${tag}0-$$" NS1="hetseq-${tag}1-$$" DEV0="h${tag}0-$$" DEV1="h${tag}1-$$"
  ip netns add "$NS0"
  ip netns add "$NS1"
  ip link add "$DEV0" type veth peer name "$DEV1"
  ip link set "$DEV0" netns "$NS0"
  ip link set "$DEV1" netns "$NS1"
  ip -n "$NS0" addr add "$net.1/24" dev "$DEV0"
  ip -n "$NS1" addr add "$net.2/24" dev "$DEV1"
  for n in 0 1; do
    ns="NS$n" dev="DEV$n"
    ip -n "${!ns}" link set "${!dev}" up
    ip -n "${!ns}" link set lo up
  done
}
netns_pair_delete() {
  ip netns del "$NS0" 2>/dev/null || true
  ip netns del "$NS1" 2>/dev/null || true
}

# Waits for the two processes in PIDS (node 0's, then node 1's) until $1 seconds from now: when one is still
# running then, or exits with a status other than 0, kills both, prints the end of its stderr (the file that
# printf "$3" NODE names) and dies, naming the run $2. Empties PIDS when both succeeded.
wait_node_pair() {
  local timeout="$1" label="$2" err_pattern="$3" r rc=0 deadline p
  deadline=$(($(date +%s) + timeout))
  for r in 0 1; do
    while kill -0 "${PIDS[$r]}" 2>/dev/null; do
      if [ "$(date +%s)" -ge "$deadline" ]; then
        for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
        # shellcheck disable=SC2059
        tail -n 20 "$(printf "$err_pattern" "$r")" >&2
        die "$label: node $r still running after --timeout $timeout s; killed both"
      fi
      sleep 0.2
    done
    wait "${PIDS[$r]}" || rc=$?
    if [ "$rc" -ne 0 ]; then
      for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
      # shellcheck disable=SC2059
      tail -n 20 "$(printf "$err_pattern" "$r")" >&2
      die "$label: node $r exited with status $rc (the end of its stderr is above)"
    fi
  done
  PIDS=()
}
