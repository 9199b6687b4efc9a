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
    /// lets an events request wait for a notice. A request that changes something is sent
    /// with a new idempotency key ([`new_key`]), so that it may be sent again safely
    /// ([`Remote::ask_keyed`]).
    pub fn ask(
        &self,
        req: &crate::protocol::Request,
        wait_s: u64,
    ) -> Result<(u16, serde_json::Value), Failure> {
        let key = req.mutates().then(new_key).transpose()?;
        self.ask_keyed(req, wait_s, key.as_deref())
    }

    /// [`Remote::ask`] with the idempotency key `key` (`Idempotency-Key`; a request that
    /// changes nothing ignores it).
    ///
    /// `url` may list several managers, comma-separated (the managers of a highly available
    /// fabric, Documentation/manager.rst): the request goes to the first that takes the
    /// connection and is not a standby. While none does (a failover), the list is tried
    /// again for up to [`FOLLOW_FOR`]. A request sent without a key is never sent twice.
    /// One with a key whose outcome is unknown (the connection dropped after it was sent,
    /// no reply in time, or a reply of 500 or 503: the leader died, was deposed or lost
    /// etcd) is sent again with the same key, to the list, up to [`MAX_SENDS`] times within
    /// [`FOLLOW_FOR`]: the manager carries it out once and answers a repeat with the reply
    /// it recorded.
    pub fn ask_keyed(
        &self,
        req: &crate::protocol::Request,
        wait_s: u64,
        key: Option<&str>,
    ) -> Result<(u16, serde_json::Value), Failure> {
        let urls: Vec<&str> = self.url.split(',').map(str::trim).collect();
        let key = key.filter(|_| req.mutates());
        let start = std::time::Instant::now();
        let until = start + FOLLOW_FOR.min(self.timeout);
        let mut sends = 0;
        loop {
            let mut tried = Vec::new();
            let mut unknown = false;
            for u in &urls {
                if sends >= MAX_SENDS {
                    break;
                }
                match self.ask_one(u, req, wait_s, key) {
                    Ok((_, v))
                        if urls.len() > 1
                            && v.get("standby").and_then(serde_json::Value::as_bool)
                                == Some(true) =>
                    {
                        tried.push(format!("{u}: a standby"));
                    }
                    Ok((status, v))
                        if key.is_some()
                            && (status == 500 || status == 503)
                            && v.get("replayed").is_none() =>
                    {
                        sends += 1;
                        unknown = true;
                        let e = v.get("error").and_then(serde_json::Value::as_str);
                        tried.push(format!("{u}: {status} {}", e.unwrap_or("")));
                    }
                    Ok(r) => return Ok(r),
                    Err(One::Refused(f)) => tried.push(f.msg),
                    Err(One::Unknown(f)) if key.is_some() => {
                        sends += 1;
                        unknown = true;
                        tried.push(f.msg);
                    }
                    Err(One::Unknown(f) | One::Final(f)) => return Err(f),
                }
            }
            if urls.len() == 1 && !unknown {
                return Err(plain(tried.join("; ")));
            }
            if std::time::Instant::now() >= until || sends >= MAX_SENDS {
                let Some(k) = key.filter(|_| sends > 0) else {
                    return Err(plain(format!(
                        "no manager of {} leads: {}",
                        self.url,
                        tried.join("; ")
                    )));
                };
                return Err(plain(format!(
                    "gave up after sending the request {sends} time(s) in {:.1} s with \
                     idempotency key {k}, without a reply (last: {}); it may or may not have \
                     been carried out: check `pcifab leases` and `pcifab queue` before asking \
                     again",
                    start.elapsed().as_secs_f64(),
                    tried.join("; ")
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// One manager: the reply, or the failure and whether the request may have been
    /// received ([`One`]).
    fn ask_one(
        &self,
        base: &str,
        req: &crate::protocol::Request,
        wait_s: u64,
        key: Option<&str>,
    ) -> Result<(u16, serde_json::Value), One> {
        let one = Remote {
            url: base.to_string(),
            ..self.clone()
        };
        let agent = one.agent().map_err(One::Final)?;
        let (method, path, body) = crate::api::http_of(req, wait_s);
        let url = format!("{}{path}", base.trim_end_matches('/'));
        let mut b = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(t) = &self.token {
            b = b.header("Authorization", format!("Bearer {t}"));
        }
        if let Some(k) = key {
            b = b.header("Idempotency-Key", k);
        }
        let body = body.map(|v| v.to_string()).unwrap_or_default();
        if !body.is_empty() {
            b = b.header("Content-Type", "application/json");
        }
        let request = b
            .body(body)
            .map_err(|e| One::Final(plain(format!("cannot make the request for {url}: {e}"))))?;
        let mut resp = agent.run(request).map_err(|e| {
            let f = plain(format!(
                "cannot reach the manager at {base}: {e}; check the URL, that the manager \
                 runs with [api], and the CA file"
            ));
            match &e {
                ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => One::Refused(f),
                ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                    One::Refused(f)
                }
                ureq::Error::Io(_) | ureq::Error::Timeout(_) => One::Unknown(f),
                _ => One::Final(f),
            }
        })?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().map_err(|e| {
            One::Unknown(plain(format!("no reply from the manager at {base}: {e}")))
        })?;
        let v = serde_json::from_str(&text).map_err(|e| {
            One::Final(plain(format!(
                "the manager at {base} answered {status} with something that is not JSON \
                 ({e}): {text:?}"
            )))
        })?;
        Ok((status, v))
    }
}

/// How one manager failed to answer.
enum One {
    /// The connection was refused: nothing was sent, another manager may be asked.
    Refused(Failure),
    /// The request may have been received (the connection dropped, no reply in time):
    /// sent again only with an idempotency key.
    Unknown(Failure),
    /// Anything else (TLS, a bad URL, a reply that is not JSON): not tried again.
    Final(Failure),
}

/// Most times [`Remote::ask_keyed`] sends one request whose outcome stayed unknown.
pub const MAX_SENDS: u32 = 8;

/// A new idempotency key: 128 random bits from the kernel, in hex.
pub fn new_key() -> Result<String, Failure> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .map_err(|e| {
            failed(
                format!("cannot read /dev/urandom for a request id: {e}"),
                &e,
            )
        })?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
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
