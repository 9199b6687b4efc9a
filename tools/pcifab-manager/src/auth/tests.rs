// SPDX-License-Identifier: GPL-2.0-only

use super::*;
use crate::{
    config::Config,
    scheduler::{RequestSpec, Scheduler, Want},
};

const CONFIG: &str = r#"
[manager]
hosts = 2
tenants = [{ name = "team-a", weight = 1 }, { name = "physics" }, { name = "chemistry" }]

[[pools]]
name = "gpus"
mode = "whole"
devices = [{ pf = 0x300 }, { pf = 0x400 }]

[[principals]]
name = "ops"
role = "admin"
token_sha256 = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"

[[principals]]
name = "h1-job"
role = "tenant"
hosts = [1]
tenant = "team-a"
uids = [1000]

[[principals]]
name = "h0-job"
role = "tenant"
hosts = [0]

[[principals]]
name = "slurm"
role = "tenant"
hosts = [1]
acts_for = ["physics"]

[[principals]]
name = "grafana"
role = "reader"
uids = [1001]
"#;

fn world() -> (Principals, Scheduler) {
    let c = Config::parse(CONFIG).expect("config");
    let p = Principals::new(
        c.principals.clone(),
        c.manager.hosts,
        c.manager.tenants.iter().map(|t| t.name.clone()).collect(),
    )
    .expect("principals");
    (p, Scheduler::new(c))
}

fn spec(host: Host) -> RequestSpec {
    RequestSpec {
        host,
        want: Want::Gpus { count: 1 },
        priority: 1,
        duration_s: Some(60),
        preemptible_by_higher: false,
        migratable: true,
        pool: None,
        tenant: None,
        owner: Some("someone else".into()),
        tag: None,
    }
}

fn forbidden(r: Result<Request, Denied>) -> String {
    match r {
        Err(Denied::Forbidden(m)) => m,
        other => panic!("expected 403, got {other:?}"),
    }
}

#[test]
fn principals_are_found_by_name_token_and_uid() {
    let (p, _) = world();
    assert_eq!(p.by_name("ops").expect("ops").role, Role::Admin);
    // sha256("foo") is the admin's token hash.
    assert_eq!(p.by_token("foo").expect("token").name, "ops");
    assert!(matches!(p.by_token("bar"), Err(Denied::Unauthenticated(_))));
    assert!(matches!(
        p.by_name("mallory"),
        Err(Denied::Unauthenticated(_))
    ));
    assert_eq!(p.by_uid(0).expect("root").role, Role::Admin);
    assert_eq!(p.by_uid(1000).expect("uid").name, "h1-job");
    assert!(matches!(p.by_uid(4242), Err(Denied::Forbidden(_))));
}

#[test]
fn a_tenant_requests_for_its_hosts_only_and_owns_what_it_asks() {
    let (p, mut s) = world();
    let t = p.by_name("h1-job").expect("tenant");
    let m = forbidden(t.authorize(Request::Request { spec: spec(0) }, &s));
    assert!(m.contains("host 0"), "{m}");
    let Request::Request { spec: got } = t
        .authorize(Request::Request { spec: spec(1) }, &s)
        .expect("own host")
    else {
        panic!("not a request")
    };
    assert_eq!(
        got.owner.as_deref(),
        Some("h1-job"),
        "owner comes from the principal"
    );
    assert_eq!(got.tenant.as_deref(), Some("team-a"));
    let mut other = spec(1);
    other.tenant = Some("default".into());
    forbidden(t.authorize(Request::Request { spec: other }, &s));
    // Released only by its owner (or an admin).
    let id = s.submit(got, 0).expect("granted").id;
    let h0 = p.by_name("h0-job").expect("tenant");
    let m = forbidden(h0.authorize(Request::Release { id }, &s));
    assert!(m.contains("its own"), "{m}");
    t.authorize(Request::Release { id }, &s)
        .expect("owner releases");
    p.by_name("ops")
        .expect("admin")
        .authorize(Request::Release { id }, &s)
        .expect("admin releases");
}

#[test]
fn a_principal_acts_only_for_the_tenants_it_is_given() {
    let (p, mut s) = world();
    let named = |tenant: Option<&str>| {
        let mut r = spec(1);
        r.tenant = tenant.map(Into::into);
        Request::Request { spec: r }
    };
    let granted = |r: Result<Request, Denied>| match r {
        Ok(Request::Request { spec }) => spec,
        other => panic!("expected the request, got {other:?}"),
    };
    // Slurm's principal names the job's account's tenant: the request counts against it
    // and is still Slurm's own (only Slurm releases it).
    let slurm = p.by_name("slurm").expect("slurm");
    let got = granted(slurm.authorize(named(Some("physics")), &s));
    assert_eq!(got.tenant.as_deref(), Some("physics"));
    assert_eq!(got.owner.as_deref(), Some("slurm"));
    // Naming none: its own tenant ('default': no tenant is named 'slurm').
    assert_eq!(granted(slurm.authorize(named(None), &s)).tenant, None);
    // A tenant it was not given, or another principal's own, is refused.
    for other in ["chemistry", "team-a"] {
        let m = forbidden(slurm.authorize(named(Some(other)), &s));
        assert!(m.contains(other) && m.contains("acts_for"), "{m}");
    }
    // A tenant principal without acts_for cannot name Slurm's tenants: no impersonation.
    let h1 = p.by_name("h1-job").expect("tenant");
    let m = forbidden(h1.authorize(named(Some("physics")), &s));
    assert!(m.contains("'physics'") && m.contains("'team-a'"), "{m}");
    // A lease made for physics stays Slurm's: physics' own principals may not end it.
    let id = s.submit(got, 0).expect("granted").id;
    assert_eq!(s.leases[&id].spec.tenant_name(), "physics");
    forbidden(h1.authorize(Request::Release { id }, &s));
    slurm
        .authorize(Request::Release { id }, &s)
        .expect("its owner releases");
    // Compositions follow the same rule.
    let compose = |tenant: &str| Request::Compose {
        host: 1,
        functions: vec![0x300],
        priority: 0,
        duration_s: None,
        tenant: Some(tenant.into()),
        owner: None,
    };
    match slurm.authorize(compose("physics"), &s).expect("acts for") {
        Request::Compose { tenant, owner, .. } => {
            assert_eq!(tenant.as_deref(), Some("physics"));
            assert_eq!(owner.as_deref(), Some("slurm"));
        }
        other => panic!("{other:?}"),
    }
    forbidden(slurm.authorize(compose("chemistry"), &s));
    forbidden(h1.authorize(compose("physics"), &s));
}

#[test]
fn readers_only_look_and_tenants_do_not_run_the_fabric() {
    let (p, s) = world();
    let r = p.by_name("grafana").expect("reader");
    forbidden(r.authorize(Request::Request { spec: spec(1) }, &s));
    forbidden(r.authorize(Request::Release { id: 1 }, &s));
    for ok in [
        Request::Queue,
        Request::Leases,
        Request::Pool,
        Request::Hosts,
        Request::State,
    ] {
        r.authorize(ok, &s).expect("reader reads");
    }
    let t = p.by_name("h1-job").expect("tenant");
    forbidden(t.authorize(Request::HostDown { host: 1 }, &s));
    forbidden(t.authorize(
        Request::SetHealth {
            pf: 0x300,
            healthy: false,
            reason: None,
        },
        &s,
    ));
    forbidden(t.authorize(Request::State, &s));
    forbidden(t.authorize(
        Request::Events {
            host: Some(0),
            since: 0,
        },
        &s,
    ));
    t.authorize(Request::Heartbeat { host: 1 }, &s)
        .expect("own host");
    forbidden(t.authorize(Request::Heartbeat { host: 0 }, &s));
}

#[test]
fn a_tenant_sees_its_own_leases_and_its_hosts_notices() {
    let (p, _) = world();
    let t = p.by_name("h1-job").expect("tenant");
    let v = serde_json::json!({"ok": true, "leases": [
        {"id": 1, "owner": "h1-job"}, {"id": 2, "owner": "h0-job"}, {"id": 3, "owner": null}]});
    let f = t.filter(&Request::Leases, v.clone());
    assert_eq!(
        f["leases"],
        serde_json::json!([{"id": 1, "owner": "h1-job"}])
    );
    let admin = p.by_name("ops").expect("admin");
    assert_eq!(admin.filter(&Request::Leases, v.clone()), v);
    let e = serde_json::json!({"ok": true, "events": [{"host": 0}, {"host": 1}]});
    let f = t.filter(
        &Request::Events {
            host: None,
            since: 0,
        },
        e,
    );
    assert_eq!(f["events"], serde_json::json!([{"host": 1}]));
}

#[test]
fn bad_principal_lists_are_refused_with_the_reason() {
    let bad = |extra: &str, want: &str| {
        let e = Config::parse(&format!("{CONFIG}\n{extra}")).expect_err(extra);
        assert!(e.contains(want), "{extra}: {e}");
    };
    bad(
        "[[principals]]\nname = \"ops\"\nrole = \"reader\"",
        "named twice",
    );
    bad(
        "[[principals]]\nname = \"x\"\nrole = \"tenant\"",
        "needs `hosts`",
    );
    bad(
        "[[principals]]\nname = \"x\"\nrole = \"tenant\"\nhosts = [2]",
        "host 2",
    );
    bad(
        "[[principals]]\nname = \"x\"\nrole = \"reader\"\nhosts = [0]",
        "for tenants",
    );
    bad(
        "[[principals]]\nname = \"x\"\nrole = \"reader\"\nuids = [1000]",
        "uid 1000",
    );
    bad(
        "[[principals]]\nname = \"x\"\nrole = \"reader\"\nuids = [0]",
        "uid 0",
    );
    bad(
        "[[principals]]\nname = \"x\"\nrole = \"reader\"\ntoken_sha256 = \"abc\"",
        "64 hex",
    );
    bad(
        "[[principals]]\nname = \"x\"\nrole = \"tenant\"\nhosts = [0]\ntenant = \"nope\"",
        "tenant 'nope'",
    );
    bad(
        "[[principals]]\nname = \"x\"\nrole = \"tenant\"\nhosts = [0]\nacts_for = [\"nope\"]",
        "acts_for names tenant 'nope'",
    );
    bad(
        "[[principals]]\nname = \"x\"\nrole = \"admin\"\nacts_for = [\"physics\"]",
        "`acts_for` is for tenants",
    );
    bad(
        "[[principals]]\nname = \"x\"\nrole = \"root\"",
        "unknown variant",
    );
}

#[test]
fn a_composition_is_held_to_the_same_rules() {
    let (p, mut s) = world();
    let compose = |host, functions: Vec<u16>| Request::Compose {
        host,
        functions,
        priority: 0,
        duration_s: None,
        tenant: None,
        owner: Some("someone else".into()),
    };
    forbidden(
        p.by_name("grafana")
            .expect("reader")
            .authorize(compose(1, vec![0x300]), &s),
    );
    let t = p.by_name("h1-job").expect("tenant");
    forbidden(t.authorize(compose(0, vec![0x300]), &s));
    match t.authorize(compose(1, vec![0x300]), &s).expect("own host") {
        Request::Compose { owner, tenant, .. } => {
            assert_eq!(owner.as_deref(), Some("h1-job"), "owner from the principal");
            assert_eq!(tenant.as_deref(), Some("team-a"));
        }
        other => panic!("{other:?}"),
    }
    // A lease of host 1 owned by the admin: the tenant's composition may not end it.
    let mut admins = spec(1);
    admins.owner = Some("ops".into());
    s.submit(admins, 0).expect("granted");
    let m = forbidden(t.authorize(compose(1, vec![]), &s));
    assert!(m.contains("its own"), "{m}");
    p.by_name("ops")
        .expect("admin")
        .authorize(compose(1, vec![]), &s)
        .expect("admin composes");
}

#[test]
fn offset_date_times_are_unix_times() {
    let t = |s: &str| unix_time(&s.parse::<toml::value::Datetime>().expect("date-time"));
    assert_eq!(t("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(t("2000-03-01T00:00:00Z"), Some(951_868_800));
    assert_eq!(t("2027-01-31T12:30:05Z"), Some(1_801_398_605));
    assert_eq!(t("2027-01-31T14:30:05+02:00"), Some(1_801_398_605));
    // No offset, no instant.
    assert_eq!(t("2027-01-31T12:30:05"), None);
    assert_eq!(t("2027-01-31"), None);
}

/// A token is refused from its expiry on, with the reason; a reload replaces the
/// principals for every holder at once.
#[test]
fn tokens_expire_and_principals_reload() {
    let cfg = |expires: &str, token: &str| {
        let c = Config::parse(&format!(
            "[[principals]]\nname = 'ops'\nrole = 'admin'\ntoken_sha256 = '{}'\n{expires}\n",
            super::sha256_hex(token.as_bytes())
        ))
        .expect("config");
        Principals::new(c.principals, 2, Vec::new()).expect("principals")
    };
    let p = std::sync::Arc::new(cfg("token_expires = 2027-01-31T00:00:00Z", "old"));
    let at = 1_801_353_600; // 2027-01-31T00:00:00Z
    assert_eq!(p.by_token_at("old", at - 1).expect("before").name, "ops");
    match p.by_token_at("old", at) {
        Err(Denied::Unauthenticated(m)) => {
            assert!(m.contains("expired at 2027-01-31T00:00:00Z"), "{m}")
        }
        other => panic!("expected 401, got {other:?}"),
    }
    let holder = p.clone();
    p.replace(cfg("", "new"));
    assert!(holder.by_token_at("old", 0).is_err());
    assert_eq!(
        holder.by_token_at("new", u64::MAX).expect("new").name,
        "ops"
    );
    // Checked: an expiry needs a token and an offset.
    let bad = |t: &str| Config::parse(&format!("[[principals]]\nname='a'\nrole='admin'\n{t}\n"));
    assert!(bad("token_expires = 2027-01-31T00:00:00Z")
        .unwrap_err()
        .contains("token_expires is for a token_sha256"));
    let e = bad(&format!(
        "token_sha256 = '{}'\ntoken_expires = 2027-01-31T00:00:00",
        "0".repeat(64)
    ))
    .unwrap_err();
    assert!(e.contains("with its offset"), "{e}");
}
