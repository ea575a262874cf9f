# Sourced by tests/run.sh (make test) and tests/bench/run.sh (make bench):
#   command 2>&1 | heartbeat LABEL
# copies its input to stdout line by line as it comes and, after 10 s
# (HEARTBEAT_SECONDS) without a line (a long test or measurement), prints
# "# LABEL: still running (N s)", again after each such interval: never
# silent longer.
# A line is never cut: what arrives of it before a heartbeat is held until
# its end (a TAP line cut in two would not be counted).
heartbeat() {
  local label=$1 line part="" rc t0=$SECONDS every=${HEARTBEAT_SECONDS:-10}
  while true; do
    if IFS= read -r -t "$every" line; then
      printf '%s\n' "$part$line"
      part=""
    else
      rc=$?
      # (a timeout or the end of input keeps the part read so far in $line)
      part=$part$line
      if [ "$rc" -le 128 ]; then # the end: an unterminated last line as it is
        [ -n "$part" ] && printf '%s' "$part"
        break
      fi
      printf '# %s: still running (%d s)\n' "$label" $((SECONDS - t0))
    fi
  done
}
