-- Whether a worker fits a request's requirements: the twin of `Requirements.fits`
-- (protocol/requirements.py); change both together, the tests compare them. Inputs were checked
-- by `check_requirements` / `check_worker`, so resolutions are "WxH" digits.
local function is_null(v) return v == nil or v == cjson.null end

local function fits(req, info)
  if #req.labels > 0 then
    local have = {}
    for _, label in ipairs(info.labels) do have[label] = true end
    for _, label in ipairs(req.labels) do
      if not have[label] then return false end
    end
  end
  if not is_null(req.region) and info.region ~= req.region then return false end
  local caps = info.capabilities
  if not is_null(req.codec) then
    local found = false
    if type(caps.codecs) == 'table' then
      for _, codec in ipairs(caps.codecs) do
        if codec == req.codec then found = true break end
      end
    end
    if not found then return false end
  end
  if type(req.codecs) == 'table' and #req.codecs > 0 then
    local sends = {}
    if type(caps.codecs) == 'table' then
      for _, codec in ipairs(caps.codecs) do sends[codec] = true end
    end
    local any = false
    for _, codec in ipairs(req.codecs) do
      if sends[codec] then any = true break end
    end
    if not any then return false end
  end
  if not is_null(req.resolution) then
    local want_w, want_h = string.match(req.resolution, '^(%d+)[xX](%d+)$')
    local have = caps.resolution
    if is_null(have) then have = '0x0' end
    local have_w, have_h = string.match(have, '^(%d+)[xX](%d+)$')
    if tonumber(have_w) < tonumber(want_w) or tonumber(have_h) < tonumber(want_h) then
      return false
    end
  end
  return true
end
