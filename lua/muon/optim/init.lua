-- muon.optim: the optimizers.
return {
  Muon = require("muon.optim.muon"),
  AdamW = require("muon.optim.adamw"),
}
