-- The post_update_fn phase of a step (muon.step, phase 5), for the groups
-- whose kind has post_update and whose config sets post_update_fn. It runs
-- before the commit, on private copies: each stepping parameter's copy
-- (muon.scratch's stand-in, refreshed from its committed value) takes the
-- step's apply, then the hook runs on it; the commit copies it into the
-- parameter once every check passed on every rank. So a hook that fails,
-- writes NaN, runs out of its budget, or writes something it kept from an
-- earlier step changes nothing.
--
--   local PP = require("muon.post_phase")
--   PP.runs(G, gr)                      -- whether group G runs the hook in this step (gr: its run.g entry)
--   local pp = PP.new({ groups =, scratch =, ctrl = })
--   pp:stage(run, rec)                  -- the copies, with the apply (checked first: muon.commit_checks)
--   pp:run(run, rec, index_of)          -- the hooks (every rank, every stepping parameter); raises the first error
-- (rec: param -> plan record; index_of: param -> registration number, the
-- same on every rank.)
local K = require("muon.optim.kind")
local Rd = require("muon.reduce")
local CC = require("muon.commit_checks")

local PP = {}
local Phase = {}
Phase.__index = Phase

-- Whether group G runs post_update_fn in this step (the same on every
-- rank: the config, the stepping set and the skipped groups are agreed).
function PP.runs(G, gr)
  return not gr.skip and G.kind.post_update ~= nil and G.options.post_update_fn ~= nil and #gr.params > 0
end

-- opts: groups (the step's), scratch (muon.scratch), ctrl (the control
-- communicator: the hooks' reductions on a mesh).
function PP.new(opts)
  return setmetatable({ groups = opts.groups, scratch = opts.scratch, ctrl = opts.ctrl, W = opts.ctrl:size() }, Phase)
end

-- The copies (gr.stand_ins, one per stepping parameter), the apply checked
-- as CC.apply checks the other groups', then done in the copies (unless
-- the check skips the group).
function Phase:stage(run, rec)
  for gi, G in ipairs(self.groups) do
    local gr = run.g[gi]
    if PP.runs(G, gr) then
      local stand_ins = {}
      for i, p in ipairs(gr.params) do stand_ins[i] = self.scratch:stand_in(p) end
      gr.stand_ins = stand_ins
      local applies = CC.apply(G, gr, CC.parts(G, gr, rec, self.scratch, stand_ins))
      if not gr.skip_derived then CC.write(applies) end
    end
  end
end

-- Whether a hook of this step's post phase may reduce across ranks.
function Phase:_reduces(run)
  for gi, G in ipairs(self.groups) do
    if PP.runs(G, run.g[gi]) then
      for _, h in ipairs(G.kind.HOOKS) do
        if K.HOOK_NAMES[h].reduces and not K.HOOK_NAMES[h].whole and G.options[h] ~= nil then return true end
      end
    end
  end
  return false
end

-- post_update_fn on the copies of every group that runs it, each
-- parameter with its piece's box (1-based start, length); on a mesh the
-- hooks' reductions are one session's collectives, which every rank
-- finishes (a rank whose hook raised too). Raises the first error.
function Phase:run(run, rec, index_of)
  local sess
  if self.W > 1 and self:_reduces(run) then
    self.session = self.session or Rd.session(self.ctrl)
    sess = self.session:reset()
  end
  local failure
  for gi, G in ipairs(self.groups) do
    local gr = run.g[gi]
    if PP.runs(G, gr) and failure == nil then
      local boxes, reducers = {}, sess and {}
      for i, p in ipairs(gr.params) do
        local r = rec[p]
        local b = r.mine
        local start = {}
        for d = 1, #b.start do start[d] = b.start[d] + 1 end
        boxes[i] = { start = start, len = b.len }
        if sess then reducers[i] = sess:reducer("post_update_fn", index_of[p], p.name, b.len, r.holds) end
      end
      local ok, e = pcall(G.kind.post_update, G.options, gr.hp, gr.stand_ins, boxes, run.signals, reducers)
      if not ok then failure = e end
    end
  end
  if sess then
    local ok, e = pcall(sess.finish, sess, failure ~= nil)
    if not ok and failure == nil then failure = e end
  end
  if failure ~= nil then error(failure, 0) end
end

return PP
