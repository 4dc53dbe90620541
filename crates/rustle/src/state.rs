//! State that outlives a process or is shared by a fleet of instances: per-user quota
//! usage, sticky sessions, connection counts and client addresses. `redis`: the Redis
//! backend's client, used from the state keeper's thread, never from a worker's request
//! path.

// Nothing calls the Redis client outside its tests until the state keeper is wired to it.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod redis;
