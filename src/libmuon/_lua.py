"""Configs built in Python: values written as Lua source (the engine's
configs are Lua), and the keyword options of one group or torch-style
parameter groups turned into a config.

Hooks and schedules stay Lua functions: pass them as lua("function(...)
... end") text, which is written into the config as it is.
"""
import math
import numbers

# torch.optim.Muon's names for what muon calls otherwise (its eps is the
# Newton-Schulz epsilon; adjust_lr_fn picks the scale of the update).
TORCH_MUON_ALIASES = {"eps": "ns_epsilon"}
ADJUST_LR = {None: {"scale_mode": "keller"}, "original": {"scale_mode": "keller"},
             "match_rms_adamw": {"scale_mode": "matched_adamw_rms", "matched_adamw_rms": 0.2}}
# Keys of the config itself (the rest of the keyword options are the group's).
TOP_KEYS = ("schedule", "hooks", "dist", "hook_budget", "nil_grad_warning")


class lua(str):
    """Lua source written into a config as it is: a hook, a schedule
    (lua("function(step, group) return 0.02 * math.min(1, step / 100) end")),
    or a whole config (Optimizer(params, config=lua("return { groups = ... }")))."""

    __slots__ = ()


def _key(k):
    if not isinstance(k, str):
        raise TypeError("config keys must be strings, got %r" % (k,))
    if k.isidentifier() and k not in ("and", "end", "function", "local", "nil", "not", "or", "then", "true",
                                      "false", "return", "repeat", "until", "while", "break", "do", "else",
                                      "elseif", "for", "goto", "if", "in"):
        return k
    return "[%s]" % to_lua(k)


def _string(s):
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif o < 32 or o == 127:
            out.append("\\%03d" % o)
        elif o < 128:
            out.append(ch)
        else:
            out.extend("\\%03d" % b for b in ch.encode("utf-8"))
    out.append('"')
    return "".join(out)


def to_lua(v):
    """Lua source for a Python value: None, bool, numbers, str, lua (as it
    is), lists and tuples (Lua lists), dicts (tables with string keys)."""
    if isinstance(v, lua):
        return "(%s)" % v
    if v is None:
        return "nil"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        f = float(v)
        if math.isnan(f):
            return "(0/0)"
        if math.isinf(f):
            return "math.huge" if f > 0 else "(-math.huge)"
        return repr(f)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "{ %s }" % ", ".join(to_lua(x) for x in v)
    if isinstance(v, dict):
        return "{ %s }" % ", ".join("%s = %s" % (_key(k), to_lua(x)) for k, x in v.items() if x is not None)
    if callable(v):
        raise TypeError("a Python function cannot run in the engine: hooks and schedules are Lua; write it as "
                        "libmuon.lua(\"function(...) ... end\") (see the README's \"From PyTorch\")")
    raise TypeError("cannot write %r into a config (numbers, strings, bools, lists, dicts and libmuon.lua "
                    "text only)" % (v,))


def group_options(options):
    """A group's options from keyword options: torch.optim.Muon's eps and
    adjust_lr_fn as muon's, and its ns_coefficients as one (a, b, c) triple
    (used at every step)."""
    opts = dict(options)
    kind = opts.get("optimizer", "muon")
    if kind == "muon":
        for alias, name in TORCH_MUON_ALIASES.items():
            if alias in opts:
                if name in opts:
                    raise TypeError("Muon got both %r and %r (the same option)" % (alias, name))
                opts[name] = opts.pop(alias)
        if "adjust_lr_fn" in opts:
            fn = opts.pop("adjust_lr_fn")
            if fn not in ADJUST_LR:
                raise ValueError("adjust_lr_fn must be None, 'original' or 'match_rms_adamw' (torch.optim.Muon's), "
                                 "got %r" % (fn,))
            opts.update(ADJUST_LR[fn])
        c = opts.get("ns_coefficients")
        if isinstance(c, (list, tuple)) and len(c) == 3 and all(isinstance(x, numbers.Real) for x in c):
            opts["ns_coefficients"] = [list(c)] * int(opts.get("ns_steps", 5))
            opts.setdefault("ns_variant", "custom")
    return opts


def exact_names(names):
    """Lua patterns matching exactly these parameter names."""
    magic = set("^$()%.[]*+-?")
    return ["^%s$" % "".join("%" + ch if ch in magic else ch for ch in n) for n in names]


def config_source(groups, top):
    """A config returning these groups (lists of option dicts, each with
    "names": the parameters it takes, or None: every other) and top-level
    keys."""
    entries = []
    for g in groups:
        g = dict(g)
        names = g.pop("names", None)
        if names is not None:
            g["match"] = exact_names(names) if names else ["^$"]
        entries.append(g)
    cfg = dict(top)
    cfg["groups"] = entries
    return "return " + to_lua(cfg) + "\n"
