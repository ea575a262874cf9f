-- muon.optim: the optimizers (reading another name is an error).
return require("muon.core").strict({
  Muon = require("muon.optim.muon"),
  AdamW = require("muon.optim.adamw"),
}, "muon.optim")
