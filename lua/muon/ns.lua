-- Newton-Schulz orthogonalization (the seed's zeropower_via_newtonschulz5),
-- computed in C (src/ns.c). Coefficient schedules and option validation
-- live here; the presets' numbers live in C (mu_ns_preset).
--
--   local ns = require("muon.ns")
--   local u = ns.zeropower(x, { steps = 5, variant = "asym5", eps = 1e-10 })
--   ns.coefficients("asym5", 5)          --> { {4.0848, -6.8946, 2.9270}, ... }, norm_scale
--   -- hot loop (optimizer): validate once, reuse the C options and a workspace
--   local r = ns.resolve({ steps = 5, variant = "asym5" })
--   local ws = ns.workspace("float32", rows, cols)
--   ns.zeropower_into(out, x, r, ws)     -- out, x contiguous, same shape
--[[ reference muon.ns
    Newton-Schulz orthogonalization (the seed's zeropower_via_newtonschulz5)
    in C (src/ns.c): per step A = X X^T, B = b A + c A A, X = a X + B X,
    after X / (norm_scale ||X||_F + eps), on the wide orientation.
muon.ns.zeropower(x, opts)
    A new orthogonalized tensor of x's shape and dtype; x (2-D, or 3-D: a
    batch of matrices; float32 or float64, float32 with dtype "bfloat16";
    contiguous or not) is unchanged.
    opts.steps = the variant's length (5; deepseekv4 10, polar_express_8 8,
    aol 4): iterations; 0 only normalizes.
    opts.variant = "asym5": "legacy", "asym5", "polar_express",
    "deepseekv4", "cans", "polar_express_8", "aol", "cubic5" (c = 0: no
    A A product) or "custom".
    opts.coefficients = nil: { {a, b, c}, ... } for variant "custom".
    opts.eps = 1e-10: added to the norm.
    opts.norm_scale = the variant's (1; polar_express 1.02): the norm's
    factor.
    opts.method = "standard": "gram" (the Gram iteration) or "auto" (the
    faster of the two for the shape, see method_for).
    opts.path = "symmetric": "plain" computes A A without the symmetric
    product.
    opts.dtype = "float32": "bfloat16" runs the seed's bfloat16 iteration
    (bfloat16 products on oneDNN accumulating in float32, every iterate
    rounded to bfloat16 where the seed's torch code holds one; rounding
    points: the README's "Precision"); method "gram" runs the Gram
    iteration in bfloat16 (normalized in float32, restarts every 2 steps,
    float32 output), "auto" picks it by the cost model; variants "aol" and
    "cans" are errors. The seed's variants (legacy, asym5, custom) round
    their coefficients to bfloat16 as the seed does, the others apply
    theirs in float32.
    opts.workspace = nil: a workspace from ns.workspace to reuse.
    An unknown option is an error listing the valid ones. Asked for more
    steps than a fixed schedule defines, it runs the defined ones (as the
    seed slices its triples), with one warning per (variant, steps).
muon.ns.resolve(opts)
    The options of zeropower checked and resolved once (coefficients, norm
    scale, path, method, the C mu_ns_opts) for zeropower_into and
    zeropower_many; a resolved table passes through unchanged.
muon.ns.copy(r)
    A resolved table of its own (its C options and coefficients copied):
    what is handed out where the caller may write it (Engine:describe).
muon.ns.zeropower_into(out, x, r, ws)
    The C call with resolved options r, no option checks: x and out
    contiguous, same shape (2-D or 3-D) and dtype; out may be x; ws (may be
    nil) a workspace. Returns out.
muon.ns.zeropower_many(outs, xs, rs, ws, count)
    count tensors (default #xs) in one C call: outs[i] = Newton-Schulz of
    xs[i] with rs[i] (or one resolved table for all), the same bits as one
    zeropower_into each. One dtype; ws holds the largest. Returns outs.
muon.ns.workspace(dtype, rows, cols)
    A reusable workspace for matrices up to rows x cols (either
    orientation), freed by the GC.
muon.ns.workspace_stats(ws, reset)
    What the calls on a workspace did since it was made or reset (reset =
    true zeroes it after reading): { seconds, matrices, residuals,
    residual_max, residual_rms } (mu_ns_workspace_stats: the residual of a
    matrix is ||A - I||_F / sqrt(n) of its last step's Gram matrix A = X
    X^T, X the iterate that step starts from; no extra product).
muon.ns.method_for(rows, cols, opts)
    "standard" or "gram": the iteration opts.method runs for a rows x cols
    matrix ("auto" resolved by the cost model, see cost).
muon.ns.coefficients(variant, steps, custom)
    The { {a, b, c}, ... } triples of a variant (default "asym5") and its
    norm scale; steps defaults to the variant's length.
muon.ns.validate(variant, steps, custom)
    The seed's checks of (variant, steps, custom), raising its messages
    ("ns_steps=7 exceeds the 5 provided coefficient groups"); returns the
    custom triples copied (nil for a preset).
muon.ns.core(shape, nd_mode)
    The core matrices Newton-Schulz runs on for a parameter shape: rows,
    cols, their count, and the sets of 1-based dims making rows and cols.
    2-D (A, B); 3-D (A, 1, B): one (A, B); other N-D: a batch of the last
    two dims (nd_mode "batch", the default) or one dim-1 x rest matrix
    (nd_mode "flatten"). nil for 0-D and 1-D shapes.
muon.ns.cost(rows, cols, opts)
    What one Newton-Schulz of a rows x cols matrix costs with opts (as
    zeropower takes them; nil: the defaults), by the one cost model of
    mu_ns_cost_of (src/muon_ffi.h): flops its products perform (a long
    side of 8192 or more: the blocked iteration's, src/ns_split.c), bytes
    they and its elementwise passes move, and the method ("standard" or
    "gram") it runs.
muon.ns.shape_cost(shape, nd_mode, opts)
    The same summed over the core matrices of a parameter shape (core):
    flops and bytes (0, 0 without a core matrix).
muon.ns.split_cost(rows, cols, opts, group, rank, dtype)
    The blocked iteration's share of rank `rank` (0-based) of a group of
    `group` ranks splitting one rows x cols matrix (the same model: flops
    of its blocks' partial products and updates and of its stripes, bytes
    it sends and receives per matrix, src/muon_ffi.h mu__split_info), as
    { blocks, stripes, flops, bytes_sent, bytes_recv (per matrix),
    call_bytes_sent, call_bytes_recv (once per call), exchanges,
    first_block (0-based), nblocks, dim, start, length } (dim 1-based: 1 rows of a tall matrix, 2 cols), or nil
    when the shape is one block (k = 1: it cannot split). dtype: "float32"
    (default) or "float64".
muon.ns.split_blocks(rows, cols, opts)
    k, the blocks of a rows x cols matrix in the blocked iteration (1: not
    blocked, it cannot split), and their width.
muon.ns.VARIANTS
muon.ns.METHODS
muon.ns.DTYPES
    The variant names; "standard", "gram", "auto"; "float32", "bfloat16".
muon.ns.DEFAULT_VARIANT
muon.ns.DEFAULT_STEPS
muon.ns.DEFAULT_EPS
muon.ns.MAX_STEPS
    "asym5", 5, 1e-10; the most steps accepted (1000).
]]
local ffi = require("ffi")
local core = require("muon.core")
local E = require("muon.errors")
local T = require("muon.tensor")

local C, check = core.C, core.check
-- Bad arguments and options are blamed on the caller's line (E.blame).
local blame = E.blame

local ns = {}

ns.VARIANTS = { "legacy", "asym5", "polar_express", "deepseekv4", "cans", "polar_express_8", "aol", "cubic5",
  "custom" }
-- each preset's natural number of steps (its numbers: mu_ns_preset in src/ns.c)
local PRESET = { legacy = 5, asym5 = 5, polar_express = 5, deepseekv4 = 10, cans = 5, polar_express_8 = 8, aol = 4,
  cubic5 = 5 }
ns.DEFAULT_STEPS = 5
ns.DEFAULT_VARIANT = "asym5"
ns.DEFAULT_EPS = 1e-10
ns.MAX_STEPS = 1000

local VARIANT_MSG = "ns_variant must be 'legacy', 'asym5', 'polar_express', 'deepseekv4', 'cans', "
  .. "'polar_express_8', 'aol', 'cubic5', or 'custom', got "

local function repr(v)
  if type(v) == "string" then return "'" .. v .. "'" end
  if type(v) == "table" then
    local parts = {}
    for i = 1, #v do parts[i] = repr(v[i]) end
    return "(" .. table.concat(parts, ", ") .. ")"
  end
  return tostring(v)
end

local function is_int(v)
  return type(v) == "number" and v == math.floor(v) and v == v and v > -math.huge and v < math.huge
end

local function finite(v)
  return type(v) == "number" and v == v and v > -math.huge and v < math.huge
end

-- Validate (variant, steps, custom) like the seed's Muon constructor.
-- Returns the normalized custom list (copied, numbers) or nil for presets.
local function validate(variant, steps, custom)
  if type(variant) ~= "string" or not (PRESET[variant] or variant == "custom") then
    blame(E.EINVAL, VARIANT_MSG .. repr(variant))
  end
  if not is_int(steps) or steps < 0 then
    blame(E.EINVAL, "ns_steps must be a non-negative integer, got " .. repr(steps))
  end
  -- bound before the coefficient array is allocated (and passed as a C int)
  if steps > ns.MAX_STEPS then
    blame(E.EINVAL, ("ns_steps must be at most %d, got %s"):format(ns.MAX_STEPS, repr(steps)))
  end
  if variant ~= "custom" then
    if custom ~= nil then
      blame(E.EINVAL, "ns_coefficients can only be provided when ns_variant='custom'")
    end
    return nil
  end
  if custom == nil or (type(custom) == "table" and #custom == 0) then
    blame(E.EINVAL, "ns_coefficients must be provided when ns_variant='custom'")
  end
  if type(custom) ~= "table" then
    blame(E.EINVAL, "ns_coefficients must be a list of {a, b, c} triples, got " .. type(custom))
  end
  if steps > #custom then
    blame(E.EINVAL, ("ns_steps=%d exceeds the %d provided coefficient groups"):format(steps, #custom))
  end
  local normalized = {}
  for i = 1, #custom do
    local t = custom[i]
    if type(t) ~= "table" or #t ~= 3 then
      blame(E.EINVAL, ("ns_coefficients[%d] must contain exactly three values, got %s"):format(i - 1, repr(t)))
    end
    for j = 1, 3 do
      if not finite(t[j]) then
        blame(E.EINVAL, ("ns_coefficients[%d] must contain only finite values"):format(i - 1))
      end
    end
    normalized[i] = { t[1], t[2], t[3] }
  end
  return normalized
end

-- ns.validate(variant, steps, custom): raises like the seed; returns the
-- normalized custom triples (or nil for a preset).
function ns.validate(variant, steps, custom)
  return validate(variant, steps == nil and ns.DEFAULT_STEPS or steps, custom)
end

-- Fill a double[3*steps] with the schedule; returns arr, steps, norm_scale.
local warned = {}
local function schedule(variant, steps, custom)
  local normalized = validate(variant, steps, custom)
  local arr = ffi.new("double[?]", math.max(3 * steps, 3))
  local scale = 1.0
  if normalized then
    for k = 1, steps do
      for j = 1, 3 do arr[3 * (k - 1) + j - 1] = normalized[k][j] end
    end
  elseif steps > 0 then
    local sc, ns_out = ffi.new("double[1]"), ffi.new("int[1]")
    local rc = C.mu_ns_preset(variant, steps, arr, steps, sc, ns_out)
    if rc ~= 0 then blame(tonumber(rc), ffi.string(C.mu_last_error())) end
    scale = sc[0]
    if ns_out[0] < steps then
      -- the seed slices its per-step triples (_NS_ASYM5_COEFFS[:steps]):
      -- run the schedule's steps, and say so once per (variant, steps)
      local key = variant .. ":" .. steps
      if not warned[key] then
        warned[key] = true
        io.stderr:write(("muon: ns_steps=%d with ns_variant='%s', which defines %d steps: running those %d "
          .. "(as the seed does)\n"):format(steps, variant, ns_out[0], ns_out[0]))
      end
      steps = ns_out[0]
    end
  else
    local sc, ns_out = ffi.new("double[1]"), ffi.new("int[1]")
    local tmp = ffi.new("double[30]")
    check(C.mu_ns_preset(variant, 0, tmp, 10, sc, ns_out), "ns preset")
    scale = sc[0]
  end
  return arr, steps, scale
end

-- Natural number of steps of a preset (5; 10 deepseekv4, 8 polar_express_8, 4 aol).
local function natural_steps(variant)
  return PRESET[variant] or ns.DEFAULT_STEPS
end

-- ns.coefficients(variant, steps, custom) -> { {a, b, c}, ... }, norm_scale
-- steps defaults to the preset's natural length (5; 10 deepseekv4, 8 polar_express_8, 4 aol).
function ns.coefficients(variant, steps, custom)
  if variant == nil then variant = ns.DEFAULT_VARIANT end
  if steps == nil then steps = variant == "custom" and type(custom) == "table" and #custom or natural_steps(variant) end
  local arr, n, scale = schedule(variant, steps, custom)
  local out = {}
  for k = 1, n do
    out[k] = { arr[3 * k - 3], arr[3 * k - 2], arr[3 * k - 1] }
  end
  return out, scale
end

local OPTION_KEYS = { steps = true, variant = true, eps = true, coefficients = true, path = true,
  workspace = true, norm_scale = true, method = true, dtype = true }
local PATHS = { symmetric = C.MU_NS_SYMMETRIC, plain = C.MU_NS_PLAIN }
ns.METHODS = { "standard", "gram", "auto" }
local METHODS = { standard = C.MU_NS_STANDARD, gram = C.MU_NS_GRAM, auto = C.MU_NS_AUTO }
-- the iteration's precision: "float32" (the tensors' own) or "bfloat16"
-- (the seed's bf16 iteration on float32 tensors; see mu_ns_opts in src/muon_ffi.h)
ns.DTYPES = { "float32", "bfloat16" }
local DTYPES = { float32 = C.MU_F32, bfloat16 = C.MU_BF16 }
local SEED_VARIANTS = { legacy = true, asym5 = true, custom = true }

local function check_keys(opts, allowed)
  local unknown = {}
  for k in pairs(opts) do
    if not allowed[k] then unknown[#unknown + 1] = tostring(k) end
  end
  if #unknown > 0 then
    table.sort(unknown)
    blame(E.EINVAL, "zeropower: " .. E.unknown("option", unknown, allowed))
  end
end

local resolved_mt = { __index = {} }

-- ns.resolve(opts) -> validated, reusable options (holds the C mu_ns_opts
-- and its coefficient array). Keys: steps, variant, eps, coefficients,
-- path ("symmetric" | "plain"), norm_scale (default: the preset's),
-- method ("standard" | "gram" | "auto"; see ns.method_for), dtype
-- ("float32" | "bfloat16": the precision of the iteration).
local function resolve(opts)
  if opts == nil then opts = {} end
  if type(opts) ~= "table" then blame(E.EINVAL, "opts must be a table, got " .. type(opts)) end
  if getmetatable(opts) == resolved_mt then return opts end
  check_keys(opts, OPTION_KEYS)
  local variant = opts.variant == nil and ns.DEFAULT_VARIANT or opts.variant
  local steps = opts.steps
  if steps == nil then steps = PRESET[variant] and natural_steps(variant) or ns.DEFAULT_STEPS end
  local eps = opts.eps == nil and ns.DEFAULT_EPS or opts.eps
  if not finite(eps) or eps < 0 then blame(E.EINVAL, "eps must be a finite number >= 0, got " .. repr(eps)) end
  local path = opts.path == nil and "symmetric" or opts.path
  if PATHS[path] == nil then
    blame(E.EINVAL, "path must be 'symmetric' or 'plain', got " .. repr(path))
  end
  local method = opts.method == nil and "standard" or opts.method
  if METHODS[method] == nil then
    blame(E.EINVAL, "method must be 'standard', 'gram' or 'auto', got " .. repr(method))
  end
  local dtype = opts.dtype == nil and "float32" or opts.dtype
  if DTYPES[dtype] == nil then
    blame(E.EINVAL, "dtype must be 'float32' or 'bfloat16', got " .. repr(dtype))
  end
  local arr, n, scale = schedule(variant, steps, opts.coefficients)
  local precond = PRESET[variant] and C.mu_ns_preset_precond(variant) or C.MU_NS_PRECOND_NONE
  if precond == C.MU_NS_PRECOND_AOL and dtype == "bfloat16" then
    blame(E.EINVAL, "variant 'aol' (its AOL preconditioning) runs in float32 only: dtype must be "
      .. "'float32', got 'bfloat16'")
  end
  if variant == "cans" and dtype == "bfloat16" then
    blame(E.EINVAL, "variant 'cans' diverges in bfloat16 (its first step maps singular values to the top of the "
      .. "next steps' range with no margin, and bfloat16 rounding pushes some past it): dtype must be 'float32', "
      .. "got 'bfloat16'")
  end
  if precond == C.MU_NS_PRECOND_AOL and method == "gram" then
    blame(E.EINVAL, "variant 'aol' (its AOL preconditioning) runs the standard iteration: method must be "
      .. "'standard' or 'auto', got 'gram'")
  end
  if opts.norm_scale ~= nil then
    if not finite(opts.norm_scale) or opts.norm_scale <= 0 then
      blame(E.EINVAL, "norm_scale must be a finite number > 0, got " .. repr(opts.norm_scale))
    end
    scale = opts.norm_scale
  end
  local copts = ffi.new("mu_ns_opts")
  copts.steps = n
  copts.coeffs = arr
  copts.eps = eps
  copts.norm_scale = scale
  copts.path = PATHS[path]
  copts.method = METHODS[method]
  copts.precond = precond
  copts.dtype = DTYPES[dtype]
  -- bfloat16: the seed's variants round their coefficients as the seed
  -- does; the other presets apply theirs in float32 (see mu_ns_opts)
  copts.coeffs_f32 = SEED_VARIANTS[variant] and 0 or 1
  return setmetatable({
    variant = variant, steps = n, eps = eps, path = path, norm_scale = scale, method = method,
    dtype = dtype,
    coeffs = arr, -- keeps the array alive for copts
    copts = copts,
  }, resolved_mt)
end

function ns.resolve(opts)
  return resolve(opts)
end

function ns.copy(r)
  if getmetatable(r) ~= resolved_mt then blame(E.EINVAL, "copy: r must be a table ns.resolve returned") end
  local c = {}
  for k, v in pairs(r) do c[k] = v end
  local len = math.max(3 * r.steps, 3)
  c.coeffs = ffi.new("double[?]", len)
  ffi.copy(c.coeffs, r.coeffs, len * ffi.sizeof("double"))
  c.copts = ffi.new("mu_ns_opts", r.copts)
  c.copts.coeffs = c.coeffs
  return setmetatable(c, resolved_mt)
end

-- ns.method_for(rows, cols, opts) -> "standard" or "gram": the iteration
-- opts.method runs for a rows x cols matrix ("auto" resolved by the cost
-- model of src/ns_gram.c).
function ns.method_for(rows, cols, opts)
  if not is_int(rows) or not is_int(cols) or rows < 0 or cols < 0 then
    blame(E.EINVAL, "method_for: rows and cols must be non-negative integers")
  end
  local r = resolve(opts)
  local m = C.mu_ns_method_for(rows, cols, r.copts)
  check(m < 0 and m or 0, "method_for")
  return m == C.MU_NS_GRAM and "gram" or "standard"
end

-- The core-shape rule, written once (the plan, the router, the kinds and
-- `muon check` use it): the matrices Newton-Schulz runs on for a parameter
-- of this shape. 2-D: (A, B); 3-D (A, 1, B): one conv-like (A, B); other
-- N-D: a batch of their last two dims (nd_mode "batch", the default), or
-- one dim-1 x (the rest) matrix (nd_mode "flatten"). Returns rows, cols,
-- the number of matrices, and the dims that make rows and cols (sets of
-- 1-based dims; the others are the batch). 1-D and 0-D shapes have none:
-- nil.
function ns.core(shape, nd_mode)
  local n = #shape
  if n < 2 then return nil end
  if n == 2 then return shape[1], shape[2], 1, { [1] = true }, { [2] = true } end
  if nd_mode == "flatten" then
    local rest, cols = 1, {}
    for d = 2, n do
      rest = rest * shape[d]
      cols[d] = true
    end
    return shape[1], rest, 1, { [1] = true }, cols
  end
  if n == 3 and shape[2] == 1 then return shape[1], shape[3], 1, { [1] = true }, { [3] = true } end
  local batch = 1
  for d = 1, n - 2 do batch = batch * shape[d] end
  return shape[n - 1], shape[n], batch, { [n - 1] = true }, { [n] = true }
end

-- The cost model (src/ns_cost.c, the one the scheduler runs on): flops,
-- bytes and method of one rows x cols matrix with opts (resolved or not;
-- nil: the defaults, resolved once).
local cost_box = ffi.new("mu_ns_cost[1]")
local default_resolved
function ns.cost(rows, cols, opts)
  if not is_int(rows) or not is_int(cols) or rows < 0 or cols < 0 then
    blame(E.EINVAL, "cost: rows and cols must be non-negative integers")
  end
  if opts == nil then
    default_resolved = default_resolved or resolve({})
    opts = default_resolved
  end
  check(C.mu_ns_cost_of(rows, cols, resolve(opts).copts, cost_box), "cost")
  local c = cost_box[0]
  return c.flops, c.bytes, c.method == C.MU_NS_GRAM and "gram" or "standard"
end

-- Summed over the core matrices of a parameter shape (ns.core's rule).
function ns.shape_cost(shape, nd_mode, opts)
  local a, b, batch = ns.core(shape, nd_mode)
  if a == nil then return 0, 0 end
  local flops, bytes = ns.cost(a, b, opts)
  return batch * flops, batch * bytes
end

-- The split share of one rank of a group (mu__split_info_of), or nil for
-- a shape of one block.
local blocks_box, width_box = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
function ns.split_blocks(rows, cols, opts)
  check(C.mu__split_plan(rows, cols, resolve(opts or {}).copts, blocks_box, width_box), "split_blocks")
  return tonumber(blocks_box[0]), tonumber(width_box[0])
end

local info_box = ffi.new("mu__split_info[1]")
function ns.split_cost(rows, cols, opts, group, rank, dtype)
  local r = resolve(opts or {})
  if ns.split_blocks(rows, cols, r) < 2 then return nil end
  check(C.mu__split_info_of(T.dtype_code(dtype or "float32"), rows, cols, r.copts, group, rank, info_box),
    "split_cost")
  local i = info_box[0]
  return { blocks = tonumber(i.blocks), stripes = tonumber(i.stripes), flops = i.flops, bytes_sent = tonumber(i.bytes_sent),
    bytes_recv = tonumber(i.bytes_recv), call_bytes_sent = tonumber(i.call_bytes_sent),
    call_bytes_recv = tonumber(i.call_bytes_recv), exchanges = tonumber(i.exchanges), first_block = tonumber(i.first_block), nblocks = tonumber(i.nblocks),
    dim = i.dim + 1, start = tonumber(i.start), length = tonumber(i.length) }
end

-- ns.workspace(dtype, rows, cols): reusable buffers for matrices up to
-- rows x cols (either orientation), freed by the GC.
function ns.workspace(dtype, rows, cols)
  if not is_int(rows) or not is_int(cols) or rows < 0 or cols < 0 then
    blame(E.EINVAL, "workspace: rows and cols must be non-negative integers")
  end
  local box = ffi.new("mu_ns_workspace *[1]")
  check(C.mu_ns_workspace_new(T.dtype_code(dtype), rows, cols, box), "workspace")
  return ffi.gc(box[0], C.mu_ns_workspace_free)
end

-- (Its contract: the reference block at the top.)
local stats_box = ffi.new("mu_ns_stats")
function ns.workspace_stats(ws, reset)
  check(C.mu_ns_workspace_stats(ws, reset and 1 or 0, stats_box), "workspace_stats")
  local s = stats_box
  local n = tonumber(s.residuals)
  return { seconds = s.seconds, matrices = tonumber(s.matrices), residuals = n, residual_max = n > 0 and s.residual_max or nil,
    residual_rms = n > 0 and math.sqrt(s.residual_sumsq / n) or nil, residual_sumsq = s.residual_sumsq }
end

-- ns.zeropower_into(out, x, resolved, ws): the C call without validation of
-- options (resolved from ns.resolve). x and out: contiguous, same shape
-- (2-D or 3-D) and dtype; out may be x. ws may be nil.
function ns.zeropower_into(out, x, r, ws)
  check(C.mu_ns_zeropower(x, out, r.copts, ws), "zeropower")
  return out
end

-- ns.zeropower_many(outs, xs, rs, ws, count): one C call for count tensors
-- (default #xs): outs[i] = Newton-Schulz of xs[i] with rs[i] (resolved
-- options; or one resolved table for all), as zeropower_into would give it
-- alone. One dtype; ws (may be nil) holds the largest. One scheduler
-- spreads every matrix of the call over the workers (see src/ns.c).
function ns.zeropower_many(outs, xs, rs, ws, count)
  count = count or #xs
  local n = math.max(count, 1)
  local cin, cout = ffi.new("const mu_tensor *[?]", n), ffi.new("mu_tensor *[?]", n)
  local copts = ffi.new("const mu_ns_opts *[?]", n)
  local same = getmetatable(rs) == resolved_mt and rs or nil
  for i = 1, count do
    cin[i - 1], cout[i - 1] = xs[i], outs[i]
    copts[i - 1] = (same or rs[i]).copts
  end
  check(C.mu_ns_zeropower_many(count, cin, cout, copts, ws), "zeropower_many")
  return outs
end

-- ns.zeropower(x, opts) -> a new tensor, x unchanged. x: 2-D (n x m) or 3-D
-- (batch x n x m), contiguous or not, float32 or float64 (float32 with
-- opts.dtype = "bfloat16").
function ns.zeropower(x, opts)
  if not T.is_tensor(x) then blame(E.EINVAL, "zeropower: x must be a tensor") end
  if x:dim() ~= 2 and x:dim() ~= 3 then
    blame(E.ESHAPE, "zeropower: x must be 2-D or 3-D, got " .. x:dim() .. "-D")
  end
  local r = resolve(opts)
  local ws = opts and opts.workspace or nil
  local src = x:is_contiguous() and x or x:contiguous()
  local out = T.zeros(x:size(), x:dtype())
  check(C.mu_ns_zeropower(src, out, r.copts, ws), "zeropower")
  return out
end

return core.strict(ns, "muon.ns")
