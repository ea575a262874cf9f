# Shared by tests/mpi/*.sh: run one MPI job (the Open MPI settings of the README) and
# turn the ranks' "@@ rank ok|fail name" lines into TAP lines.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl=self,vader OMPI_MCA_plm=isolated
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export LUA_PATH="$ROOT/lua/?.lua;$ROOT/lua/?/init.lua;$ROOT/tests/?.lua;;"
# Scripts run under the CLI host when it is built (MPI finalized once and
# the job aborted on a Lua error by the host), else under plain luajit.
if [ -x "$ROOT/build/muon" ]; then RUN="build/muon run"; else RUN="luajit"; fi
TAPN=0
FAILS=0

tap() { # ok|fail text
  TAPN=$((TAPN + 1))
  if [ "$1" = ok ]; then echo "ok $TAPN - $2"; else echo "not ok $TAPN - $2"; FAILS=$((FAILS + 1)); fi
}

# mpi_run np command...: the command under mpirun at np ranks in $ROOT (no
# stdin, the job killed after 120 s), stdout and stderr on stdout; mpirun's
# exit status.
mpi_run() {
  local np=$1; shift
  (cd "$ROOT" && timeout -k 10 150 mpirun --timeout 120 --stdin none -np "$np" "$@" </dev/null 2>&1)
}

# mpi_case label np command...: every rank must report ok for each name.
mpi_case() {
  local label=$1 np=$2; shift 2
  local out rc
  out=$(mpi_run "$np" "$@")
  rc=$?
  local names
  names=$(printf '%s\n' "$out" | awk '/^@@ /{print $4}' | awk '!seen[$0]++')
  if [ -z "$names" ]; then
    tap fail "$label: no results (exit $rc)"
    printf '%s\n' "$out" | tail -20 | sed 's/^/# /'
    return
  fi
  local n
  for n in $names; do
    local oks fails
    oks=$(printf '%s\n' "$out" | awk -v n="$n" '$1=="@@" && $3=="ok" && $4==n' | wc -l)
    fails=$(printf '%s\n' "$out" | awk -v n="$n" '$1=="@@" && $3=="fail" && $4==n')
    if [ "$oks" -eq "$np" ] && [ -z "$fails" ]; then
      tap ok "$label: $n ($np ranks)"
    else
      tap fail "$label: $n ($oks of $np ranks ok)"
      printf '%s\n' "$fails" | head -4 | sed 's/^/# /'
    fi
  done
  if [ "$rc" -ne 0 ]; then
    tap fail "$label: mpirun exited with status $rc"
    printf '%s\n' "$out" | grep -v '^@@' | tail -10 | sed 's/^/# /'
  fi
}
