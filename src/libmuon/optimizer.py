"""libmuon.Optimizer: torch.optim's interface over one muon engine.

The engine (a config: groups matched by parameter name, schedules, hooks,
meshes) runs every step; this class keeps torch's surface over it:
param_groups (one per config group; changing "lr" takes effect at the next
step), step(closure), zero_grad(set_to_none), state_dict() /
load_state_dict() in torch's layout, add_param_group, and the engine's own
save / load (safetensors).
"""
import json
import numbers
import os
import sys
import tempfile

import numpy as np

from . import _lua, _safetensors
from ._lib import ffi, lib, text
from ._params import Param, is_torch
from .errors import check, error_for

_torch = sys.modules.get("torch")
_Base = _torch.optim.Optimizer if _torch is not None else object


def _fail(code, fmt, *args):
    raise error_for(code, fmt % args if args else fmt)


def _entries(params):
    """(list of (name, value, grad), torch-style groups or None) from
    named parameters, (name, array, grad) triples, a {name: tensor} mapping,
    or a list of {"params": <those>, option: value, ...} groups."""
    if is_torch(params) or isinstance(params, np.ndarray):
        _fail(lib.MU_EINVAL, "params must be named: pass model.named_parameters() (or (name, tensor) pairs), "
              "not a tensor")
    items = list(params.items()) if isinstance(params, dict) else list(params)
    if items and all(isinstance(g, dict) for g in items):
        entries, groups = [], []
        for i, g in enumerate(items):
            if "params" not in g:
                _fail(lib.MU_EINVAL, "param group %d has no 'params'", i)
            es, _ = _entries(g["params"])
            entries.extend(es)
            groups.append(dict(g, names=[e[0] for e in es]))
        return entries, groups
    entries = []
    for i, it in enumerate(items):
        if is_torch(it) or isinstance(it, np.ndarray):
            _fail(lib.MU_EINVAL, "params[%d] is a tensor without a name: libmuon routes parameters by name, so pass "
                  "model.named_parameters() (or (name, tensor) pairs)", i)
        if not isinstance(it, (tuple, list)) or len(it) not in (2, 3):
            _fail(lib.MU_EINVAL, "params[%d] must be a (name, tensor) pair or a (name, array, grad) triple, got %r",
                  i, type(it).__name__)
        entries.append((it[0], it[1], it[2] if len(it) == 3 else None))
    return entries, None


def _placement(name, spec, p):
    """(global shape, mu_placement array) of a sharded parameter: spec is
    {"shape": global shape, "placement": ["R" | "S(d)" | ("shard", d), ...]}
    (dims from 0)."""
    if not isinstance(spec, dict) or "shape" not in spec or "placement" not in spec:
        _fail(lib.MU_EINVAL, "placements['%s'] must be {'shape': global shape, 'placement': ['R', 'S(0)', ...]}", name)
    shape = [int(d) for d in spec["shape"]]
    axes = list(spec["placement"])
    pl = ffi.new("mu_placement[]", max(len(axes), 1))
    for i, a in enumerate(axes):
        if a == "R" or a == ("replicate",) or a == "replicate":
            pl[i].kind, pl[i].dim = lib.MU_REPLICATE, 0
        elif isinstance(a, str) and a.startswith("S(") and a.endswith(")") and a[2:-1].isdigit():
            pl[i].kind, pl[i].dim = lib.MU_SHARD, int(a[2:-1])
        elif isinstance(a, (tuple, list)) and len(a) == 2 and a[0] == "shard" and isinstance(a[1], numbers.Integral):
            pl[i].kind, pl[i].dim = lib.MU_SHARD, int(a[1])
        else:
            _fail(lib.MU_EINVAL, "placements['%s'][%d] must be 'R', 'S(d)' or ('shard', d) (d from 0), got %r",
                  name, i, a)
    if len(shape) != len(p.shape):
        _fail(lib.MU_EINVAL, "placements['%s']: shape has %d dims, the local tensor %d", name, len(shape),
              len(p.shape))
    return shape, len(axes), pl


class Optimizer(_Base):
    """torch.optim's interface over a muon engine.

    Optimizer(params, config=None, *, comm=None, placements=None,
              trusted=False, **options)

    params: model.named_parameters() (names route parameters to the config's
    groups), (name, array, grad) triples for NumPy, or torch-style groups
    [{"params": model.x.named_parameters(), "lr": ...}, ...] (with no config).
    config: a config file path, libmuon.lua("return { groups = ... }")
    source, or a dict written as that table; None: the keyword options make
    one group (the seed's and torch.optim.Muon's names; optimizer="adamw" or
    "lion" for those kinds), or one group per torch-style group. The
    config's own keys (schedule, hooks, dist, hook_budget,
    nil_grad_warning) may be keywords too. comm: an mpi4py communicator for
    a config with a dist section; placements: {name: {"shape": global shape,
    "placement": ["R", "S(0)", ...]}} for parameters given as local shards.
    trusted: run a config file with full Lua.
    """

    def __init__(self, params, config=None, *, comm=None, placements=None, trusted=False, **options):
        self._eng = None
        entries, groups = _entries(params)
        if not entries:
            _fail(lib.MU_EINVAL, "optimizer got an empty parameter list")
        self._comm, self._placements, self._trusted = comm, dict(placements or {}), trusted
        self._params, self._by_name = [], {}
        if config is None:
            self._spec = self._generated_spec(groups, options)
        else:
            if groups is not None or options:
                _fail(lib.MU_EINVAL, "with config=..., groups and their options come from the config: pass named "
                      "parameters alone (got %s)", "torch-style groups" if groups is not None else
                      "keyword options " + ", ".join(sorted(options)))
            self._spec = None
        self._config = config
        self._open()
        for name, value, grad in entries:
            self._register(name, value, grad)
        self.defaults = dict(options)
        self._build_groups()
        if _torch is not None:
            # torch's own attributes (hooks, profiling) without its checks:
            # add_param_group only records the groups built above
            built, self._building = self.param_groups, True
            try:
                _Base.__init__(self, [dict(g) for g in built], self.defaults)
            finally:
                self._building = False
            self.param_groups = built
        self.state = _StateView(self)

    # -------------------------------------------------------------- engine

    def _generated_spec(self, groups, options):
        top = {k: options.pop(k) for k in _lua.TOP_KEYS if k in options}
        kind = self._kind()
        if groups is None:
            groups = [dict(options)]
        else:
            groups = [dict(options, **{k: v for k, v in g.items() if k != "params"}) for g in groups]
        out = []
        for g in groups:
            g.setdefault("optimizer", kind)
            out.append(_lua.group_options(g))
        return {"groups": out, "top": top}

    def _kind(self):
        return "muon"

    def _open(self):
        out = ffi.new("mu_engine **")
        opts = ffi.new("mu_engine_opts *")
        opts.trusted = 1 if self._trusted else 0
        cfg = self._config
        if self._spec is not None:
            src = _lua.config_source(self._spec["groups"], self._spec["top"])
            rc = lib.mu_engine_open_source(out, src.encode(), ("<%s options>" % type(self).__name__).encode(), opts)
        elif isinstance(cfg, _lua.lua):
            rc = lib.mu_engine_open_source(out, cfg.encode(), b"<lua>", opts)
        elif isinstance(cfg, dict):
            rc = lib.mu_engine_open_source(out, ("return " + _lua.to_lua(cfg)).encode(), b"<dict>", opts)
        elif isinstance(cfg, (str, bytes, os.PathLike)):
            rc = lib.mu_engine_open_ex(out, os.fsencode(cfg), opts)
        else:
            _fail(lib.MU_EINVAL, "config must be a file path, libmuon.lua(source) or a dict, got %s", type(cfg).__name__)
        check(rc)
        self._eng = out[0]
        if self._comm is not None:
            from mpi4py import MPI
            check(lib.mu_engine_set_comm(self._eng, ffi.cast("void *", MPI._addressof(self._comm))), self._eng)

    def _register(self, name, value, grad):
        if name in self._by_name:
            _fail(lib.MU_EINVAL, "parameter '%s' is given twice", name)
        p = Param(name, value, grad)
        g = p.current_grad()
        if g is not None:
            p.check_grad(g)
        gp = p.grad_pointer(g)
        spec = self._placements.get(name)
        if spec is None:
            shape = ffi.new("int64_t[]", list(p.shape) or [0])
            rc = lib.mu_engine_add_param(self._eng, name.encode(), p.edtype, len(p.shape), shape,
                                         p.pointer(p.data_ptr), p.pointer(gp))
        else:
            gshape, naxes, pl = _placement(name, spec, p)
            rc = lib.mu_engine_add_param_sharded(self._eng, name.encode(), p.edtype, len(gshape),
                                                 ffi.new("int64_t[]", gshape or [0]), naxes, pl,
                                                 p.pointer(p.data_ptr), p.pointer(gp))
        check(rc, self._eng)
        p.sent = gp
        self._params.append(p)
        self._by_name[name] = p
        return p

    def _query(self, what):
        n = ffi.new("size_t *")
        check(lib.mu_engine_query(self._eng, what.encode(), ffi.NULL, 0, n), self._eng)
        buf = ffi.new("char[]", n[0] + 1)
        check(lib.mu_engine_query(self._eng, what.encode(), buf, n[0] + 1, n), self._eng)
        return json.loads(text(buf))

    def _build_groups(self):
        """param_groups from the engine: one dict per config group."""
        groups = self._query("groups")
        self.param_groups, self._sent_lr = [], []
        self._group_options = [dict(g["options"]) for g in groups]
        for g in groups:
            d = dict(g["options"])
            d["params"] = [self._by_name[n].value for n in g["params"]]
            d["name"] = g.get("name")
            d["optimizer"] = g["optimizer"]
            self.param_groups.append(d)
            self._sent_lr.append(d["lr"])

    def _live(self):
        if self._eng is None:
            _fail(lib.MU_ESTATE, "the optimizer is closed")
        return self._eng

    def close(self):
        """Free the engine (the parameters stay as they are). Idempotent."""
        if getattr(self, "_eng", None) is not None:
            lib.mu_engine_close(self._eng)
            self._eng = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------- step and grads

    def _sync(self):
        """Before an engine call that reads gradients or options: lr changes
        of param_groups, then every parameter's current grad (all checked
        before the engine sees any)."""
        eng = self._live()
        for i, g in enumerate(self.param_groups):
            opts = self._group_options[i]
            for k, v in g.items():
                if k in ("params", "name", "optimizer", "lr") or k not in opts or _same(v, opts[k]):
                    continue
                _fail(lib.MU_EINVAL, "param_groups[%d]['%s'] = %r, but only 'lr' can change here (the config's %r "
                      "stays): a schedule in the config changes other values per step", i, k, v, opts.get(k))
        grads = []
        for p in self._params:
            p.check_value()
            g = p.current_grad()
            if g is not None:
                p.check_grad(g)
            grads.append(g)
        for i, g in enumerate(self.param_groups):
            lr = g["lr"]
            if lr != self._sent_lr[i]:
                check(lib.mu_engine_set_lr(eng, str(i + 1).encode(), float(lr)), eng)
                self._sent_lr[i] = lr
        moved = []
        for p, g in zip(self._params, grads):
            gp = p.grad_pointer(g)
            if gp != p.sent:
                moved.append((p, gp))
        if moved:
            names = ffi.new("char *[]", [p.cname for p, _ in moved])
            ptrs = ffi.new("void *[]", [p.pointer(gp) for _, gp in moved])
            check(lib.mu_engine_set_grads(eng, len(moved), names, ptrs), eng)
            for p, gp in moved:
                p.sent = gp
        return grads

    def step(self, closure=None):
        """One step of every parameter with a grad (atomic: on failure the
        parameters and the state are as they were). closure (optional) is
        called first and its value returned, as torch's."""
        loss = None
        if closure is not None:
            if _torch is not None:
                with _torch.enable_grad():
                    loss = closure()
            else:
                loss = closure()
        grads = self._sync()
        check(lib.mu_engine_step(self._eng), self._eng)
        for p, g in zip(self._params, grads):
            if g is not None:
                p.after_step()
        return loss

    def zero_grad(self, set_to_none=None):
        """Clear every gradient: set_to_none (torch parameters' default)
        drops them (the next backward allocates new ones), False zeroes them
        in place (NumPy parameters' default)."""
        for p in self._params:
            none = set_to_none if set_to_none is not None else p.torch
            if p.torch:
                g = p.value.grad
                if g is None:
                    continue
                if none:
                    p.value.grad = None
                else:
                    if g.grad_fn is not None:
                        g.detach_()
                    else:
                        g.requires_grad_(False)
                    g.zero_()
            elif none:
                p.grad = None
            elif p.grad is not None:
                p.grad.fill(0)

    def set_grad(self, name, grad):
        """A NumPy parameter's gradient (an array of its shape and dtype, or
        None: no gradient). Checked now, used from the next step."""
        p = self._param(name)
        if p.torch:
            _fail(lib.MU_EINVAL, "parameter '%s' is a torch tensor: set its .grad", name)
        if grad is not None:
            p.check_grad(grad)
        p.grad = grad

    def _param(self, name):
        p = self._by_name.get(name)
        if p is None:
            _fail(lib.MU_EINVAL, "no parameter '%s'", name)
        return p

    def clip_grad_norm(self, max_norm):
        """torch.nn.utils.clip_grad_norm_ over the gradients (exact; a
        collective on a mesh): returns the total norm before clipping."""
        self._sync()
        norm = ffi.new("double *")
        check(lib.mu_engine_clip_grad_norm(self._eng, float(max_norm), norm), self._eng)
        self._masters_grads_back()
        return norm[0]

    def reduce_grads(self, op="mean"):
        """On a mesh: every gradient becomes its mean ("mean") or sum ("sum")
        over the replicas of its box, in place (a collective)."""
        if op not in ("mean", "sum"):
            _fail(lib.MU_EINVAL, "reduce_grads: op must be 'mean' or 'sum', got %r", op)
        self._sync()
        check(lib.mu_engine_reduce_grads(self._eng, lib.MU_REDUCE_MEAN if op == "mean" else lib.MU_REDUCE_SUM),
              self._eng)
        self._masters_grads_back()

    def _masters_grads_back(self):
        # the engine changed the float32 copies of masters' grads: give them back
        for p in self._params:
            g = p.current_grad()
            if not p.direct and g is not None:
                if p.torch:
                    with _torch.no_grad():
                        g.copy_(_torch.from_numpy(p.grad_buf))
                else:
                    np.copyto(g, p.grad_buf, casting="unsafe")

    # ---------------------------------------------------------- values

    def get(self, key):
        """An engine value: "lr", "lr:<group>", "step", "stepped", "lr_scale",
        "state_bytes", "scratch_bytes"."""
        out = ffi.new("double *")
        check(lib.mu_engine_get(self._live(), key.encode(), out), self._eng)
        return out[0]

    def set(self, key, value):
        """Set an engine value ("lr_scale")."""
        check(lib.mu_engine_set(self._live(), key.encode(), float(value)), self._eng)

    def set_signal(self, name, values):
        """Values for the config's hooks (ctx.signals[name])."""
        vals = [float(v) for v in values]
        check(lib.mu_engine_set_signal(self._live(), name.encode(), ffi.new("double[]", vals or [0.0]), len(vals)),
              self._eng)

    # ---------------------------------------------------------- groups

    def add_param_group(self, param_group):
        """Add parameters: {"params": named parameters, option: value, ...}.
        Before the first step of an optimizer built from keyword options or
        torch-style groups, they make a new group (the optimizer's keyword
        options where the dict gives none), as torch's does; otherwise the
        config routes them, and options, if given, must be those of the
        group each one lands in."""
        if getattr(self, "_building", False):
            self.param_groups.append(param_group)
            return
        if not isinstance(param_group, dict) or "params" not in param_group:
            _fail(lib.MU_EINVAL, "add_param_group takes a dict {'params': named parameters, ...}")
        entries, _ = _entries(param_group["params"])
        options = {k: v for k, v in param_group.items() if k != "params"}
        if self._spec is not None and self.get("step") == 0:
            g = dict(self.defaults, **options)
            g.setdefault("optimizer", self._kind())
            g = _lua.group_options(g)
            g["names"] = [e[0] for e in entries]
            self._reopen(entries, g)
            return
        for name, value, grad in entries:
            self._register(name, value, grad)
        self._build_groups()
        for name, _, _ in entries:
            gi = self._group_of(self._by_name[name])
            want = self._group_options[gi]
            for k, v in _lua.group_options(dict(options, optimizer=self.param_groups[gi]["optimizer"])).items():
                if k != "optimizer" and not _same(want.get(k), v):
                    _fail(lib.MU_EINVAL, "add_param_group: parameter '%s' went to group %d, whose %s is %r, not %r: "
                          "the config decides the groups (write a group for it in the config)", name, gi + 1, k,
                          want.get(k), v)

    def _group_of(self, p):
        return next(i for i, g in enumerate(self.param_groups) if any(t is p.value for t in g["params"]))

    def _reopen(self, entries, group):
        """A new engine with one more group (no step taken yet; the groups'
        lrs as param_groups has them)."""
        old = [(p.name, p.value, p.grad) for p in self._params]
        for g, pg in zip(self._spec["groups"], self.param_groups):
            g["lr"] = pg["lr"]
            if "names" not in g:
                g["names"] = [p.name for p in self._params]
        self._spec["groups"].append(group)
        self.close()
        self._params, self._by_name = [], {}
        self._open()
        for name, value, grad in old + list(entries):
            self._register(name, value, grad)
        self._build_groups()

    # ---------------------------------------------------------- state

    def _saved(self):
        """The engine's checkpoint, read back: (tensors, metadata). On a
        mesh (a collective) rank 0 writes it, and every rank gets its bytes."""
        with tempfile.TemporaryDirectory(prefix="libmuon-") as d:
            path = os.path.join(d, "state.safetensors")
            self.save(path)
            if self._comm is None or self._comm.Get_size() == 1:
                return _safetensors.read(path)
            root = self._comm.Get_rank() == 0
            return self._comm.bcast(_safetensors.read(path) if root else None, root=0)

    def _index(self):
        """name -> index in torch's numbering (param_groups order)."""
        by_id = {id(p.value): p.name for p in self._params}
        order = {}
        for g in self.param_groups:
            for t in g["params"]:
                name = by_id.get(id(t))
                if name is not None and name not in order:
                    order[name] = len(order)
        return order

    def state_dict(self):
        """The state in torch's layout: {"state": {index: {key: tensor}},
        "param_groups": [{options..., "params": [indices]}]}, indices in
        param_groups order; "muon" holds what the engine's checkpoint adds
        (step counts, metadata). Tensors are torch tensors (NumPy arrays
        without torch); a round trip through torch.save resumes bitwise."""
        tensors, meta = self._saved()
        index = self._index()
        names = sorted(index, key=index.get)
        state = {}
        kinds = json.loads(meta.get("muon.state", "[]"))
        for part in kinds:
            prefix = part["prefix"]
            scalars = part.get("scalars") or {}
            for e in part["params"]:
                st = {}
                for tname, (dt, shape, data) in tensors.items():
                    if tname.startswith(prefix + e["name"] + "/"):
                        st[tname[len(prefix + e["name"]) + 1:]] = _tensor(dt, shape, data)
                if isinstance(scalars, dict) and e["name"] in scalars:
                    st["step"] = _scalar(scalars[e["name"]]["step"])
                if st:
                    state[index[e["name"]]] = st
        by_id = {id(p.value): p.name for p in self._params}
        groups = []
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = [index[by_id[id(t)]] for t in g["params"] if id(t) in by_id]
            groups.append(d)
        keep = {k: v for k, v in meta.items() if k not in ("muon.checksum", "muon.state_checksum", "muon.format")}
        return {"state": state, "param_groups": groups, "muon": {"names": names, "metadata": keep}}

    def load_state_dict(self, state_dict):
        """Load a state_dict() (of an optimizer with parameters of the same
        shapes in the same order; names may differ). Everything is checked
        before anything changes."""
        for k in ("state", "param_groups", "muon"):
            if k not in state_dict:
                _fail(lib.MU_EINVAL, "load_state_dict: the state dict has no '%s' (not from libmuon's state_dict)", k)
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups):
            _fail(lib.MU_EINVAL, "load_state_dict: the state dict has %d param groups, this optimizer %d",
                  len(saved), len(self.param_groups))
        for i, (a, b) in enumerate(zip(saved, self.param_groups)):
            if len(a["params"]) != len(b["params"]):
                _fail(lib.MU_EINVAL, "load_state_dict: param group %d has %d parameters in the state dict, %d here",
                      i, len(a["params"]), len(b["params"]))
        old_names = list(state_dict["muon"]["names"])
        index = self._index()
        names = sorted(index, key=index.get)
        if len(old_names) != len(names):
            _fail(lib.MU_EINVAL, "load_state_dict: %d parameters in the state dict, %d here", len(old_names), len(names))
        rename = dict(zip(old_names, names))
        meta = dict(state_dict["muon"]["metadata"])
        kinds = json.loads(meta.get("muon.state", "[]"))
        out = []
        for part in kinds:
            prefix = part["prefix"]
            for e in part["params"]:
                old = e["name"]
                e["name"] = rename.get(old, old)
                st = state_dict["state"].get(old_names.index(old)) if old in old_names else None
                for key, t in sorted((st or {}).items()):
                    if key == "step":
                        part["scalars"][e["name"]] = {"step": int(_number(t))}
                        continue
                    dt, shape, data = _bytes(t)
                    out.append((prefix + e["name"] + "/" + key, dt, shape, data))
            sc = part.get("scalars")
            if isinstance(sc, dict):
                part["scalars"] = {rename.get(k, k): v for k, v in sc.items()}
        meta["muon.state"] = json.dumps(kinds, separators=(",", ":"), sort_keys=True)
        with tempfile.TemporaryDirectory(prefix="libmuon-") as d:
            path = os.path.join(d, "state.safetensors")
            _safetensors.write(path, out, meta)
            self.load(path, checksum=False)
        for i, g in enumerate(saved):
            if "lr" in g:
                self.param_groups[i]["lr"] = g["lr"]

    def save(self, path, sharded=False):
        """The engine's checkpoint (safetensors, atomic, checksummed);
        sharded=True: a directory where each rank writes its own state boxes
        and rank 0 an index, nothing gathered (every rank passes the same)."""
        flags = lib.MU_SAVE_SHARDED if sharded else 0
        check(lib.mu_engine_save_ex(self._live(), os.fsencode(path), flags), self._eng)

    def load(self, path, checksum=True):
        """Load a checkpoint of save() (a file, or a sharded checkpoint's
        directory saved on any number of ranks; checksum=False: one written
        or edited elsewhere); nothing changes on failure."""
        flags = 0 if checksum else lib.MU_LOAD_NO_CHECKSUM
        check(lib.mu_engine_load_ex(self._live(), os.fsencode(path), flags), self._eng)

    def __repr__(self):
        lines = [type(self).__name__ + " ("]
        for i, g in enumerate(self.param_groups):
            lines.append("Parameter Group %d (%s%s)" % (i, g["optimizer"], ", " + g["name"] if g.get("name") else ""))
            for k in sorted(g):
                if k not in ("params", "name", "optimizer"):
                    lines.append("    %s: %s" % (k, g[k]))
        lines.append(")")
        return "\n".join(lines)


class _StateView:
    """optimizer.state[param] (or [name]): that parameter's state as torch
    tensors, read from the engine at each access (a copy)."""

    def __init__(self, opt):
        self._opt = opt

    def _get(self, key):
        opt = self._opt
        name = key if isinstance(key, str) else next((p.name for p in opt._params if p.value is key), None)
        if name is None or name not in opt._by_name:
            raise KeyError(key)
        sd = opt.state_dict()
        return sd["state"].get(sd["muon"]["names"].index(name), {})

    def __getitem__(self, key):
        return self._get(key)

    def __contains__(self, key):
        try:
            return bool(self._get(key))
        except KeyError:
            return False

    def __len__(self):
        return len(self._opt.state_dict()["state"])


def _same(a, b):
    """Option values equal, lists and tuples alike."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _tensor(dtype, shape, data):
    if _torch is not None:
        tdt = {"F32": _torch.float32, "F64": _torch.float64, "BF16": _torch.bfloat16}[dtype]
        if not data:
            return _torch.zeros(shape, dtype=tdt)
        return _torch.frombuffer(bytearray(data), dtype=tdt).reshape(shape)
    return _safetensors.to_numpy(dtype, shape, data)


def _scalar(v):
    return _torch.tensor(float(v)) if _torch is not None else float(v)


def _number(t):
    return float(t.item()) if hasattr(t, "item") else float(t)


def _bytes(t):
    """(dtype name, shape, bytes) of a torch tensor or NumPy array."""
    if is_torch(t):
        t = t.detach().cpu().contiguous()
        if t.dtype == _torch.bfloat16:
            return "BF16", tuple(t.shape), t.view(_torch.int16).numpy().tobytes()
        name = {_torch.float32: "F32", _torch.float64: "F64"}.get(t.dtype)
        if name is None:
            _fail(lib.MU_EDTYPE, "load_state_dict: state tensors are float32, float64 or bfloat16, got %s", t.dtype)
        return name, tuple(t.shape), t.numpy().tobytes()
    a = np.ascontiguousarray(t)
    name = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64"}.get(a.dtype)
    if name is None:
        _fail(lib.MU_EDTYPE, "load_state_dict: state arrays are float32 or float64, got %s", a.dtype)
    return name, a.shape, a.tobytes()


class Muon(Optimizer):
    """Optimizer whose keyword options make a Muon group (the seed's names;
    torch.optim.Muon's eps, adjust_lr_fn and one ns_coefficients triple)."""


class AdamW(Optimizer):
    """Optimizer whose keyword options make an AdamW group (torch's names)."""

    def _kind(self):
        return "adamw"


class Lion(Optimizer):
    """Optimizer whose keyword options make a Lion group."""

    def _kind(self):
        return "lion"
