// SPDX-License-Identifier: GPL-2.0-only
//! The comparison every check is made of: [`expect_eq`] for one value, [`Checks`] to
//! collect every mismatch of a list before failing.

use std::fmt::Debug;

use serde_json::Value;

/// `Err("what: expected X, got Y")` unless equal.
pub fn expect_eq<T: PartialEq + Debug>(what: &str, expected: T, got: T) -> Result<(), String> {
    if expected == got {
        Ok(())
    } else {
        Err(format!("{what}: expected {expected:?}, got {got:?}"))
    }
}

/// Collects every mismatch of a check list instead of stopping at the first.
pub struct Checks {
    prefix: String,
    errors: Vec<String>,
}

impl Checks {
    pub fn new(prefix: &str) -> Self {
        Checks {
            prefix: prefix.to_string(),
            errors: Vec::new(),
        }
    }

    pub fn eq<T: PartialEq + Debug>(&mut self, what: &str, expected: T, got: T) {
        if let Err(e) = expect_eq(what, expected, got) {
            self.errors.push(e);
        }
    }

    /// Like [`Checks::eq`], showing JSON values as JSON text.
    pub fn eq_json(&mut self, what: &str, expected: Value, got: Value) {
        if expected != got {
            self.errors
                .push(format!("{what}: expected {expected}, got {got}"));
        }
    }

    /// Records a failed check described by `msg`.
    pub fn fail(&mut self, msg: String) {
        self.errors.push(msg);
    }

    pub fn finish(self) -> Result<(), String> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(format!("{}: {}", self.prefix, self.errors.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expect_eq_message() {
        let e = expect_eq("x", 1, 2).unwrap_err();
        assert_eq!(e, "x: expected 1, got 2");
    }
}
