// SPDX-License-Identifier: GPL-2.0-only

//! The one client of the control socket, used by `pcifab` (request, release, queue, leases)
//! and `pcifab-manager --ask`: one request line, one reply line, through the socket or, on a
//! kernel without UNIX sockets, the spool directory `SOCKET.d` (crate::spool).

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::Path,
};

/// Why a request did not get a reply: the message and, when a call failed, its errno.
#[derive(Debug)]
pub struct Failure {
    pub msg: String,
    pub errno: Option<i32>,
}

fn failed(msg: String, e: &std::io::Error) -> Failure {
    Failure {
        msg,
        errno: e.raw_os_error(),
    }
}

/// Sends `line` (one JSON request) to the manager at `socket`; returns its reply line.
pub fn ask(socket: &Path, line: &str) -> Result<String, Failure> {
    let mut s = match UnixStream::connect(socket) {
        Ok(s) => s,
        Err(e) if crate::spool::no_unix_sockets(&e) => {
            let dir = crate::spool::dir_for(socket);
            return crate::spool::ask(&dir, line).map_err(|msg| Failure {
                msg: format!("cannot reach the manager at {}: {msg}", dir.display()),
                errno: None,
            });
        }
        Err(e) => {
            return Err(failed(
                format!(
                    "cannot reach the manager at {}: {e}; is pcifab-manager running?",
                    socket.display()
                ),
                &e,
            ))
        }
    };
    writeln!(s, "{}", line.trim()).map_err(|e| {
        failed(
            format!("cannot send to the manager at {}: {e}", socket.display()),
            &e,
        )
    })?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply).map_err(|e| {
        failed(
            format!("no reply from the manager at {}: {e}", socket.display()),
            &e,
        )
    })?;
    if reply.is_empty() {
        return Err(Failure {
            msg: format!(
                "the manager at {} closed the connection without a reply",
                socket.display()
            ),
            errno: None,
        });
    }
    Ok(reply)
}

/// How long a request to a list of managers keeps trying while none leads (a failover
/// takes the leader lease's TTL and a little more).
pub const FOLLOW_FOR: std::time::Duration = std::time::Duration::from_secs(20);

/// A manager reached over the network API (Documentation/manager-api.rst).
#[derive(Clone, Debug, Default)]
pub struct Remote {
    /// `https://HOST:PORT` of the manager.
    pub url: String,
    /// The CA certificates (PEM) the manager's certificate must chain to.
    pub ca: Option<std::path::PathBuf>,
    /// This client's certificate chain and key (PEM), for mutual TLS.
    pub cert: Option<std::path::PathBuf>,
    pub key: Option<std::path::PathBuf>,
    /// A bearer token instead of (or with) the certificate.
    pub token: Option<String>,
    /// Longest the whole exchange may take.
    pub timeout: std::time::Duration,
}

fn read(what: &str, p: &Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(p).map_err(|e| failed(format!("cannot read the {what} {}: {e}", p.display()), &e))
}

fn plain(msg: String) -> Failure {
    Failure { msg, errno: None }
}

impl Remote {
    fn agent(&self) -> Result<ureq::Agent, Failure> {
        use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
        if !self.url.starts_with("https://") {
            return Err(plain(format!(
                "the manager URL {} is not https://HOST:PORT (the API speaks only TLS)",
                self.url
            )));
        }
        let mut tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .unversioned_rustls_crypto_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ));
        match &self.ca {
            Some(ca) => {
                let pem = read("CA file", ca)?;
                let certs: Vec<Certificate<'static>> = ureq::tls::parse_pem(&pem)
                    .filter_map(|i| match i {
                        Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                        _ => None,
                    })
                    .collect();
                if certs.is_empty() {
                    return Err(plain(format!(
                        "the CA file {} holds no certificate",
                        ca.display()
                    )));
                }
                tls = tls.root_certs(RootCerts::Specific(std::sync::Arc::new(certs)));
            }
            None => {
                return Err(plain(
                    "no CA file for the manager's certificate: give --ca FILE (or `ca` in the \
                     client configuration)"
                        .into(),
                ))
            }
        }
        match (&self.cert, &self.key) {
            (Some(c), Some(k)) => {
                let pem = read("certificate", c)?;
                let chain: Vec<Certificate<'static>> = ureq::tls::parse_pem(&pem)
                    .filter_map(|i| match i {
                        Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                        _ => None,
                    })
                    .collect();
                let key = PrivateKey::from_pem(&read("key", k)?).map_err(|e| {
                    plain(format!(
                        "the key {} is not a PEM private key: {e}",
                        k.display()
                    ))
                })?;
                if chain.is_empty() {
                    return Err(plain(format!(
                        "the certificate file {} holds no certificate",
                        c.display()
                    )));
                }
                tls = tls.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
            }
            (None, None) => {}
            _ => {
                return Err(plain(
                    "a client certificate needs both --cert and --key".into(),
                ))
            }
        }
        let config = ureq::Agent::config_builder()
            .tls_config(tls.build())
            .timeout_global(Some(self.timeout))
            .http_status_as_error(false)
            .build();
        Ok(config.into())
    }

    /// Sends `req` to the manager; returns the HTTP status and the JSON reply. `wait_s`
    /// lets an events request wait for a notice.
    ///
    /// `url` may list several managers, comma-separated (the managers of a highly available
    /// fabric, Documentation/manager.rst): the request goes to the first that takes the
    /// connection and is not a standby. While none does (a failover), the list is tried
    /// again for up to [`FOLLOW_FOR`]. A request whose connection was taken is never sent
    /// twice.
    pub fn ask(
        &self,
        req: &crate::protocol::Request,
        wait_s: u64,
    ) -> Result<(u16, serde_json::Value), Failure> {
        let urls: Vec<&str> = self.url.split(',').map(str::trim).collect();
        if urls.len() == 1 {
            return self.ask_one(urls[0], req, wait_s).map_err(|(f, _)| f);
        }
        let until = std::time::Instant::now() + FOLLOW_FOR.min(self.timeout);
        loop {
            let mut tried = Vec::new();
            for u in &urls {
                match self.ask_one(u, req, wait_s) {
                    Ok((_, v))
                        if v.get("standby").and_then(serde_json::Value::as_bool) == Some(true) =>
                    {
                        tried.push(format!("{u}: a standby"));
                    }
                    Ok(r) => return Ok(r),
                    Err((f, true)) => tried.push(f.msg),
                    Err((f, false)) => return Err(f),
                }
            }
            if std::time::Instant::now() >= until {
                return Err(plain(format!(
                    "no manager of {} leads: {}",
                    self.url,
                    tried.join("; ")
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// One manager: the reply, or the failure and whether the connection was refused
    /// (nothing was sent, so another manager may be asked).
    fn ask_one(
        &self,
        base: &str,
        req: &crate::protocol::Request,
        wait_s: u64,
    ) -> Result<(u16, serde_json::Value), (Failure, bool)> {
        let one = Remote {
            url: base.to_string(),
            ..self.clone()
        };
        let agent = one.agent().map_err(|f| (f, false))?;
        let (method, path, body) = crate::api::http_of(req, wait_s);
        let url = format!("{}{path}", base.trim_end_matches('/'));
        let mut b = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(t) = &self.token {
            b = b.header("Authorization", format!("Bearer {t}"));
        }
        let body = body.map(|v| v.to_string()).unwrap_or_default();
        if !body.is_empty() {
            b = b.header("Content-Type", "application/json");
        }
        let request = b.body(body).map_err(|e| {
            (
                plain(format!("cannot make the request for {url}: {e}")),
                false,
            )
        })?;
        let mut resp = agent.run(request).map_err(|e| {
            let refused = match &e {
                ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => true,
                ureq::Error::Io(io) => io.kind() == std::io::ErrorKind::ConnectionRefused,
                _ => false,
            };
            let f = plain(format!(
                "cannot reach the manager at {base}: {e}; check the URL, that the manager \
                 runs with [api], and the CA file"
            ));
            (f, refused)
        })?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().map_err(|e| {
            (
                plain(format!("no reply from the manager at {base}: {e}")),
                false,
            )
        })?;
        let v = serde_json::from_str(&text).map_err(|e| {
            (
                plain(format!(
                    "the manager at {base} answered {status} with something that is not JSON \
                     ({e}): {text:?}"
                )),
                false,
            )
        })?;
        Ok((status, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_manager_is_a_failure_with_its_errno() {
        let f = ask(Path::new("/nonexistent/pcifab.sock"), "{\"op\":\"queue\"}")
            .expect_err("no manager");
        assert_eq!(f.errno, Some(libc::ENOENT));
        assert!(f.msg.contains("is pcifab-manager running"), "{}", f.msg);
    }
}
