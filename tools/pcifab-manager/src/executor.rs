// SPDX-License-Identifier: GPL-2.0-only

//! Executors apply the scheduler's plan to a fabric: the pcifab driver, or a simulation.

use std::collections::BTreeMap;

use crate::driver::Driver;
use crate::scheduler::{Action, Host, Pdfid};

/// Applies bind, unbind and move actions.
pub trait Executor {
    /// Applies one action; the error says what failed and what to do.
    fn apply(&mut self, action: &Action) -> Result<(), String>;
    /// The fabric as it is: function -> host, for the functions in `pdfids`.
    fn fabric(&mut self, pdfids: &[Pdfid]) -> Result<BTreeMap<Pdfid, Host>, String>;
    fn name(&self) -> &'static str;
    /// Whether this manager may change the fabric now: the daemon asks immediately before
    /// every action, and applies none while the answer is an error (a deposed or cut-off
    /// leader of a highly available manager, [`Fenced`]). Always yes otherwise.
    fn ready(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// The fence [`Executor::ready`] asks, for changes of the fabric made beside the
    /// executor (a scrub's bind, in its own thread); none: always ready.
    fn fence(&self) -> Option<std::sync::Arc<dyn Fence>> {
        None
    }
}

/// The check a leader passes before each change of the fabric (Documentation/manager.rst,
/// "Fencing").
pub trait Fence: Send + Sync {
    fn check(&self) -> Result<(), String>;
}

/// An executor that changes the fabric only while its fence says so.
pub struct Fenced {
    pub inner: Box<dyn Executor + Send>,
    pub fence: std::sync::Arc<dyn Fence>,
}

impl Executor for Fenced {
    fn apply(&mut self, action: &Action) -> Result<(), String> {
        self.inner.apply(action)
    }

    fn fabric(&mut self, pdfids: &[Pdfid]) -> Result<BTreeMap<Pdfid, Host>, String> {
        self.inner.fabric(pdfids)
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn ready(&mut self) -> Result<(), String> {
        self.fence.check()?;
        self.inner.ready()
    }

    fn fence(&self) -> Option<std::sync::Arc<dyn Fence>> {
        Some(self.fence.clone())
    }
}

/// A simulated fabric in a file that several managers share (`--executor sim --fabric
/// FILE`, the HA tests): the bindings, the highest epoch any manager used, and a journal of
/// every action tried. It plays the part of a fabric that checks epochs itself: an action
/// of an epoch lower than one it has seen is refused (and journaled as refused).
pub struct FileFabric {
    pub path: std::path::PathBuf,
    /// This manager's epoch (0: not highly available).
    pub epoch: i64,
    pub node: String,
    /// The devices' PF/VF relation, for the fabric rules.
    pub pf_of: BTreeMap<Pdfid, Pdfid>,
}

/// What a [`FileFabric`] file holds.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct FabricFile {
    pub bound: BTreeMap<Pdfid, Host>,
    pub epoch: i64,
    pub journal: Vec<FabricEvent>,
}

/// One action tried on a [`FileFabric`].
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct FabricEvent {
    pub epoch: i64,
    pub node: String,
    pub action: Action,
    /// None: applied; else why not.
    pub refused: Option<String>,
}

impl FileFabric {
    /// Reads, changes and writes the file under an exclusive lock.
    fn with<T>(&self, f: impl FnOnce(&mut FabricFile) -> T) -> Result<T, String> {
        use std::os::fd::AsRawFd;
        let lock_path = self.path.with_extension("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| format!("fabric file lock {}: {e}", lock_path.display()))?;
        // SAFETY: flock on a descriptor we own; it is released when `lock` is closed.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(format!(
                "cannot lock {}: {}",
                lock_path.display(),
                std::io::Error::last_os_error()
            ));
        }
        let mut st: FabricFile = match std::fs::read(&self.path) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| format!("fabric file {}: {e}", self.path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => FabricFile::default(),
            Err(e) => return Err(format!("fabric file {}: {e}", self.path.display())),
        };
        let r = f(&mut st);
        let tmp = self.path.with_extension("tmp");
        let text = serde_json::to_vec(&st).map_err(|e| e.to_string())?;
        std::fs::write(&tmp, text)
            .and_then(|_| std::fs::rename(&tmp, &self.path))
            .map_err(|e| format!("fabric file {}: {e}", self.path.display()))?;
        Ok(r)
    }
}

impl Executor for FileFabric {
    fn apply(&mut self, a: &Action) -> Result<(), String> {
        let (epoch, node, pf_of) = (self.epoch, self.node.clone(), self.pf_of.clone());
        self.with(|st| {
            let r = if epoch < st.epoch {
                Err(format!(
                    "fenced: the fabric has seen epoch {} and this manager's is {epoch}",
                    st.epoch
                ))
            } else {
                st.epoch = epoch;
                let mut sim = SimExecutor {
                    bound: std::mem::take(&mut st.bound),
                    pf_of,
                    ..SimExecutor::default()
                };
                let r = sim.apply(a);
                st.bound = sim.bound;
                r
            };
            st.journal.push(FabricEvent {
                epoch,
                node,
                action: a.clone(),
                refused: r.as_ref().err().cloned(),
            });
            r
        })?
    }

    fn fabric(&mut self, pdfids: &[Pdfid]) -> Result<BTreeMap<Pdfid, Host>, String> {
        self.with(|st| {
            st.bound
                .iter()
                .filter(|(f, _)| pdfids.contains(f))
                .map(|(f, h)| (*f, *h))
                .collect()
        })
    }

    fn name(&self) -> &'static str {
        "sim"
    }
}

/// A simulated fabric: checks every action against the fabric rules and logs it.
#[derive(Clone, Debug, Default)]
pub struct SimExecutor {
    /// function -> host.
    pub bound: BTreeMap<Pdfid, Host>,
    /// VF -> its PF.
    pub pf_of: BTreeMap<Pdfid, Pdfid>,
    /// Every action applied, in order.
    pub log: Vec<Action>,
    /// Functions whose next action fails (fault injection).
    pub fail: Vec<Pdfid>,
}

impl SimExecutor {
    /// A fabric of the given devices (PF, VFs), nothing bound.
    pub fn new<'a>(devices: impl IntoIterator<Item = (Pdfid, &'a [Pdfid])>) -> Self {
        let mut s = Self::default();
        for (pf, vfs) in devices {
            for v in vfs {
                s.pf_of.insert(*v, pf);
            }
        }
        s
    }

    fn conflict(&self, pdfid: Pdfid) -> Option<String> {
        if let Some(pf) = self.pf_of.get(&pdfid) {
            if self.bound.contains_key(pf) {
                return Some(format!("VF {pdfid:#06x} while its PF {pf:#06x} is bound"));
            }
        } else if let Some((v, _)) = self
            .pf_of
            .iter()
            .find(|(v, pf)| **pf == pdfid && self.bound.contains_key(v))
        {
            return Some(format!("PF {pdfid:#06x} while its VF {v:#06x} is bound"));
        }
        None
    }
}

impl Executor for SimExecutor {
    fn apply(&mut self, a: &Action) -> Result<(), String> {
        let pdfid = match a {
            Action::Bind { pdfid, .. }
            | Action::Unbind { pdfid, .. }
            | Action::Move { pdfid, .. } => *pdfid,
        };
        if let Some(i) = self.fail.iter().position(|f| *f == pdfid) {
            self.fail.remove(i);
            return Err(format!("simulated failure of {pdfid:#06x}"));
        }
        match *a {
            Action::Bind { pdfid, host } => {
                if let Some(h) = self.bound.get(&pdfid) {
                    return Err(format!("bind {pdfid:#06x}: already bound to host {h}"));
                }
                if let Some(c) = self.conflict(pdfid) {
                    return Err(format!("bind {c}"));
                }
                self.bound.insert(pdfid, host);
            }
            Action::Unbind { pdfid, host } => match self.bound.get(&pdfid) {
                Some(h) if *h == host => {
                    self.bound.remove(&pdfid);
                }
                other => {
                    return Err(format!(
                        "unbind {pdfid:#06x} from host {host}: it is on {other:?}"
                    ))
                }
            },
            Action::Move { pdfid, from, to } => match self.bound.get(&pdfid) {
                Some(h) if *h == from => {
                    self.bound.insert(pdfid, to);
                }
                other => {
                    return Err(format!(
                        "move {pdfid:#06x} from host {from}: it is on {other:?}"
                    ))
                }
            },
        }
        self.log.push(a.clone());
        Ok(())
    }

    fn fabric(&mut self, pdfids: &[Pdfid]) -> Result<BTreeMap<Pdfid, Host>, String> {
        Ok(self
            .bound
            .iter()
            .filter(|(f, _)| pdfids.contains(f))
            .map(|(f, h)| (*f, *h))
            .collect())
    }

    fn name(&self) -> &'static str {
        "sim"
    }
}

/// A simulated fabric shared with whoever wants to look at it (tests).
impl Executor for std::sync::Arc<std::sync::Mutex<SimExecutor>> {
    fn apply(&mut self, action: &Action) -> Result<(), String> {
        self.lock()
            .map_err(|_| "simulated fabric lock poisoned".to_string())?
            .apply(action)
    }

    fn fabric(&mut self, pdfids: &[Pdfid]) -> Result<BTreeMap<Pdfid, Host>, String> {
        self.lock()
            .map_err(|_| "simulated fabric lock poisoned".to_string())?
            .fabric(pdfids)
    }

    fn name(&self) -> &'static str {
        "sim"
    }
}

/// The real fabric through the pcifab driver. Runs on the fabric-manager host, which may bind
/// functions to any host.
pub struct DriverExecutor {
    pub driver: Driver,
}

impl Executor for DriverExecutor {
    fn apply(&mut self, a: &Action) -> Result<(), String> {
        let r = match *a {
            Action::Bind { pdfid, host } => self.driver.bind(pdfid, host),
            Action::Unbind { pdfid, .. } => self.driver.unbind(pdfid),
            Action::Move { pdfid, to, .. } => self.driver.move_to(pdfid, to),
        };
        r.map_err(|e| format!("{} on {}: {e}", e.what, self.driver.path))
    }

    fn fabric(&mut self, pdfids: &[Pdfid]) -> Result<BTreeMap<Pdfid, Host>, String> {
        Ok(self
            .driver
            .functions()?
            .into_iter()
            .filter(|f| f.flags & pcifab_uapi::FN_BOUND != 0 && pdfids.contains(&f.pdfid))
            .map(|f| (f.pdfid, f.bound_host))
            .collect())
    }

    fn name(&self) -> &'static str {
        "driver"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_enforces_pf_vf_rule() {
        let vfs = [0x121u16, 0x122];
        let mut s = SimExecutor::new([(0x120u16, &vfs[..])]);
        s.apply(&Action::Bind {
            pdfid: 0x121,
            host: 0,
        })
        .expect("vf");
        assert!(s
            .apply(&Action::Bind {
                pdfid: 0x120,
                host: 1
            })
            .is_err());
        assert!(s
            .apply(&Action::Bind {
                pdfid: 0x121,
                host: 1
            })
            .is_err());
        s.apply(&Action::Move {
            pdfid: 0x121,
            from: 0,
            to: 1,
        })
        .expect("move");
        assert!(s
            .apply(&Action::Unbind {
                pdfid: 0x121,
                host: 0
            })
            .is_err());
        s.apply(&Action::Unbind {
            pdfid: 0x121,
            host: 1,
        })
        .expect("unbind");
        s.apply(&Action::Bind {
            pdfid: 0x120,
            host: 1,
        })
        .expect("pf");
        assert_eq!(s.log.len(), 4);
    }
}
