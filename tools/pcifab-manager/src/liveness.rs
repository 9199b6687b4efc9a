// SPDX-License-Identifier: GPL-2.0-only

//! Host liveness from the fabric: a host whose upstream port link is up counts as alive (like
//! a heartbeat); `Documentation/manager.rst` ("Failover") describes it.

use pcifab_uapi::{Port, PORT_HOST};

use crate::driver::Driver;
use crate::scheduler::Host;

/// Where the hosts' link states come from.
pub trait Liveness {
    /// (host, link up) for every host the fabric reports; `host_ports` is the
    /// `[failover] host_ports` setting.
    fn links(&mut self, host_ports: &[u8]) -> Result<Vec<(Host, bool)>, String>;
}

/// The hosts' link states from the inventory's ports. With `host_ports` given, host `i` is
/// the port `host_ports[i]`; without, the host ports in ascending physical port order are
/// hosts 0, 1, ... (how pcifab-emu numbers partitions when `usp_port`s ascend).
pub fn host_links(ports: &[Port], host_ports: &[u8]) -> Result<Vec<(Host, bool)>, String> {
    if host_ports.is_empty() {
        let mut hp: Vec<&Port> = ports.iter().filter(|p| p.kind == PORT_HOST).collect();
        hp.sort_by_key(|p| p.phys_port);
        return Ok(hp
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Host::try_from(i).ok().map(|h| (h, p.link_up != 0)))
            .collect());
    }
    host_ports
        .iter()
        .enumerate()
        .map(|(i, want)| {
            let p = ports.iter().find(|p| p.phys_port == *want).ok_or_else(|| {
                format!(
                    "[failover] host_ports: port {want} (host {i}) is not in the fabric's \
                         inventory; `pcifab list` shows the ports"
                )
            })?;
            if p.kind != PORT_HOST {
                return Err(format!(
                    "[failover] host_ports: port {want} (host {i}) is not a host port \
                     (type {})",
                    p.kind
                ));
            }
            let h = Host::try_from(i).map_err(|_| "more than 256 hosts".to_string())?;
            Ok((h, p.link_up != 0))
        })
        .collect()
}

impl Liveness for Driver {
    fn links(&mut self, host_ports: &[u8]) -> Result<Vec<(Host, bool)>, String> {
        host_links(&self.ports()?, host_ports)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcifab_uapi::PORT_ENDPOINT;

    fn port(phys: u8, kind: u8, up: bool) -> Port {
        Port {
            phys_port: phys,
            kind,
            link_up: u8::from(up),
            ..Port::default()
        }
    }

    #[test]
    fn host_ports_in_order_or_as_configured() {
        let ports = [
            port(8, PORT_HOST, false),
            port(0, PORT_HOST, true),
            port(16, PORT_ENDPOINT, true),
        ];
        assert_eq!(host_links(&ports, &[]), Ok(vec![(0, true), (1, false)]));
        assert_eq!(host_links(&ports, &[8, 0]), Ok(vec![(0, false), (1, true)]));
        assert!(host_links(&ports, &[0, 16])
            .unwrap_err()
            .contains("not a host port"));
        assert!(host_links(&ports, &[0, 9])
            .unwrap_err()
            .contains("not in the fabric"));
    }
}
