//! Keys, principals and grants: every combination of key and action, the tenant file's checks, and that keys never
//! leak into messages.

use super::*;

fn key(raw: &str) -> Key {
    Key::parse(raw).expect("a valid key")
}

fn adapter(raw: &str) -> AdapterKey {
    AdapterKey::parse(raw).expect("a valid adapter key")
}

const TENANTS: &str = r#"{
    "k-team-a": {"adapters": ["team-a/*"], "control": true},
    "k-rollouts": {"adapters": ["team-a/policy", "team-b/policy"]}
}"#;

fn keyring() -> Keyring {
    let tenants = TenantKeys::parse(TENANTS).expect("a valid tenant file");
    Keyring::new(Some(key("k-api")), Some(key("k-admin")), tenants).expect("distinct keys")
}

#[test]
fn without_keys_everyone_may_do_everything() {
    let open = Keyring::open();
    assert!(!open.is_enabled());
    for presented in [None, Some("anything")] {
        let principal = open.authenticate(presented).expect("open");
        assert_eq!(principal, Principal::Anyone);
        for action in [Action::Sample, Action::Control, Action::Admin] {
            assert!(principal.authorize(action, &adapter("x")).is_ok());
        }
    }
}

#[test]
fn with_keys_a_missing_or_unknown_key_is_unauthenticated() {
    let keyring = keyring();
    assert!(keyring.is_enabled());
    for presented in [None, Some(""), Some("k-api "), Some("k-ap"), Some("K-API"), Some("k-api-and-more")] {
        let err = keyring.authenticate(presented).expect_err("refused");
        assert!(matches!(err, CoreError::Unauthenticated(_)), "{presented:?}: {err}");
        assert!(!err.to_string().contains("k-api"), "the message never repeats a key: {err}");
    }
}

#[test]
fn each_key_grants_exactly_its_actions_on_its_adapters() {
    let keyring = keyring();
    let principal = |raw: &str| keyring.authenticate(Some(raw)).expect("known key");
    let (api, admin, team_a, rollouts) =
        (principal("k-api"), principal("k-admin"), principal("k-team-a"), principal("k-rollouts"));
    let cases: Vec<(&Principal, Action, &str, bool)> = vec![
        (&api, Action::Sample, "team-b/policy", true),
        (&api, Action::Sample, "", true),
        (&api, Action::Control, "team-a/x", false),
        (&api, Action::Admin, "team-a/x", false),
        (&admin, Action::Sample, "anything", true),
        (&admin, Action::Control, "anything", true),
        (&admin, Action::Admin, "anything", true),
        (&team_a, Action::Sample, "team-a/policy", true),
        (&team_a, Action::Control, "team-a/policy", true),
        (&team_a, Action::Control, "team-a/nested/deeper", true),
        (&team_a, Action::Sample, "team-b/policy", false),
        (&team_a, Action::Control, "team-b/policy", false),
        (&team_a, Action::Sample, "team-ab", false),
        (&team_a, Action::Sample, "", true),
        (&team_a, Action::Control, "", false),
        (&team_a, Action::Admin, "team-a/policy", false),
        (&rollouts, Action::Sample, "team-b/policy", true),
        (&rollouts, Action::Sample, "team-b/policy2", false),
        (&rollouts, Action::Control, "team-a/policy", false),
    ];
    for (principal, action, target, allowed) in cases {
        let outcome = principal.authorize(action, &adapter(target));
        assert_eq!(outcome.is_ok(), allowed, "{principal:?} {action} {target:?}: {outcome:?}");
        if let Err(err) = outcome {
            assert!(matches!(err, CoreError::PermissionDenied { .. }), "{err}");
            if !target.is_empty() && principal.may(action).is_ok() {
                assert!(err.to_string().contains(target), "the refusal names the adapter: {err}");
            }
        }
    }
    assert!(team_a.may(Action::Control).is_ok() && rollouts.may(Action::Control).is_err());
    assert!(api.may(Action::Sample).is_ok() && api.may(Action::Control).is_err());
    assert!(team_a.may_see(&adapter("team-a/x")) && !team_a.may_see(&adapter("team-b/policy")));
}

#[test]
fn bearer_tokens_are_read_case_insensitively_and_nothing_else_is() {
    assert_eq!(bearer_token("Bearer k-api"), Some("k-api"));
    assert_eq!(bearer_token("bearer  k-api"), Some("k-api"));
    assert_eq!(bearer_token("BEARER k-api "), Some("k-api"));
    for value in ["k-api", "Basic k-api", "Bearer", "Bearer ", "Bearerk-api"] {
        assert_eq!(bearer_token(value), None, "{value:?}");
    }
}

#[test]
fn bad_keys_patterns_and_tenant_files_are_refused_at_start() {
    for bad in ["", "has space", "tab\tkey", "é", &"k".repeat(MAX_KEY_LEN + 1)] {
        assert!(Key::parse(bad).is_err(), "{bad:?}");
    }
    for bad in ["a*b", "*a*", "two words", "", "bad name*"] {
        assert!(AdapterPattern::parse(bad).is_err(), "{bad:?}");
    }
    assert_eq!(AdapterPattern::parse("*").expect("everything"), AdapterPattern::Prefix(String::new()));
    for bad in [
        "[]",
        "not json",
        r#"{"k": {"adapters": ["x"], "contol": true}}"#,
        r#"{"k": {"control": true}}"#,
        r#"{"k": {"adapters": "x"}}"#,
        r#"{"bad key": {"adapters": ["x"]}}"#,
        r#"{"k": {"adapters": ["a*b"]}}"#,
        r#"{"k": {"adapters": ["x"], "paths": ["/srv/adapters/x"]}}"#,
        r#"{"k": {"adapters": ["x"], "paths": ["x/../y"]}}"#,
        r#"{"k": {"adapters": ["x"], "paths": "x"}}"#,
    ] {
        assert!(TenantKeys::parse(bad).is_err(), "{bad}");
    }
    let duplicate = Keyring::new(Some(key("k-team-a")), None, TenantKeys::parse(TENANTS).expect("valid"));
    assert!(matches!(duplicate, Err(KeyConfigError::DuplicateKey(_))));
    let err = Keyring::new(Some(key("k-dup")), Some(key("k-dup")), TenantKeys::default()).expect_err("duplicate");
    assert!(!err.to_string().contains("k-dup"), "{err}");
}

#[test]
fn keys_are_redacted_from_debug_output() {
    let keyring = keyring();
    let shown = format!("{keyring:?} {:?}", key("k-secret"));
    assert!(!shown.contains("k-api") && !shown.contains("k-secret"), "{shown}");
}

#[test]
fn the_same_key_is_the_same_caller_and_equal_grants_are_not() {
    let tenants = r#"{"k-one": {"adapters": ["x"]}, "k-two": {"adapters": ["x"]}}"#;
    let keyring = Keyring::new(Some(key("k-api")), None, TenantKeys::parse(tenants).expect("valid")).expect("keys");
    let who = |raw: &str| keyring.authenticate(Some(raw)).expect("known");
    assert!(who("k-one").is_same_key(&who("k-one")));
    assert!(!who("k-one").is_same_key(&who("k-two")), "the same grant under two keys: two callers");
    assert!(who("k-api").is_same_key(&who("k-api")));
    assert!(!who("k-api").is_same_key(&who("k-one")));
    assert!(Principal::Anyone.is_same_key(&Principal::Anyone), "authentication off: one caller");
}

#[test]
fn each_tenant_key_has_a_cache_scope_of_its_own_and_the_other_callers_share_one() {
    let keyring = keyring();
    let scope = |raw: &str| keyring.authenticate(Some(raw)).expect("known key").cache_scope();
    let tenants: Vec<_> = ["k-team-a", "k-rollouts"].into_iter().map(scope).collect();
    assert!(tenants.iter().all(Option::is_some), "{tenants:?}");
    assert_ne!(tenants[0], tenants[1], "two tenants never share cached prefixes");
    assert_eq!(scope("k-team-a"), tenants[0], "a tenant's scope is stable");
    assert_eq!((scope("k-api"), scope("k-admin")), (None, None));
    assert_eq!(Keyring::open().authenticate(None).expect("open").cache_scope(), None);
}

#[test]
fn a_tenant_loads_only_from_its_paths_and_by_default_from_its_adapter_patterns() {
    let tenants = TenantKeys::parse(
        r#"{"k-paths": {"adapters": ["team-a/*"], "control": true, "paths": ["team-a/", "shared/inits"]},
            "k-default": {"adapters": ["meow", "team-b/*"], "control": true},
            "k-none": {"adapters": ["woof"], "control": true, "paths": []}}"#,
    )
    .expect("a valid tenant file");
    let keyring = Keyring::new(Some(key("k-api")), Some(key("k-admin")), tenants).expect("distinct keys");
    let principal = |raw: &str| keyring.authenticate(Some(raw)).expect("known key");
    let root = Path::new("/srv/adapters");
    let check = |who: &Principal, path: &str| who.check_adapter_path(root, Path::new(path), path).is_ok();
    let cases: Vec<(&str, &str, bool)> = vec![
        ("k-paths", "team-a/step-2", true),
        ("k-paths", "shared/inits/r8", true),
        ("k-paths", "shared/other", false),
        ("k-paths", "team-ab/x", false),
        ("k-paths", "/srv/adapters/team-a/x", true),
        ("k-paths", "/srv/adapters/team-b/x", false),
        ("k-default", "meow", true),
        ("k-default", "meow/step-3", true),
        ("k-default", "meow2", false),
        ("k-default", "team-b/x", true),
        ("k-default", "woof", false),
        ("k-none", "woof", false),
        ("k-admin", "woof", true),
        ("k-admin", "/srv/adapters/anything", true),
        ("k-api", "woof", true),
    ];
    for (who, path, allowed) in cases {
        assert_eq!(check(&principal(who), path), allowed, "{who} loading from {path}");
    }
    assert!(Principal::Anyone.check_adapter_path(root, Path::new("woof"), "woof").is_ok());
    let err = principal("k-paths").check_adapter_path(root, Path::new("woof"), "woof").expect_err("refused");
    assert!(matches!(err, CoreError::PathNotPermitted { field: Field::Path, .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "path: \"woof\" is outside the directories this key may load adapters from (team-a/, shared/inits/, under the \
         adapter root)"
    );
    let err = principal("k-none").check_adapter_path(root, Path::new("woof"), "woof").expect_err("refused");
    assert!(err.to_string().contains("(none, under the adapter root)"), "{err}");
}
