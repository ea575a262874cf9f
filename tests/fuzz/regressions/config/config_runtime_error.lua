local muon = require('muon')
local ns = require('muon.ns')
return { groups = { { name = 'm', optimizer = 'muon', min_dim = 2, lr = 0.02, weight_decay < 0.01, nonfinite = 'skip' },
    { name = 'a', optimizer = 'adamw', lr = 1e-3, betas = { 0.9, 0.95 } } },
  schedule = function(step, g) return { lr = g.base_lr / step } end,
  hooks = {
    reshape_fn = function(name, x) if name:find('wq') then return { x:view({ 2, 3, 4 }) } end end,
    zeropower_fn = function(x, steps) return ns.zeropower(x, { steps = steps, variant = 'asym5' }) end,
    post_update_fn = function(p, w, ctx) if w:norm() > 10 then w:copy(w:clone():fill(0.1)) end end,
  } }
