// SPDX-License-Identifier: GPL-2.0-only

//! Fair share between tenants: each tenant's use of the pools (GPU-seconds) decays with a
//! half-life, and a tenant whose share of that decayed use is furthest below its share of
//! the weights ranks first among requests of equal effective priority. The factor is the
//! classic one of Slurm's multifactor priority plugin: `F = 2^(-U/S)`, `U` the tenant's
//! decayed use over all tenants' decayed use, `S` its weight over the sum of the weights;
//! `F` is 1 for a tenant that used nothing, 0.5 for one that used exactly its share and
//! falls towards 0 above it. `Documentation/manager.rst`, "Fair share", states the rule.

use serde::{Deserialize, Serialize};

use super::Secs;

/// One tenant's use, as of `at`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Decayed use, GPU-seconds (a whole GPU held one second counts 1, a VF 1/VFs of its
    /// device).
    pub gpu_s: f64,
    /// GPUs its leases hold now (same units), the rate at which `gpu_s` grows.
    pub rate: f64,
    /// Functions its leases hold now (what `quota` limits).
    pub functions: usize,
    /// GPU-seconds used since the scheduler started, without decay (statistics, benchmark).
    pub total_gpu_s: f64,
    /// When `gpu_s` and `total_gpu_s` were brought up to date.
    pub at: Secs,
}

impl Usage {
    /// Decayed use at `now` (no change for a clock that went back).
    pub fn decayed_at(&self, now: Secs, half_life_s: u64) -> f64 {
        let dt = now.saturating_sub(self.at) as f64;
        if dt == 0.0 {
            return self.gpu_s;
        }
        if half_life_s == 0 {
            return self.gpu_s + self.rate * dt;
        }
        // dU/dt = rate - lambda U, lambda = ln 2 / half-life.
        let h = half_life_s as f64;
        let decay = (-dt / h).exp2();
        let lambda = std::f64::consts::LN_2 / h;
        self.gpu_s * decay + self.rate * (1.0 - decay) / lambda
    }

    /// GPU-seconds used since the start, without decay, at `now`.
    pub fn total_at(&self, now: Secs) -> f64 {
        self.total_gpu_s + self.rate * now.saturating_sub(self.at) as f64
    }

    /// Brings the use up to `now`.
    pub fn advance(&mut self, now: Secs, half_life_s: u64) {
        if now <= self.at {
            return;
        }
        self.gpu_s = self.decayed_at(now, half_life_s);
        self.total_gpu_s += self.rate * (now - self.at) as f64;
        self.at = now;
    }

    /// The tenant's leases now hold `gpus` more GPUs and `functions` more functions (both
    /// may be negative).
    pub fn charge(&mut self, now: Secs, half_life_s: u64, gpus: f64, functions: isize) {
        self.advance(now, half_life_s);
        self.functions = self.functions.saturating_add_signed(functions);
        if self.functions == 0 {
            // Exactly nothing held: no rounding left over from the sums.
            self.rate = 0.0;
        } else {
            self.rate = (self.rate + gpus).max(0.0);
        }
    }
}

/// The fair-share factor of each tenant (`weights[i]`, `used[i]` decayed GPU-seconds).
pub fn factors(weights: &[u32], used: &[f64]) -> Vec<f64> {
    let wsum: f64 = weights.iter().map(|w| f64::from(*w)).sum();
    let usum: f64 = used.iter().sum();
    weights
        .iter()
        .zip(used)
        .map(|(&w, &u)| {
            if usum <= 0.0 || wsum <= 0.0 || w == 0 {
                return 1.0;
            }
            let share = f64::from(w) / wsum;
            (-(u / usum) / share).exp2()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_halves_every_half_life() {
        let mut u = Usage::default();
        u.charge(0, 100, 2.0, 2);
        u.advance(1000, 100);
        // Held long: the decayed use tends to rate / lambda = 2 * 100 / ln 2.
        let steady = 2.0 * 100.0 / std::f64::consts::LN_2;
        assert!((u.gpu_s - steady).abs() < 0.01 * steady, "{u:?}");
        assert!((u.total_gpu_s - 2000.0).abs() < 1e-6);
        u.charge(1000, 100, -2.0, -2);
        assert_eq!((u.rate, u.functions), (0.0, 0));
        let before = u.gpu_s;
        assert!((u.decayed_at(1100, 100) - before / 2.0).abs() < 1e-9);
        // No decay: plain sum.
        let mut v = Usage::default();
        v.charge(0, 0, 1.5, 1);
        assert_eq!(v.decayed_at(10, 0), 15.0);
        // A clock that goes back changes nothing.
        v.advance(10, 0);
        v.advance(5, 0);
        assert_eq!((v.gpu_s, v.at), (15.0, 10));
    }

    #[test]
    fn factor_compares_use_with_share() {
        // Nothing used: every factor is 1.
        assert_eq!(factors(&[1, 2], &[0.0, 0.0]), vec![1.0, 1.0]);
        // Use exactly in proportion to the weights: 0.5 each.
        let f = factors(&[1, 2, 4], &[10.0, 20.0, 40.0]);
        assert!(f.iter().all(|x| (x - 0.5).abs() < 1e-12), "{f:?}");
        // The tenant below its share ranks above the one above it.
        let f = factors(&[1, 1], &[10.0, 30.0]);
        assert!(f[0] > 0.5 && f[1] < 0.5, "{f:?}");
    }
}
