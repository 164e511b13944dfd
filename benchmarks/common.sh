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
