local muon = require('muon')
local T = muon.tensor
return { groups = { { optimizer = 'muon', match = { '^w', '^layers' }, exclude = 'bias', max_dim = 3 },
    { optimizer = 'adamw', match = function(name, shape) return #shape < 2 end, nonfinite = 'error' } },
  hooks = {
    ns_transform_fn = function(name, x)
      local a = x:narrow(1, 1, 2):contiguous()
      return { tensors = { a }, restore = function(updates, out) out:fill(0); out:narrow(1, 1, 2):copy(updates[1]) end }
    end,
    momentum_update_fn = function(grads, bufs, m1, m2, nesterov)
      local out = {}
      for i, g in ipairs(grads) do bufs[i]:copy(g); out[i] = g:clone() end
      return out
    end,
  } }
