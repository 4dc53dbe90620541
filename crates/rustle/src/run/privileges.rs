//! Dropping root after binding: a proxy started as root (to listen on ports below 1024)
//! runs as `[process] user` (with its primary group, or `group`) once its listeners are
//! bound.
//! glibc applies the change to every thread of the process, the workers included.

use nix::unistd::{setgid, setgroups, setuid, Gid, Group, Uid, User};

/// Becomes `user` (and `group`); nothing when neither is set. Fails, naming the cause, when
/// a name is unknown or the process may not change (it is not root).
pub(crate) fn drop_to(user: Option<&str>, group: Option<&str>) -> Result<(), String> {
    if user.is_none() && group.is_none() {
        return Ok(());
    }
    let target = match user {
        Some(name) => Some(
            User::from_name(name)
                .map_err(|e| format!("user `{name}`: {e}"))?
                .ok_or_else(|| format!("user `{name}` does not exist"))?,
        ),
        None => None,
    };
    let gid: Gid = match (group, &target) {
        (Some(name), _) => {
            Group::from_name(name)
                .map_err(|e| format!("group `{name}`: {e}"))?
                .ok_or_else(|| format!("group `{name}` does not exist"))?
                .gid
        }
        (None, Some(u)) => u.gid,
        (None, None) => Gid::current(),
    };
    let uid = target.as_ref().map_or_else(Uid::current, |u| u.uid);
    if Uid::current() == uid && Gid::current() == gid {
        return Ok(());
    }
    if !Uid::effective().is_root() {
        return Err(format!(
            "cannot run as {}: only a process started as root can change its user",
            user.or(group).unwrap_or_default()
        ));
    }
    setgroups(&[gid]).map_err(|e| format!("setgroups: {e}"))?;
    setgid(gid).map_err(|e| format!("setgid {gid}: {e}"))?;
    setuid(uid).map_err(|e| format!("setuid {uid}: {e}"))?;
    // Root is gone for good only if it cannot be taken back.
    if !uid.is_root() && setuid(Uid::from_raw(0)).is_ok() {
        return Err("could take root back after dropping it".into());
    }
    Ok(())
}
