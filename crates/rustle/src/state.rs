//! State that outlives a process or is shared by a fleet of instances: per-user quota
//! usage, sticky sessions, connection counts and client addresses. `redis`: the Redis
//! backend's client, used from the state keeper's thread, never from a worker's request
//! path. `fleet`: the thread that owns that client and keeps this instance's
//! connection counts and client addresses in step with the fleet's.

// The quota calls are used by the quota keeper, on its branch.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod redis;

pub(crate) mod fleet;
