-- muon.optim: the optimizers, muon.optim.<class> for every kind of the list
-- in muon.optim.kind, loaded by muon.optim.kinds (reading another name is
-- an error).
--[[ reference muon.optim
    The one-process optimizers, torch-like: param groups over the step
    protocol (lua/muon/step.lua). params is a list of muon.param or a list
    of groups { {params = {...}, <option overrides>}, ... }; opts are the
    defaults of every group. Unknown options are errors listing them (the
    seed's message: "Muon got unexpected keyword arguments: ..."). Every
    option can be overridden per group. A buffer (value or grad) may be
    registered once: one overlapping another is EINVAL naming both.
muon.optim.Muon(params, opts)
    The seed's Muon. Options (defaults: the kind's schema,
    lua/muon/optim/muon.lua):
    opts.lr = {default}
    opts.weight_decay = {default}
    opts.matched_adamw_rms = {default}: the update RMS matched to
    AdamW's.
    opts.momentum = {default}: or a pair {m1, m2}: u = g + m1 buf;
    buf = m2 buf + g; nesterov: u = m1 u + g.
    opts.nesterov = {default}
    opts.ns_steps = {default}
    opts.ns_variant = {default}: see muon.ns.zeropower.
    opts.ns_coefficients = {default}: triples for ns_variant = "custom".
    opts.ns_epsilon = {default}
    opts.ns_path = {default}: or "plain".
    opts.ns_method = {default}: "gram" or "auto" (muon.ns.method_for).
    opts.ns_dtype = {default}: or "bfloat16", the seed's bfloat16
    iteration (muon.ns.zeropower opts.dtype).
    opts.zero_rms_scale_mode = {default}: or "use_lr" (the scale when
    matched_adamw_rms is 0).
    opts.apply_lr_in_update = {default}: the scale takes -lr and the apply
    uses alpha 1.
    opts.scale_mode = {default}: sqrt(max(A, B)) * rms; "keller":
    max(1, A/B)^0.5; "spectral": sqrt(A/B).
    opts.weight_decay_mode = {default}: p = p (1 - lr wd) - lr u;
    "cautious": decay only where u * p > 0.
    opts.nd_mode = {default}: N-D parameters as batches of their last two
    dims; "flatten": one dim-1 x rest matrix.
    opts.nonfinite = {default}: or "skip" (a NaN/Inf gradient skips the
    group's step).
    opts.state_dtype = {default}: or "bfloat16" (momentum in half the
    bytes, float32 maths).
    opts.hsdp_replica_count = {default}: accepted when 1 (more replicas
    need an engine with a mesh).
    opts.hook_state = {default}: { name = "rows" | "cols" | "matrix" |
    "scalar" | "rows_rows" | "cols_cols" }: per-parameter state of the
    hooks.
    opts.reshape_fn, opts.ns_transform_fn, opts.zeropower_fn,
    opts.momentum_update_fn, opts.post_update_fn, opts.pre_ortho_fn,
    opts.post_ortho_fn: the hooks (none by default; contracts in the
    README).
    muon.optim.Muon.DEFAULTS and .OPTIONS list them; .new is the
    constructor, .Muon the class.
muon.optim.AdamW(params, opts)
    torch.optim.AdamW (bias correction, decoupled decay, a step count per
    parameter). opts.lr = {default}, opts.betas = {default},
    opts.eps = {default}, opts.weight_decay = {default},
    opts.nonfinite = {default}, opts.state_dtype = {default}.
muon.optim.Lion(params, opts)
    Lion (lion-pytorch's update): c = beta1 m + (1 - beta1) g;
    p = p (1 - lr wd) - lr sign(c); m = beta2 m + (1 - beta2) g, sign(0) = 0.
    opts.lr = {default}, opts.betas = {default}, opts.weight_decay = {default},
    opts.nonfinite = {default}, opts.state_dtype = {default}.
Optimizer:step(closure)
    One atomic step of every group: on any failure (a bad value, a hook
    that raises, a NaN/Inf gradient) parameters, state and steps are as
    they were. Calls closure() first when given; returns its value (nil
    without one) and whether it stepped (false when no parameter has a
    grad: then nothing changed). Parameters with a nil grad are skipped.
Optimizer:add_param_group(group)
    Add { params = {...}, <options> } as torch does: checked like the
    constructor, the other options from the defaults; a parameter already
    in a group is an error.
Optimizer:params()
    Every parameter of every group, in order.
Optimizer:zero_grad()
    Set every parameter's grad to 0 in place (parameters without a grad
    are skipped): torch's zero_grad(set_to_none=False).
Optimizer:clip_grad_norm(max_norm)
    torch.nn.utils.clip_grad_norm_ over every parameter's grad: returns the
    total L2 norm before clipping (exact: one rounding) and, when max_norm /
    (norm + 1e-6) < 1, multiplies the grads by it (not when the norm is
    NaN or Inf). max_norm: a finite number >= 0 (EINVAL otherwise).
Optimizer:memory()
    { state_bytes = n, scratch_bytes = n }.
Optimizer:state_dict()
    The state as a table of tensors and values (d.groups[i] holds step and
    the options that are data).
Optimizer:load_state_dict(d)
    Load a state_dict; everything is checked first (EFORMAT, nothing
    changed on failure).
Optimizer:save(path)
    The state as a safetensors checkpoint (atomic write, checksummed).
Optimizer:load(path, opts)
    Load a checkpoint (names, shapes and options checked first).
    opts.checksum = {default}: false loads a file written without muon's
    checksum (from Python).
Optimizer.state
    state[p] (p a parameter): its state table once it stepped (Muon:
    momentum_buffer; AdamW: exp_avg, exp_avg_sq; Lion: exp_avg). Buffers are swapped at each commit: hold
    opt.state[p], not the tensor.
Optimizer.param_groups
    The groups: { params = {...}, step = n, <options> }, torch-like.
Optimizer.defaults
    The defaults every group started from.
Optimizer.stats
    Counters of this optimizer's kind: { steps = n, skipped_nonfinite = n }.
]]
local K = require("muon.optim.kind")
local kinds = require("muon.optim.kinds")
local optim = {}
for _, k in ipairs(K.KINDS) do optim[k.class] = kinds.module(k.name) end
return require("muon.core").strict(optim, "muon.optim")
