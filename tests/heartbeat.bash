# Sourced by tests/run.sh (make test) and tests/bench/run.sh (make bench):
#   command 2>&1 | heartbeat LABEL
# copies its input to stdout line by line as it comes and, after 10 s
# without a line (a long test or measurement), prints
# "# LABEL: still running (N s)", again every 10 s: never silent longer.
heartbeat() {
  local label=$1 line rc t0=$SECONDS
  while true; do
    if IFS= read -r -t 10 line; then
      printf '%s\n' "$line"
    else
      rc=$?
      # (a timeout keeps the part of a line read so far in $line)
      [ -n "$line" ] && printf '%s' "$line"
      [ "$rc" -gt 128 ] || break
      [ -n "$line" ] && printf '\n'
      printf '# %s: still running (%d s)\n' "$label" $((SECONDS - t0))
    fi
  done
}
