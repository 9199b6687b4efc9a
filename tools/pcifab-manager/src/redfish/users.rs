// SPDX-License-Identifier: GPL-2.0-only

//! Redfish users and sessions (Documentation/manager-api.rst, "Redfish logins").
//!
//! A user is a principal of the configuration (`[[principals]]`) with a password: the
//! credentials file (`[api.redfish] users`) names the principal and holds the password's
//! PBKDF2-HMAC-SHA256 hash, never the password. A user acts with its principal's role and
//! hosts, by HTTP Basic authentication or through a session made by logging in
//! (`POST /redfish/v1/SessionService/Sessions`). A session's token is kept only as its
//! SHA-256; a session ends when deleted or when unused for the session timeout.

use std::{
    collections::BTreeMap,
    num::NonZeroU32,
    sync::Mutex,
    time::{Duration, Instant},
};

use base64::{engine::general_purpose::STANDARD_NO_PAD as B64, Engine};
use ring::{pbkdf2, rand::SecureRandom};
use serde::Deserialize;

use crate::auth::Principals;

static ALGORITHM: pbkdf2::Algorithm = pbkdf2::PBKDF2_HMAC_SHA256;
/// The prefix of a stored hash: `$pbkdf2-sha256$i=ITERATIONS$SALT$HASH` (PHC string
/// format, salt and hash in unpadded base64).
const PREFIX: &str = "$pbkdf2-sha256$i=";
/// Iterations `pcifab-manager --hash-password` uses (OWASP's figure for PBKDF2-SHA256).
pub const ITERATIONS: u32 = 600_000;
/// Fewest iterations a stored hash may have.
pub const MIN_ITERATIONS: u32 = 10_000;
/// Most iterations (a hash is checked on every Basic request and login).
const MAX_ITERATIONS: u32 = 10_000_000;
const SALT_LEN: usize = 16;
const HASH_LEN: usize = 32;

/// The credentials file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    users: Vec<UserConfig>,
}

/// One user of the credentials file (`[[users]]`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UserConfig {
    /// The `UserName`: a principal's name.
    name: String,
    /// `$pbkdf2-sha256$i=N$SALT$HASH` (`pcifab-manager --hash-password`).
    password_pbkdf2: String,
}

#[derive(Debug)]
struct Hash {
    iterations: NonZeroU32,
    salt: Vec<u8>,
    hash: Vec<u8>,
}

fn parse_hash(s: &str) -> Result<Hash, String> {
    let form = "`$pbkdf2-sha256$i=ITERATIONS$SALT$HASH` (`pcifab-manager --hash-password` \
                makes one)";
    let rest = s
        .strip_prefix(PREFIX)
        .ok_or_else(|| format!("password_pbkdf2 is not {form}"))?;
    let mut parts = rest.split('$');
    let (Some(i), Some(salt), Some(hash), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("password_pbkdf2 is not {form}"));
    };
    let iterations: u32 = i
        .parse()
        .map_err(|_| format!("password_pbkdf2: i={i} is not a number; it is {form}"))?;
    if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
        return Err(format!(
            "password_pbkdf2: {iterations} iterations; use {MIN_ITERATIONS} to \
             {MAX_ITERATIONS} ({ITERATIONS} is what --hash-password uses)"
        ));
    }
    let salt = B64
        .decode(salt)
        .map_err(|e| format!("password_pbkdf2: the salt is not base64 ({e}); it is {form}"))?;
    let hash = B64
        .decode(hash)
        .map_err(|e| format!("password_pbkdf2: the hash is not base64 ({e}); it is {form}"))?;
    if salt.len() < 8 || hash.len() != HASH_LEN {
        return Err(format!(
            "password_pbkdf2: a salt of at least 8 bytes and a hash of {HASH_LEN} are needed; \
             it is {form}"
        ));
    }
    Ok(Hash {
        iterations: NonZeroU32::new(iterations).ok_or("password_pbkdf2: 0 iterations")?,
        salt,
        hash,
    })
}

/// The stored form of `password` with a fresh random salt and `iterations`.
pub fn hash_password(password: &str, iterations: u32) -> Result<String, String> {
    let n = NonZeroU32::new(iterations).ok_or("iterations must be at least 1")?;
    let mut salt = [0u8; SALT_LEN];
    ring::rand::SystemRandom::new()
        .fill(&mut salt)
        .map_err(|_| "the system's random number generator failed".to_string())?;
    let mut out = [0u8; HASH_LEN];
    pbkdf2::derive(ALGORITHM, n, &salt, password.as_bytes(), &mut out);
    Ok(format!(
        "{PREFIX}{iterations}${}${}",
        B64.encode(salt),
        B64.encode(out)
    ))
}

/// The users of a credentials file.
#[derive(Debug, Default)]
pub struct Users {
    list: BTreeMap<String, Hash>,
}

impl Users {
    /// Reads and checks the credentials file at `path`.
    pub fn load(path: &str, principals: &Principals) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("[api.redfish] users {path}: {e}"))?;
        Self::parse(&text, principals).map_err(|e| format!("[api.redfish] users {path}: {e}"))
    }

    /// Checks a credentials file's text: every user a principal, named once, with a
    /// well-formed hash.
    pub fn parse(text: &str, principals: &Principals) -> Result<Self, String> {
        let f: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut list = BTreeMap::new();
        for u in f.users {
            if principals.by_name(&u.name).is_err() {
                return Err(format!(
                    "user '{}' is no principal: a user acts as the [[principals]] entry of \
                     its name, which has its role",
                    u.name
                ));
            }
            let h =
                parse_hash(&u.password_pbkdf2).map_err(|e| format!("user '{}': {e}", u.name))?;
            if list.insert(u.name.clone(), h).is_some() {
                return Err(format!("user '{}' is named twice", u.name));
            }
        }
        Ok(Self { list })
    }

    /// Whether `password` is `user`'s. An unknown user costs the same work as a known one.
    pub fn verify(&self, user: &str, password: &str) -> bool {
        match self.list.get(user) {
            Some(h) => pbkdf2::verify(
                ALGORITHM,
                h.iterations,
                &h.salt,
                password.as_bytes(),
                &h.hash,
            )
            .is_ok(),
            None => {
                // As much work as a configured user's check.
                let mut out = [0u8; HASH_LEN];
                let n = self
                    .list
                    .values()
                    .next()
                    .map_or(NonZeroU32::MIN, |h| h.iterations);
                pbkdf2::derive(
                    ALGORITHM,
                    n,
                    b"no such user....",
                    password.as_bytes(),
                    &mut out,
                );
                false
            }
        }
    }

    /// The users' names.
    pub fn names(&self) -> Vec<String> {
        self.list.keys().cloned().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// Most sessions open at once (a login past it is refused until one ends).
pub const MAX_SESSIONS: usize = 64;

#[derive(Debug)]
struct Session {
    user: String,
    token_sha256: String,
    last_used: Instant,
}

/// The open sessions.
#[derive(Debug)]
pub struct Sessions {
    timeout: Duration,
    map: Mutex<BTreeMap<String, Session>>,
}

fn sha256_hex(s: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, s);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn random_hex(n: usize) -> Option<String> {
    let mut b = vec![0u8; n];
    ring::rand::SystemRandom::new().fill(&mut b).ok()?;
    Some(b.iter().map(|b| format!("{b:02x}")).collect())
}

impl Sessions {
    /// Sessions that end after `timeout` unused.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            map: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn open(&self, now: Instant) -> std::sync::MutexGuard<'_, BTreeMap<String, Session>> {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let t = self.timeout;
        m.retain(|_, s| now.saturating_duration_since(s.last_used) < t);
        m
    }

    /// A new session of `user`: its id and token; none when [`MAX_SESSIONS`] are open (or
    /// the random number generator failed).
    pub fn create(&self, user: &str, now: Instant) -> Option<(String, String)> {
        let mut m = self.open(now);
        if m.len() >= MAX_SESSIONS {
            return None;
        }
        let id = random_hex(8)?;
        let token = random_hex(32)?;
        m.insert(
            id.clone(),
            Session {
                user: user.to_string(),
                token_sha256: sha256_hex(token.as_bytes()),
                last_used: now,
            },
        );
        Some((id, token))
    }

    /// The session (id, user) of `token`, which counts as a use of it.
    pub fn by_token(&self, token: &str, now: Instant) -> Option<(String, String)> {
        let h = sha256_hex(token.as_bytes());
        let mut m = self.open(now);
        let (id, s) = m.iter_mut().find(|(_, s)| s.token_sha256 == h)?;
        s.last_used = now;
        Some((id.clone(), s.user.clone()))
    }

    /// The user of session `id`.
    pub fn user(&self, id: &str, now: Instant) -> Option<String> {
        self.open(now).get(id).map(|s| s.user.clone())
    }

    /// The open sessions: (id, user).
    pub fn list(&self, now: Instant) -> Vec<(String, String)> {
        self.open(now)
            .iter()
            .map(|(i, s)| (i.clone(), s.user.clone()))
            .collect()
    }

    /// Ends session `id`; whether there was one.
    pub fn delete(&self, id: &str, now: Instant) -> bool {
        self.open(now).remove(id).is_some()
    }
}
