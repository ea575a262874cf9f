"""Under mpirun (tests/mpi/python.sh): libmuon with an mpi4py communicator
on a replicate x shard mesh. Each rank registers its shards (placements),
gets its replica group's own gradients in new arrays every step (set_grad),
averages them over the replicas (reduce_grads) and steps, with a
post_update_fn hook that reduces over the whole parameter (ctx.global_norm).
After every step each shard must be bitwise equal to a plain optimizer
stepping the full tensors with the mean gradients in the same process;
state_dict (a collective) gives the plain one's tensors, and stepping on
after load_state_dict stays bitwise.
Prints "@@ <rank> ok|fail <name>" lines.

    mpirun -np N python3 tests/python/mpi_case.py REPLICAS SHARDS
"""
import os
import sys

from mpi4py import MPI

import numpy as np

import libmuon

R, S = int(sys.argv[1]), int(sys.argv[2])
comm = MPI.COMM_WORLD.Split(0, MPI.COMM_WORLD.Get_rank())
rank = comm.Get_rank()
rep, sh = rank // S, rank % S  # mesh coordinates (the last axis fastest)

GROUPS = [{"optimizer": "muon", "match": "^layers", "lr": 0.02, "weight_decay": 0.1,
           "post_update_fn": libmuon.lua("function(_, w, ctx) w:mul_(2 / math.max(ctx.global_norm(w), 1e-8)) end")},
          {"optimizer": "adamw", "match": ".*", "lr": 1e-3, "eps": 0.5}]  # (eps: the gradients' scale shows)
SHAPES = {"layers.0.w": (10, 6), "layers.1.w": (5, 9), "layers.2.experts": (3, 4, 5), "bias": (7,)}


def report(name, ok, detail=""):
    line = "@@ %d %s %s%s\n" % (rank, "ok" if ok else "fail", name, " # " + detail if detail else "")
    os.write(1, line.encode())  # (one write: the ranks share the pipe)


def chunk(n, k, i):
    """torch.chunk's piece i of n elements in k pieces: (start, length)."""
    cs = -(-n // k)
    start = min(i * cs, n)
    return start, max(0, min(cs, n - i * cs))


def box(name):
    s, n = chunk(SHAPES[name][0], S, sh)
    return slice(s, s + n)


full = {n: np.sin(0.37 * np.arange(np.prod(s)) + i).astype(np.float32).reshape(s)
        for i, (n, s) in enumerate(SHAPES.items())}
local = {n: v[box(n)].copy() for n, v in full.items()}
plain_grads = {n: np.zeros_like(v) for n, v in full.items()}

plain = libmuon.Optimizer([(n, full[n], plain_grads[n]) for n in SHAPES],
                          config={"groups": GROUPS, "dist": {"independent": True}})
dist = libmuon.Optimizer([(n, local[n], None) for n in SHAPES],
                         config={"groups": GROUPS, "dist": {"mesh": [["replicate", R], ["shard", S]]}}, comm=comm,
                         placements={n: {"shape": s, "placement": ["R", "S(0)"]} for n, s in SHAPES.items()})
report("registered", True)


def train(steps, first):
    same = True
    for step in range(first, first + steps):
        for i, n in enumerate(SHAPES):
            k = np.arange(full[n].size).reshape(full[n].shape)
            per_replica = [np.cos(0.11 * k * step + i + 0.5 * r).astype(np.float32) for r in range(R)]
            acc = per_replica[0].copy()
            for g in per_replica[1:]:
                acc += g
            plain_grads[n][...] = acc / np.float32(R)
            dist.set_grad(n, per_replica[rep][box(n)].copy())  # a new array every step
        plain.step()
        dist.reduce_grads("mean")
        dist.step()
        for n in SHAPES:
            if not np.array_equal(local[n], full[n][box(n)]):
                same = False
                report("step %d" % step, False, "%s differs from one process" % n)
    return same


report("bitwise-6-steps-with-hook", train(6, 1))
norm = float(np.sqrt(np.sum(full["layers.0.w"].astype(np.float64) ** 2)))
report("hook-ran-on-the-whole-parameter", abs(norm - 2) < 1e-5, "||layers.0.w|| = %r" % norm)
# state_dict on the mesh (a collective): full tensors, the same as one process
sd, sp = dist.state_dict(), plain.state_dict()
same = sorted(sd["state"]) == sorted(sp["state"]) and all(
    np.array_equal(np.asarray(t), np.asarray(sp["state"][i][k])) for i, st in sd["state"].items() for k, t in st.items())
report("state_dict-equals-one-process", same)
dist.load_state_dict(sd)
report("load_state_dict-then-bitwise-2-more-steps", train(2, 7))
dist.close()
plain.close()
