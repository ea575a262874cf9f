-- muon.optim: the optimizers, muon.optim.<class> for every kind of the list
-- in muon.optim.kind (reading another name is an error).
local K = require("muon.optim.kind")
local optim = {}
for _, k in ipairs(K.KINDS) do optim[k.class] = require(k.module) end
return require("muon.core").strict(optim, "muon.optim")
