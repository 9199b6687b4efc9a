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
