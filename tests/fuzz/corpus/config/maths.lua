local muon = require('muon')
local T = muon.tensor
local ns = require('muon.ns')
local v = {}
return { groups = { { name = 'm', optimizer = 'muon', min_dim = 2, lr = 0.02, weight_decay = 0.01 },
    { name = 'a', optimizer = 'adamw', lr = 1e-3 } },
  hooks = {
    zeropower_fn = function(x, steps)
      local O = ns.zeropower(x, { steps = steps, variant = 'asym5' })
      local m = (O * O):mean(-1, true)
      local k = table.concat(O:size(), 'x')
      v[k] = v[k] and v[k]:lerp(m, 0.05) or m
      return O / (v[k]:sqrt() + 1e-10)
    end,
    post_update_fn = function(p, w, ctx)
      local m = w:abs():amax()
      if m > 2 then w:mul_(2 / m) end
      w:sub_(w:mul(p.grad:sign():eq(w:sign())), ctx.lr * 0.1)
      local s = T.where(w:gt(0), w, -w):sum(1):norm() + w:matmul(w:transpose(1, 2)):sum()
      if s ~= s then w:masked_fill_(w:ne(w), 0) end
    end,
  } }
