-- Sessions ARGV[6..] that hold a claim or a queue or park entry (those with a lease): owned by
-- ARGV[4], their lease ending ARGV[5] µs from now. Others are left alone.
local owner = ARGV[4]
local ends = now_us() + tonumber(ARGV[5])
for i = 6, #ARGV do
  if redis.call('ZSCORE', K_LEASE, ARGV[i]) then set_lease(ARGV[i], owner, ends) end
end
return 0
