#!/usr/bin/env bash
# The Python package under mpirun with an mpi4py communicator (np 2 and 4):
# sharded registration, reduce_grads, a hook reducing over the mesh, every
# shard bitwise equal to one process (tests/python/mpi_case.py).
. "$(dirname "$0")/lib.bash"
cd "$ROOT"
PY=${PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}
if ! "$PY" -c "import mpi4py, numpy, cffi" 2>/dev/null; then
  echo "ok 1 - python mpi: skipped (no mpi4py, numpy or cffi for $PY; Debian: python3-mpi4py) # SKIP"
  exit 0
fi
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
for m in "2 2 1" "4 2 2"; do
  set -- $m
  mpi_case "python np=$1 mesh ${2}x${3}" "$1" "$PY" tests/python/mpi_case.py "$2" "$3"
done
[ "$FAILS" -eq 0 ]
