-- Argo CD health check for metis.astraeus.io/KnowledgeBase, under the argocd-cm key
-- resource.customizations.health.metis.astraeus.io_KnowledgeBase (manifests/argocd/argocd-cm.yaml).
-- Read from the status the operator writes: its Paused, Ready, Stalled and Reconciling conditions
-- (else its state), and its observedGeneration against metadata.generation.
--   Suspended:   the base is paused (annotation metis.astraeus.io/paused: "true")
--   Progressing: no status yet, a spec change not observed yet, Pending/Starting/Indexing/Waiting
--   Degraded:    Failed (it will not progress until someone changes something)
--   Healthy:     Ready at the current generation
local hs = {}

local function condition(kind)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

-- "<reason>: <why>": a condition's reason is one word (the state, for Ready, Reconciling and
-- Stalled), its message the operator's sentence.
local function said(reason, why)
  if reason ~= nil and why ~= nil and why ~= "" then
    return reason .. ": " .. why
  end
  return reason or why or ""
end

local paused = condition("Paused")
if paused ~= nil and paused.status == "True" then
  hs.status = "Suspended"
  hs.message = said(paused.reason, paused.message)
  if obj.status.state ~= nil then
    hs.message = hs.message .. " (left in state " .. obj.status.state .. ")"
  end
  return hs
end

if obj.status == nil or obj.status.state == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report the base's state"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and observed ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. generation
  if observed ~= nil then
    hs.message = hs.message .. " (status is of generation " .. observed .. ")"
  end
  return hs
end

local ready = condition("Ready")
local stalled = condition("Stalled")
local reconciling = condition("Reconciling")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = said(ready.reason, ready.message)
  return hs
end
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = said(stalled.reason, stalled.message)
  return hs
end
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = said(reconciling.reason, reconciling.message)
  if obj.status.progress ~= nil then
    hs.message = hs.message .. " (" .. obj.status.progress .. ")"
  end
  return hs
end

-- No condition settles it (a status written without them): the state alone.
local state = obj.status.state
hs.message = said(state, obj.status.reason)
if state == "Ready" then
  hs.status = "Healthy"
elseif state == "Failed" then
  hs.status = "Degraded"
elseif state == "Pending" or state == "Starting" or state == "Indexing" or state == "Waiting" then
  hs.status = "Progressing"
else
  hs.status = "Unknown"
  hs.message = "Unknown state " .. hs.message
end
return hs
