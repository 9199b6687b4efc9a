// SPDX-License-Identifier: GPL-2.0-only

//! Who may do what (Documentation/manager-api.rst, "Principals and roles").
//!
//! Every request the manager serves, from the network API or the local socket, comes from a
//! principal: named in the configuration (`[[principals]]`), found by its client
//! certificate's common name, its bearer token or, on the local socket, its user id. Its role
//! decides what it may do:
//!
//! - `admin`: everything;
//! - `reader`: everything that changes nothing;
//! - `tenant`: requests for its own hosts (counted against its fair-share tenant), releases
//!   and sees its own requests and leases, the pools, and the notices of its hosts.
//!
//! The checks are here and nowhere else: [`Principal::authorize`] before a request reaches the
//! scheduler, [`Principal::filter`] on the reply.

use serde_json::Value;

pub use crate::config::{unix_time, PrincipalConfig, Role, ROOT_UID};
use crate::{
    protocol::Request,
    scheduler::{Host, Scheduler},
};

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub role: Role,
    pub hosts: Vec<Host>,
    pub tenant: Option<String>,
    /// The other tenants it may name (`acts_for`; tenants only).
    pub acts_for: Vec<String>,
}

/// Why a request was not served: 401 (who are you?) or 403 (not you).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denied {
    Unauthenticated(String),
    Forbidden(String),
}

impl Denied {
    pub fn status(&self) -> u16 {
        match self {
            Denied::Unauthenticated(_) => 401,
            Denied::Forbidden(_) => 403,
        }
    }
    pub fn reason(&self) -> &str {
        match self {
            Denied::Unauthenticated(r) | Denied::Forbidden(r) => r,
        }
    }
}

/// The principals of a configuration; [`Principals::replace`] swaps in those of a
/// reloaded one (SIGHUP) while every holder of the `Arc` keeps using it.
#[derive(Debug, Default)]
pub struct Principals {
    table: std::sync::RwLock<Table>,
}

#[derive(Clone, Debug, Default)]
struct Table {
    list: Vec<PrincipalConfig>,
    tenants: Vec<String>,
    /// Each principal's token expiry (Unix seconds), by index in `list`.
    expires: Vec<Option<u64>>,
}

fn sha256_hex(s: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, s);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

impl Principals {
    /// Checks the list: unique names, uids and tokens, hosts only for tenants and in range,
    /// tokens as 64 hex digits, tenants that exist.
    pub fn new(
        list: Vec<PrincipalConfig>,
        hosts: u8,
        tenants: Vec<String>,
    ) -> Result<Self, String> {
        crate::config::check_principals(&list, hosts, &tenants)?;
        let expires = list
            .iter()
            .map(|p| p.token_expires.as_ref().and_then(unix_time))
            .collect();
        Ok(Self {
            table: std::sync::RwLock::new(Table {
                list,
                tenants,
                expires,
            }),
        })
    }

    /// Takes the principals of `other` (a reloaded configuration's) in place of these.
    pub fn replace(&self, other: Principals) {
        let new = other
            .table
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *self
            .table
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = new;
    }

    /// The principals' names.
    pub fn names(&self) -> Vec<String> {
        self.read().list.iter().map(|p| p.name.clone()).collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        // The table is replaced whole; a panic elsewhere cannot leave it half-written.
        self.table
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Table {
    fn principal(&self, c: &PrincipalConfig) -> Principal {
        let tenant = c
            .tenant
            .clone()
            .or_else(|| self.tenants.contains(&c.name).then(|| c.name.clone()));
        Principal {
            name: c.name.clone(),
            role: c.role,
            hosts: c.hosts.clone(),
            tenant,
            acts_for: c.acts_for.clone(),
        }
    }
}

impl Principals {
    /// The principal of a client certificate's common name.
    pub fn by_name(&self, name: &str) -> Result<Principal, Denied> {
        let t = self.read();
        t.list
            .iter()
            .find(|p| p.name == name)
            .map(|c| t.principal(c))
            .ok_or_else(|| {
                Denied::Unauthenticated(format!(
                    "the client certificate names '{name}', who is not a principal of this \
                     manager ([[principals]] in its configuration)"
                ))
            })
    }

    /// The principal of a bearer token, if it has not expired.
    pub fn by_token(&self, token: &str) -> Result<Principal, Denied> {
        self.by_token_at(token, crate::clock::unix_now())
    }

    /// [`Principals::by_token`] at Unix time `now`.
    pub fn by_token_at(&self, token: &str, now: u64) -> Result<Principal, Denied> {
        let h = sha256_hex(token.as_bytes());
        let t = self.read();
        let i = t
            .list
            .iter()
            .position(|p| {
                p.token_sha256
                    .as_deref()
                    .is_some_and(|t| t.eq_ignore_ascii_case(&h))
            })
            .ok_or_else(|| {
                Denied::Unauthenticated(
                    "the bearer token is no principal's; ask the manager's operator for one".into(),
                )
            })?;
        let c = &t.list[i];
        if let Some(at) = t.expires.get(i).copied().flatten() {
            if now >= at {
                let when = c
                    .token_expires
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                return Err(Denied::Unauthenticated(format!(
                    "the bearer token of '{}' expired at {when}; ask the manager's operator \
                     for a new one",
                    c.name
                )));
            }
        }
        Ok(t.principal(c))
    }

    /// The principal of a local user on the control socket: root is `admin`.
    pub fn by_uid(&self, uid: u32) -> Result<Principal, Denied> {
        if uid == ROOT_UID {
            return Ok(Principal {
                name: crate::config::ROOT_PRINCIPAL.into(),
                role: Role::Admin,
                hosts: Vec::new(),
                tenant: None,
                acts_for: Vec::new(),
            });
        }
        let t = self.read();
        t.list
            .iter()
            .find(|p| p.uids.contains(&uid))
            .map(|c| t.principal(c))
            .ok_or_else(|| {
                Denied::Forbidden(format!(
                    "local user {uid} is not a principal of this manager; its operator adds \
                     the uid to a [[principals]] entry"
                ))
            })
    }
}

impl Principal {
    fn may_write(&self) -> Result<(), Denied> {
        if self.role == Role::Reader {
            return Err(Denied::Forbidden(format!(
                "'{}' is a reader: it may look, not change anything",
                self.name
            )));
        }
        Ok(())
    }

    fn admin_only(&self, what: &str) -> Result<(), Denied> {
        if self.role != Role::Admin {
            return Err(Denied::Forbidden(format!(
                "'{}' is a {}: {what} is for admins",
                self.name,
                role_name(self.role)
            )));
        }
        Ok(())
    }

    fn own_host(&self, host: Host, what: &str) -> Result<(), Denied> {
        if self.role == Role::Tenant && !self.hosts.contains(&host) {
            return Err(Denied::Forbidden(format!(
                "tenant '{}' may {what} for hosts {:?} only, not host {host}",
                self.name, self.hosts
            )));
        }
        Ok(())
    }

    /// The tenant a tenant principal's request or composition counts against: its own when
    /// it names none or its own, one of its `acts_for` when it names that one; any other is
    /// refused, so a tenant never spends another tenant's share it was not given.
    fn tenant_for(&self, asked: Option<String>, what: &str) -> Result<Option<String>, Denied> {
        match asked {
            None => Ok(self.tenant.clone()),
            Some(t) if Some(&t) == self.tenant.as_ref() || self.acts_for.contains(&t) => {
                Ok(Some(t))
            }
            Some(t) => Err(Denied::Forbidden(format!(
                "'{}' may not count {what} against tenant '{t}': it counts against {}{}",
                self.name,
                self.tenant
                    .as_deref()
                    .map_or_else(|| "'default'".to_string(), |m| format!("'{m}'")),
                if self.acts_for.is_empty() {
                    String::new()
                } else {
                    format!(" or acts for {:?} ([[principals]] acts_for)", self.acts_for)
                }
            ))),
        }
    }

    /// Checks `req` against this principal and the state it acts on, and returns the
    /// request to serve: a new request carries the principal as its owner and, for a
    /// tenant, the principal's fair-share tenant.
    pub fn authorize(&self, req: Request, s: &Scheduler) -> Result<Request, Denied> {
        match req {
            Request::Request { mut spec } => {
                self.may_write()?;
                self.own_host(spec.host, "request")?;
                if self.role == Role::Tenant {
                    spec.tenant = self.tenant_for(spec.tenant.take(), "requests")?;
                }
                spec.owner = Some(self.name.clone());
                Ok(Request::Request { spec })
            }
            Request::Release { id } => {
                self.may_write()?;
                if self.role == Role::Tenant {
                    let owner = s
                        .leases
                        .get(&id)
                        .map(|l| &l.spec)
                        .or_else(|| s.queue.iter().find(|q| q.id == id).map(|q| &q.spec))
                        .map(|spec| spec.owner.as_deref());
                    match owner {
                        // The scheduler says "no such request" itself.
                        None => {}
                        Some(o) if o == Some(self.name.as_str()) => {}
                        Some(_) => {
                            return Err(Denied::Forbidden(format!(
                                "request {id} is not '{}''s: a tenant releases only its own",
                                self.name
                            )))
                        }
                    }
                }
                Ok(Request::Release { id })
            }
            Request::Heartbeat { host } => {
                self.may_write()?;
                self.own_host(host, "send heartbeats")?;
                Ok(req)
            }
            Request::Compose {
                host,
                functions,
                priority,
                duration_s,
                tenant,
                owner: _,
            } => {
                self.may_write()?;
                self.own_host(host, "compose")?;
                let mut tenant = tenant;
                if self.role == Role::Tenant {
                    tenant = self.tenant_for(tenant, "a composition")?;
                    // The leases it would end must be its own (the scheduler refuses an
                    // impossible plan itself).
                    if let Ok(plan) = s.composition_plan(host, &functions) {
                        for id in plan.release {
                            let o = s.leases.get(&id).and_then(|l| l.spec.owner.as_deref());
                            if o != Some(self.name.as_str()) {
                                return Err(Denied::Forbidden(format!(
                                    "the composition would end lease {id}, which is not \
                                     '{}''s: a tenant releases only its own",
                                    self.name
                                )));
                            }
                        }
                    }
                }
                Ok(Request::Compose {
                    host,
                    functions,
                    priority,
                    duration_s,
                    tenant,
                    owner: Some(self.name.clone()),
                })
            }
            Request::HostDown { .. } => {
                self.admin_only("declaring a host down")?;
                Ok(req)
            }
            Request::SetHealth { .. } => {
                self.admin_only("taking a device out of the pool or back")?;
                Ok(req)
            }
            Request::State | Request::Log { .. } | Request::Telemetry
                if self.role == Role::Tenant =>
            {
                Err(Denied::Forbidden(format!(
                    "'{}' is a tenant: the whole state, the log and the telemetry are for \
                     readers and admins",
                    self.name
                )))
            }
            Request::Events { host: Some(h), .. } if self.role == Role::Tenant => {
                self.own_host(h, "see notices")?;
                Ok(req)
            }
            Request::Events { host: None, since } if self.role == Role::Tenant => {
                // A tenant's notices are those of its hosts: asked for all, it gets those.
                Ok(Request::Events { host: None, since })
            }
            Request::Queue
            | Request::Leases
            | Request::Pool
            | Request::Hosts
            | Request::Events { .. }
            | Request::State
            | Request::Log { .. }
            | Request::Telemetry => Ok(req),
        }
    }

    /// What of a reply this principal sees: a tenant, only its own requests and leases and
    /// its hosts' notices.
    pub fn filter(&self, req: &Request, mut reply: Value) -> Value {
        if self.role != Role::Tenant {
            return reply;
        }
        let own = |v: &Value| v.get("owner").and_then(Value::as_str) == Some(self.name.as_str());
        let key = match req {
            Request::Queue => "queue",
            Request::Leases => "leases",
            Request::Events { .. } => "events",
            _ => return reply,
        };
        if let Some(a) = reply.get_mut(key).and_then(Value::as_array_mut) {
            match req {
                Request::Events { .. } => a.retain(|n| {
                    n.get("host")
                        .and_then(Value::as_u64)
                        .is_some_and(|h| self.hosts.iter().any(|&m| u64::from(m) == h))
                }),
                _ => a.retain(own),
            }
        }
        reply
    }
}

/// A role's name as the configuration spells it.
pub fn role_name(r: Role) -> &'static str {
    match r {
        Role::Admin => "admin",
        Role::Tenant => "tenant",
        Role::Reader => "reader",
    }
}

#[cfg(test)]
mod tests;
