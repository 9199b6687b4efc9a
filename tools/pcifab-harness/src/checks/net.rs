// SPDX-License-Identifier: GPL-2.0-only
//! The management network's addresses (h0 is 10.77.k.1 on its link with host k, host k
//! is 10.77.k.2) and the run's TLS material for the manager's API: made once, written under
//! `RESULTS/tls` and installed in every guest.

use std::fs;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::fabric::{Fabric, Host};
use crate::tls::{self, Authority};

/// h0's address on host k's link.
pub fn h0_end(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, k as u8, 1)
}

/// Host k's address on its link with h0.
pub fn host_end(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, k as u8, 2)
}

/// The TLS material of the run: host-side files (under `RESULTS/tls`) and where the guests
/// have them.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// `RESULTS/tls`.
    pub dir: PathBuf,
    /// The principals that have a client certificate, sorted.
    pub principals: Vec<String>,
}

impl TlsFiles {
    /// The CA certificate (host side).
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
    /// The manager's server certificate (host side).
    pub fn manager_cert(&self) -> PathBuf {
        self.dir.join("manager.crt")
    }
    /// The manager's private key (host side).
    pub fn manager_key(&self) -> PathBuf {
        self.dir.join("manager.key")
    }
    /// `principal`'s client certificate (host side).
    pub fn cert(&self, principal: &str) -> PathBuf {
        self.dir.join(format!("{principal}.crt"))
    }
    /// `principal`'s private key (host side).
    pub fn key(&self, principal: &str) -> PathBuf {
        self.dir.join(format!("{principal}.key"))
    }
    /// Guest path of the CA certificate (every host).
    pub fn guest_ca() -> String {
        format!("{}/ca.crt", tls::GUEST_DIR)
    }
    /// Guest path of the manager's certificate (h0 only).
    pub fn guest_manager_cert() -> String {
        format!("{}/manager.crt", tls::GUEST_DIR)
    }
    /// Guest path of the manager's key (h0 only).
    pub fn guest_manager_key() -> String {
        format!("{}/manager.key", tls::GUEST_DIR)
    }
    /// Guest path of `principal`'s certificate (every host).
    pub fn guest_cert(principal: &str) -> String {
        format!("{}/{principal}.crt", tls::GUEST_DIR)
    }
    /// Guest path of `principal`'s key (every host).
    pub fn guest_key(principal: &str) -> String {
        format!("{}/{principal}.key", tls::GUEST_DIR)
    }
}

impl Fabric {
    fn check_mgmt_host(&self, host: usize) -> Result<(), String> {
        if host == 0 || host >= self.hosts.len() {
            return Err(format!(
                "management network: host {host} has no link with h0 (hosts 1 to {} have)",
                self.hosts.len().saturating_sub(1)
            ));
        }
        Ok(())
    }

    /// h0's (the manager's) address as seen from host `host` (>= 1): `10.77.host.1`.
    pub fn manager_addr(&self, host: usize) -> Result<String, String> {
        self.check_mgmt_host(host)?;
        Ok(h0_end(host).to_string())
    }

    /// Host `host`'s (>= 1) own address on its link with h0: `10.77.host.2`.
    pub fn mgmt_addr(&self, host: usize) -> Result<String, String> {
        self.check_mgmt_host(host)?;
        Ok(host_end(host).to_string())
    }

    /// Every address h0 has on the management network, host 1's link first.
    pub fn manager_addrs(&self) -> Vec<String> {
        (1..self.hosts.len())
            .map(|k| h0_end(k).to_string())
            .collect()
    }

    /// The run's TLS material with a client certificate for each of `principals` (see
    /// [`tls::check_principal`]): made once per run (a later call only adds the principals
    /// that are new), written to `RESULTS/tls` and installed in every guest under
    /// `/etc/pcifab/tls` (ca.crt and every principal's NAME.crt and NAME.key on every host;
    /// manager.crt and manager.key on h0 only; keys mode 0600, certificates 0644). Every
    /// call installs everything again, so a host rebooted since gets it back; every host
    /// must be alive.
    pub fn tls_material(&mut self, principals: &[&str]) -> Result<TlsFiles, String> {
        for p in principals {
            tls::check_principal(p)?;
        }
        if self.tls.is_none() {
            let ips: Vec<Ipv4Addr> = (1..self.hosts.len()).map(h0_end).collect();
            self.tls = Some(Authority::new(&ips)?);
        }
        let Some(auth) = self.tls.as_mut() else {
            return Err("TLS material: no CA (harness bug)".into());
        };
        for p in principals {
            auth.add_client(p)?;
        }
        let dir = self.results.join("tls");
        let files = write_host_files(auth, &dir)?;
        let shared: Vec<(String, u32, String)> =
            std::iter::once(("ca.crt".into(), 0o644, auth.ca.clone()))
                .chain(auth.clients.iter().flat_map(|(p, pem)| {
                    [
                        (format!("{p}.crt"), 0o644, pem.cert.clone()),
                        (format!("{p}.key"), 0o600, pem.key.clone()),
                    ]
                }))
                .collect();
        let manager = [
            ("manager.crt".to_string(), 0o644, auth.manager.cert.clone()),
            ("manager.key".to_string(), 0o600, auth.manager.key.clone()),
        ];
        for h in &mut self.hosts {
            let mut want = shared.clone();
            if h.index == 0 {
                want.extend(manager.iter().cloned());
            }
            install(h, &want)?;
        }
        Ok(files)
    }
}

/// Writes the material to `dir` (mode 0700): certificates 0644, keys 0600.
fn write_host_files(auth: &Authority, dir: &Path) -> Result<TlsFiles, String> {
    fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("cannot make {} private: {e}", dir.display()))?;
    let write = |name: &str, mode: u32, text: &str| -> Result<(), String> {
        let path = dir.join(name);
        let tmp = dir.join(format!(".{name}.tmp"));
        let _ = fs::remove_file(&tmp);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        fs::rename(&tmp, &path).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    write("ca.crt", 0o644, &auth.ca)?;
    write("manager.crt", 0o644, &auth.manager.cert)?;
    write("manager.key", 0o600, &auth.manager.key)?;
    for (p, pem) in &auth.clients {
        write(&format!("{p}.crt"), 0o644, &pem.cert)?;
        write(&format!("{p}.key"), 0o600, &pem.key)?;
    }
    Ok(TlsFiles {
        dir: dir.to_path_buf(),
        principals: auth.clients.keys().cloned().collect(),
    })
}

/// Installs `files` (name, mode, PEM text) in the guest's [`tls::GUEST_DIR`] and reads them
/// back: names, modes and bytes must be what was sent.
fn install(h: &mut Host, files: &[(String, u32, String)]) -> Result<(), String> {
    const EOF: &str = "PCIFAB_TLS_EOF";
    let d = tls::GUEST_DIR;
    let mut script = format!("set -e\numask 077\nmkdir -p {d}\nchmod 0755 /etc/pcifab {d}\n");
    let mut names = Vec::new();
    let mut expected = String::new();
    for (name, mode, text) in files {
        if text.lines().any(|l| l == EOF) || !text.ends_with('\n') {
            return Err(format!(
                "TLS material: {name} cannot go through a here-document"
            ));
        }
        script.push_str(&format!(
            "cat > {d}/.{name}.tmp <<'{EOF}'\n{text}{EOF}\nchmod {mode:o} {d}/.{name}.tmp\n\
             mv -f {d}/.{name}.tmp {d}/{name}\n"
        ));
        names.push(name.as_str());
        expected.push_str(&format!("{name} {mode:o}\n"));
    }
    let list = names.join(" ");
    script.push_str(&format!("cd {d}\nstat -c '%n %a' {list}\ncat {list}\n"));
    for (_, _, text) in files {
        expected.push_str(text);
    }
    let out = h
        .run_ok(&script)
        .map_err(|e| format!("installing the TLS material: {e}"))?;
    if out != expected {
        return Err(format!(
            "{}: the TLS material read back from {d} differs from what was installed \
             (got {} bytes, expected {})",
            h.name,
            out.len(),
            expected.len()
        ));
    }
    h.log_note(&format!("TLS material installed in {d}: {list}"));
    Ok(())
}
