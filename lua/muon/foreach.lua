-- Fused multi-tensor ops over Lua arrays of tensors (thin layer over
-- mu_foreach_* in src/foreach.c: one threaded pass over memory per call).
-- All tensors of one call share one dtype and must be contiguous. The C side
-- validates everything before touching memory, so a failed call changes
-- nothing. Pointer arrays are cached per argument slot and reused, so a call
-- allocates nothing per tensor.
--[[ reference muon.foreach
    Fused multi-tensor ops over Lua lists of tensors (mu_foreach_* in
    src/foreach.c): one threaded pass per call, every tensor of a call of
    one dtype and contiguous, everything checked before anything is written
    (a failed call changes nothing); no allocation per tensor.
muon.foreach.momentum(grads, bufs, new_bufs, updates, m1, m2, nesterov)
    The seed's momentum: u = g + m1 buf; buf' = m2 buf + g; nesterov:
    u = m1 u + g. new_bufs nil writes bufs in place; m2 nil means m1.
    Returns updates, and nil or the 1-based index of the first tensor
    whose update or new buffer (as stored) holds NaN or Inf (the same
    pass checks them; everything is written either way). A NaN or Inf
    gradient always shows in its update.
muon.foreach.momentum_updates(grads, bufs, updates, m1, m2, nesterov)
muon.foreach.momentum_buffers(grads, bufs, new_bufs, m1, m2)
    momentum in two parts, each with momentum's bits (a step that keeps
    one buffer and writes it in place at its commit): the updates alone,
    checking the new buffers as they would be stored without storing
    them; then the new buffers alone (new_bufs may be bufs: in place).
    Each returns nil, or the 1-based index of the first tensor whose
    update or new buffer (as stored) holds NaN or Inf.
muon.foreach.apply(params, updates, scales, decay, alpha)
    p = p decay + alpha (u s); scales nil (1), a number, or one number per
    tensor.
muon.foreach.apply_cautious(params, updates, scales, decay, alpha)
    Cautious weight decay: p = p decay + alpha u s where (alpha u s) p < 0
    (the update moves p towards zero), p + alpha u s elsewhere.
muon.foreach.apply_finite(params, updates, scales, decay, alpha, cautious)
    Whether apply (apply_cautious when cautious is true) would write only
    finite values, writing nothing: true; or false and the 1-based index of
    the first parameter that would hold NaN or Inf.
muon.foreach.scale(xs, scales)
    x = x s (s a number or one per tensor).
muon.foreach.adamw(params, grads, exp_avgs, exp_avg_sqs, opts)
    torch.optim.AdamW's step in place. opts.lr, opts.beta1 = 0.9,
    opts.beta2 = 0.999 (or opts.betas = {b1, b2}), opts.eps = 1e-8,
    opts.weight_decay = 1e-2, opts.step (>= 1: the step number after
    incrementing, as torch's state["step"]).
muon.foreach.adamw_update(grads, exp_avgs, exp_avg_sqs, new_exp_avgs, new_exp_avg_sqs, updates, opts, against)
    AdamW's new moments (into new_*, which may be the old ones) and update
    direction, without touching the parameters; apply(params, updates, nil,
    1 - lr wd, 1) then gives adamw's bits. opts as adamw. The same pass
    checks what it writes, and with against = { params = list, decay =,
    alpha = } (params read only) the value apply(params, updates, nil,
    decay, alpha) would write instead of the update: returns nil, or the
    1-based index of the first tensor where one of them is NaN or Inf
    (everything is written either way).
muon.foreach.lion_update(grads, exp_avgs, new_exp_avgs, updates, beta1, beta2, against)
    Lion's direction sign(beta1 m + (1 - beta1) g) (sign(0) = 0) into
    updates and its new moment beta2 m + (1 - beta2) g into new_exp_avgs
    (may be exp_avgs); then apply(params, updates, nil, 1 - lr wd, -lr).
    Checks and returns as adamw_update.
muon.foreach.all_finite(xs)
    true when every element is finite; else false and the 1-based index of
    the first tensor holding NaN or Inf.
muon.foreach.sumsq(xs)
    The sum of the squares of each tensor's elements (one dtype), in
    double (one C call; always the same bits): a list of numbers, one per
    tensor.
muon.foreach.pack(srcs, dst, offsets)
muon.foreach.unpack(src, dsts, offsets)
    Copy tensors into / out of one contiguous batch tensor at element
    offsets (default: one after another); returns the offsets used and the
    total.
muon.foreach.numel(xs)
    The total number of elements of a list of tensors.
## Lists of several dtypes
muon.foreach.per_dtype(fn, lists)
    fn(sublists...) once per dtype of lists[1]'s tensors (the fused calls
    take one dtype each): the lists split alike, in first-seen order.
    Returns the smallest index (into lists[1]) that a call of fn returned
    (fn returns nil or an index into its sublists), or nil.
muon.foreach.split_dtype(as, ...)
    The tuples (as[i], bs[i], ...) of as and the lists after it split by
    as[i]'s dtype: a list of { as_part, bs_part, ... } (one when all
    share a dtype, none when empty). A list after as may hold numbers.
muon.foreach.first_nonfinite(xs)
    The index of the first tensor of xs (any dtypes) holding NaN or Inf,
    or nil (one fused pass per dtype).
]]
local ffi = require("ffi")
local core = require("muon.core")
local E = require("muon.errors")
local T = require("muon.tensor")

local C, check = core.C, core.check
local blame = E.blame
local is_tensor = T.is_tensor

local F = {}

local DT = setmetatable({}, { __index = function(_, code) -- dtype names from C's table
  local s = C.mu_dtype_name(code)
  return s ~= nil and ffi.string(s) or nil
end })

local ptr_arr = ffi.typeof("mu_tensor *[?]")
local dbl_arr = ffi.typeof("double[?]")
local i64_arr = ffi.typeof("int64_t[?]")
local int_box = ffi.typeof("int[1]")

-- slot name -> { cap = n, arr = cdata }
local cache = {}
local function slot_array(slot, ctype, n)
  local c = cache[slot]
  if not c or c.cap < n then
    local cap = math.max(n, 16)
    if c then cap = math.max(cap, c.cap * 2) end
    c = { cap = cap, arr = ctype(cap) }
    cache[slot] = c
  end
  return c.arr
end

local function tensors(slot, list, what)
  if type(list) ~= "table" then
    blame(E.EINVAL, what .. " must be a Lua array of tensors, got " .. type(list))
  end
  local len = #list
  local arr = slot_array(slot, ptr_arr, len)
  local dt
  for i = 1, len do
    local t = list[i]
    if not is_tensor(t) then
      blame(E.EINVAL, ("%s[%d] is not a tensor (%s)"):format(what, i, type(t)))
    end
    dt = dt or t.scalar
    if t.scalar ~= dt then
      blame(E.EDTYPE, ("%s[%d] is %s but %s[1] is %s (one dtype per call)"):format(what, i,
        tostring(DT[t.scalar]), what, tostring(DT[dt])))
    end
    arr[i - 1] = t
  end
  return arr, len
end

-- Per-index numel and dtype agreement, with 1-based names (the C side checks
-- again, with 0-based indices, before touching memory, and knows which
-- arrays are state, which may be bfloat16 beside float32).
local function match(arr0, what0, arrk, whatk, n)
  for i = 0, n - 1 do
    local a, b = arr0[i], arrk[i]
    if b.scalar ~= a.scalar and not (b.scalar == C.MU_BF16 and a.scalar == C.MU_F32) then
      blame(E.EDTYPE, ("%s[%d] is %s but %s[%d] is %s"):format(whatk, i + 1, DT[b.scalar], what0, i + 1,
        DT[a.scalar]))
    end
    local na, nb = C.mu_tensor_numel(a), C.mu_tensor_numel(b)
    if na ~= nb then
      blame(E.ESHAPE, ("%s[%d] has %d elements but %s[%d] has %d"):format(whatk, i + 1, tonumber(nb),
        what0, i + 1, tonumber(na)))
    end
  end
end

local function same_count(what, n, other)
  if type(other) ~= "table" then
    blame(E.EINVAL, what .. " must be a Lua array of tensors, got " .. type(other))
  end
  if #other ~= n then
    blame(E.ESHAPE, ("%s has %d tensors, expected %d"):format(what, #other, n))
  end
end

-- The arrays of lists { { slot, list, what } } beside grads (g, n of them),
-- each checked in order: its count, its tensors, their agreement with grads.
local function beside_grads(g, n, lists)
  local arrs = {}
  for i, l in ipairs(lists) do
    same_count(l[3], n, l[2])
    arrs[i] = tensors(l[1], l[2], l[3])
    match(g, "grads", arrs[i], l[3], n)
  end
  return arrs
end

local function number(v, what)
  if type(v) ~= "number" then
    blame(E.EINVAL, what .. " must be a number, got " .. type(v))
  end
  return v
end

-- Per-tensor scales: nil (all 1), a number, or an array of n numbers.
-- Returns a double* (or nil) and the uniform value.
local function scales_arg(slot, s, n, what)
  if s == nil then return nil, 1.0 end
  if type(s) == "number" then return nil, s end
  if type(s) ~= "table" then
    blame(E.EINVAL, what .. " must be nil, a number or an array of numbers, got " .. type(s))
  end
  if #s ~= n then
    blame(E.ESHAPE, ("%s has %d values, expected %d"):format(what, #s, n))
  end
  local arr = slot_array(slot, dbl_arr, n)
  for i = 1, n do
    local v = number(s[i], what .. "[" .. i .. "]")
    if v ~= v or v == math.huge or v == -math.huge then
      blame(E.EINVAL, ("%s[%d] = %s is not finite"):format(what, i, tostring(v)))
    end
    arr[i - 1] = v
  end
  return arr, 1.0
end

-- A checking update call's status: nil (all finite) or the 1-based index
-- of the first bad tensor.
local function first_bad(rc, bad, what)
  if rc < 0 then check(rc, what) end
  if rc == 1 then return nil end
  return bad[0] + 1
end

-- mu_foreach_momentum: u = g + m1*buf; buf' = m2*buf + g; nesterov: u =
-- m1*u + g. new_bufs (may be bufs: in place) or updates false leaves that
-- part out (momentum's two parts: the reference block). m2 nil means m1.
-- Returns nil or the first tensor holding NaN or Inf (first_bad).
local function momentum(grads, bufs, new_bufs, updates, m1, m2, nesterov)
  local g, n = tensors("a", grads, "grads")
  local b = beside_grads(g, n, { { "b", bufs, "bufs" } })[1]
  local nb, u
  if new_bufs == bufs then nb = b
  elseif new_bufs ~= false then nb = beside_grads(g, n, { { "c", new_bufs, "new_bufs" } })[1] end
  if updates ~= false then u = beside_grads(g, n, { { "d", updates, "updates" } })[1] end
  number(m1, "m1")
  if m2 == nil then m2 = m1 end
  number(m2, "m2")
  if type(nesterov) ~= "boolean" then
    blame(E.EINVAL, "nesterov must be a boolean, got " .. type(nesterov))
  end
  local bad = int_box()
  return first_bad(C.mu_foreach_momentum(n, g, b, nb, u, m1, m2, nesterov and 1 or 0, bad), bad, "foreach.momentum")
end

-- (Their contracts: the reference block at the top.)
function F.momentum(grads, bufs, new_bufs, updates, m1, m2, nesterov)
  if new_bufs == nil then new_bufs = bufs end
  return updates, momentum(grads, bufs, new_bufs, updates, m1, m2, nesterov)
end

function F.momentum_updates(grads, bufs, updates, m1, m2, nesterov)
  return momentum(grads, bufs, false, updates, m1, m2, nesterov)
end

function F.momentum_buffers(grads, bufs, new_bufs, m1, m2)
  return momentum(grads, bufs, new_bufs, false, m1, m2, false)
end

-- p = p*decay + alpha*(update*scale_i); scales nil, a number or an array.
-- cautious: the decay only where the subtracted update has p's sign.
local function apply(params, updates, scales, decay, alpha, cautious, check_only)
  local p, n = tensors("a", params, "params")
  same_count("updates", n, updates)
  local u = tensors("b", updates, "updates")
  match(p, "params", u, "updates", n)
  local sarr, s1 = scales_arg("s", scales, n, "scales")
  number(decay, "decay")
  number(alpha, "alpha")
  if sarr == nil and s1 ~= 1.0 then
    sarr = slot_array("s", dbl_arr, n)
    for i = 0, n - 1 do sarr[i] = s1 end
  end
  if check_only then
    local bad = int_box()
    local rc = C.mu_foreach_apply_finite(n, p, u, sarr, decay, alpha, cautious and 1 or 0, bad)
    if rc < 0 then check(rc, "foreach.apply_finite") end
    if rc == 1 then return true, nil end
    return false, bad[0] + 1
  elseif cautious then
    check(C.mu_foreach_apply_cautious(n, p, u, sarr, decay, alpha), "foreach.apply_cautious")
  else
    check(C.mu_foreach_apply(n, p, u, sarr, decay, alpha), "foreach.apply")
  end
end

function F.apply(params, updates, scales, decay, alpha)
  return apply(params, updates, scales, decay, alpha, false)
end

-- Cautious weight decay: p = p*decay + alpha*u*s where (alpha*u*s)*p < 0
-- (the update moves p towards zero), p + alpha*u*s elsewhere.
function F.apply_cautious(params, updates, scales, decay, alpha)
  return apply(params, updates, scales, decay, alpha, true)
end

-- Whether F.apply (or F.apply_cautious when cautious) would write only
-- finite values, writing nothing: true, nil; or false and the 1-based index
-- of the first parameter that would hold NaN or Inf.
function F.apply_finite(params, updates, scales, decay, alpha, cautious)
  return apply(params, updates, scales, decay, alpha, cautious == true, true)
end

-- x = x * s (s a number or an array of per-tensor numbers).
function F.scale(xs, scales)
  local x, n = tensors("a", xs, "xs")
  if scales == nil then blame(E.EINVAL, "scales must be a number or an array of numbers, got nil") end
  local sarr, s1 = scales_arg("s", scales, n, "scales")
  check(C.mu_foreach_scale(n, x, sarr, s1), "foreach.scale")
end

local ADAMW_KEYS = { lr = true, beta1 = true, beta2 = true, betas = true, eps = true,
                     weight_decay = true, step = true }

-- The scalar options of an AdamW call: lr, beta1, beta2, eps, weight_decay, step.
local function adamw_opts(opts)
  if type(opts) ~= "table" then blame(E.EINVAL, "opts must be a table, got " .. type(opts)) end
  for k in pairs(opts) do
    if not ADAMW_KEYS[k] then blame(E.EINVAL, "foreach.adamw: " .. E.unknown("option", tostring(k), ADAMW_KEYS)) end
  end
  local b1, b2 = opts.beta1, opts.beta2
  if opts.betas ~= nil then
    if b1 ~= nil or b2 ~= nil then blame(E.EINVAL, "give either betas or beta1/beta2, not both") end
    if type(opts.betas) ~= "table" or #opts.betas ~= 2 then
      blame(E.EINVAL, "betas must be a pair {beta1, beta2}")
    end
    b1, b2 = opts.betas[1], opts.betas[2]
  end
  if b1 == nil then b1 = 0.9 end
  if b2 == nil then b2 = 0.999 end
  local eps = opts.eps == nil and 1e-8 or opts.eps
  local wd = opts.weight_decay == nil and 1e-2 or opts.weight_decay
  number(opts.lr, "lr")
  number(b1, "beta1")
  number(b2, "beta2")
  number(eps, "eps")
  number(wd, "weight_decay")
  local step = number(opts.step, "step")
  if step ~= math.floor(step) or step < 1 then
    blame(E.EINVAL, "step must be an integer >= 1, got " .. tostring(step))
  end
  return opts.lr, b1, b2, eps, wd, step
end

-- torch 2.x's torch.optim.AdamW step over the arrays; opts = {lr=, beta1=0.9, beta2=0.999
-- (or betas={b1, b2}), eps=1e-8, weight_decay=1e-2, step=} (step >= 1, the
-- step number after incrementing, as torch's state["step"]).
function F.adamw(params, grads, exp_avgs, exp_avg_sqs, opts)
  local p, n = tensors("a", params, "params")
  same_count("grads", n, grads)
  same_count("exp_avgs", n, exp_avgs)
  same_count("exp_avg_sqs", n, exp_avg_sqs)
  local g = tensors("b", grads, "grads")
  local m = tensors("c", exp_avgs, "exp_avgs")
  local v = tensors("d", exp_avg_sqs, "exp_avg_sqs")
  match(p, "params", g, "grads", n)
  match(p, "params", m, "exp_avgs", n)
  match(p, "params", v, "exp_avg_sqs", n)
  local lr, b1, b2, eps, wd, step = adamw_opts(opts)
  check(C.mu_foreach_adamw(n, p, g, m, v, lr, b1, b2, eps, wd, step), "foreach.adamw")
end

-- The apply an update call checks its values against (nil, or { params =
-- list, decay =, alpha = }): the params' array (or nil) and the two numbers.
local APPLY_KEYS = { params = true, decay = true, alpha = true }
local function apply_arg(g, n, a)
  if a == nil then return nil, 0, 0 end
  if type(a) ~= "table" then blame(E.EINVAL, "against must be nil or a table { params, decay, alpha }, got " .. type(a)) end
  for k in pairs(a) do
    if not APPLY_KEYS[k] then blame(E.EINVAL, "against: " .. E.unknown("key", tostring(k), APPLY_KEYS)) end
  end
  local p = beside_grads(g, n, { { "p", a.params, "against.params" } })[1]
  return p, number(a.decay, "against.decay"), number(a.alpha, "against.alpha")
end

-- AdamW without touching the parameters: new moments into new_exp_avgs /
-- new_exp_avg_sqs (which may be the old ones) and the update direction into
-- updates; F.apply(params, updates, nil, 1 - lr*weight_decay, 1) then gives
-- F.adamw's bits. opts as F.adamw (weight_decay is not used here). against:
-- see apply_arg. Returns nil or the first tensor whose written values (or
-- the apply's) hold NaN or Inf.
function F.adamw_update(grads, exp_avgs, exp_avg_sqs, new_exp_avgs, new_exp_avg_sqs, updates, opts, against)
  local g, n = tensors("a", grads, "grads")
  local lists = { { "b", exp_avgs, "exp_avgs" }, { "c", exp_avg_sqs, "exp_avg_sqs" },
    { "d", new_exp_avgs, "new_exp_avgs" }, { "e", new_exp_avg_sqs, "new_exp_avg_sqs" }, { "f", updates, "updates" } }
  local arrs = beside_grads(g, n, lists)
  local lr, b1, b2, eps, _, step = adamw_opts(opts)
  local p, decay, alpha = apply_arg(g, n, against)
  local bad = int_box()
  return first_bad(C.mu_foreach_adamw_update(n, g, arrs[1], arrs[2], arrs[3], arrs[4], arrs[5], lr, b1, b2, eps,
    step, p, decay, alpha, bad), bad, "foreach.adamw_update")
end

-- Lion's update direction sign(beta1*m + (1-beta1)*g) into updates and
-- its new moment beta2*m + (1-beta2)*g into new_exp_avgs (may be exp_avgs):
-- mu_foreach_lion_update; then F.apply(params, updates, nil, 1 - lr*wd, -lr).
-- against and the result as F.adamw_update.
function F.lion_update(grads, exp_avgs, new_exp_avgs, updates, beta1, beta2, against)
  local g, n = tensors("a", grads, "grads")
  local lists = { { "b", exp_avgs, "exp_avgs" }, { "c", new_exp_avgs, "new_exp_avgs" }, { "d", updates, "updates" } }
  local arrs = beside_grads(g, n, lists)
  local p, decay, alpha = apply_arg(g, n, against)
  local bad = int_box()
  return first_bad(C.mu_foreach_lion_update(n, g, arrs[1], arrs[2], arrs[3], number(beta1, "beta1"),
    number(beta2, "beta2"), p, decay, alpha, bad), bad, "foreach.lion_update")
end

-- true, nil when every element is finite; else false and the 1-based index
-- of the first tensor holding NaN or Inf.
function F.all_finite(xs)
  local x, n = tensors("a", xs, "xs")
  local bad = int_box()
  local rc = C.mu_foreach_all_finite(n, x, bad)
  if rc < 0 then check(rc, "foreach.all_finite") end
  if rc == 1 then return true, nil end
  return false, bad[0] + 1
end

-- (Its contract: the reference block at the top.)
function F.sumsq(xs)
  local x, n = tensors("a", xs, "xs")
  local out = ffi.new("double[?]", math.max(n, 1))
  check(C.mu_foreach_sumsq(n, x, out), "foreach.sumsq")
  local r = {}
  for i = 1, n do r[i] = out[i - 1] end
  return r
end

-- Offsets are element offsets into the batch (0 = its first element); nil
-- means back to back in order. Returns the offsets used and the total.
local function offsets_arg(list, n, offsets)
  local arr = slot_array("o", i64_arr, n)
  local used, total = {}, 0
  if offsets == nil then
    for i = 1, n do
      used[i] = total
      arr[i - 1] = total
      total = total + list[i]:numel()
    end
    return arr, used, total
  end
  if type(offsets) ~= "table" or #offsets ~= n then
    blame(E.EINVAL, "offsets must be nil or an array of " .. n .. " element offsets")
  end
  for i = 1, n do
    local o = offsets[i]
    if type(o) ~= "number" or o ~= math.floor(o) or o < 0 then
      blame(E.EINVAL, ("offsets[%d] must be a non-negative integer, got %s"):format(i, tostring(o)))
    end
    arr[i - 1] = o
    used[i] = o
    total = math.max(total, o + list[i]:numel())
  end
  return arr, used, total
end

-- Copy srcs[i] into dst (a contiguous batch tensor) at element offsets.
function F.pack(srcs, dst, offsets)
  local s, n = tensors("a", srcs, "srcs")
  if not is_tensor(dst) then blame(E.EINVAL, "dst must be a tensor, got " .. type(dst)) end
  local oarr, used, total = offsets_arg(srcs, n, offsets)
  check(C.mu_foreach_pack(n, s, dst, oarr), "foreach.pack")
  return used, total
end

-- Copy from src (a contiguous batch tensor) at element offsets into dsts[i].
function F.unpack(src, dsts, offsets)
  if not is_tensor(src) then blame(E.EINVAL, "src must be a tensor, got " .. type(src)) end
  local d, n = tensors("a", dsts, "dsts")
  local oarr, used, total = offsets_arg(dsts, n, offsets)
  check(C.mu_foreach_unpack(n, src, d, oarr), "foreach.unpack")
  return used, total
end

-- Total number of elements of a list of tensors (batch buffer sizing).
function F.numel(list)
  local total = 0
  for i = 1, #list do total = total + list[i]:numel() end
  return total
end


------------------------------------------------------- lists of dtypes

-- The lists split by the dtype of lists[1]'s tensors: a list of parts,
-- each { sublist per list..., index = the positions in lists[1] }; nil
-- when they share one dtype.
local function split_lists(lists)
  local first = lists[1]
  local mixed = false
  for i = 2, #first do
    if first[i].scalar ~= first[1].scalar then mixed = true break end
  end
  if not mixed then return nil end
  local parts, by = {}, {}
  for i = 1, #first do
    local dt = first[i].scalar
    local part = by[dt]
    if not part then
      part = { index = {} }
      for j = 1, #lists do part[j] = {} end
      by[dt] = part
      parts[#parts + 1] = part
    end
    for j = 1, #lists do
      local l = part[j]
      l[#l + 1] = lists[j][i]
    end
    part.index[#part.index + 1] = i
  end
  return parts
end

-- Call fn(sublists...) once per dtype: the fused calls take one dtype
-- each. Returns the smallest index fn returned, mapped back to lists[1].
function F.per_dtype(fn, lists)
  local parts = split_lists(lists)
  if not parts then return fn(unpack(lists)) end
  local first
  for _, part in ipairs(parts) do
    local bad = fn(unpack(part, 1, #lists))
    if bad ~= nil and (first == nil or part.index[bad] < first) then first = part.index[bad] end
  end
  return first
end

-- The tuples (as[i], ...) split by the dtype of as[i]: a list of
-- { as_part, ... } (one entry when all share a dtype; none when empty).
function F.split_dtype(...)
  local lists = { ... }
  if #lists[1] == 0 then return {} end
  return split_lists(lists) or { lists }
end

-- The index of the first tensor of xs (any dtypes) holding NaN or Inf, or
-- nil: one fused pass per dtype.
function F.first_nonfinite(xs)
  if #xs == 0 then return nil end
  return F.per_dtype(function(part)
    local ok, bad = F.all_finite(part)
    if not ok then return bad end
  end, { xs })
end

return F
