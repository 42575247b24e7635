//! The path grant: component-wise prefixes, `..` and absolute paths, and the defaults taken from adapter patterns.

use super::*;

fn grant(patterns: &[&str]) -> PathGrant {
    PathGrant::new(patterns.iter().map(|raw| PathPattern::parse(raw).expect("a valid path pattern")).collect())
}

const ROOT: &str = "/srv/adapters";

#[test]
fn a_directory_allows_itself_and_what_is_under_it_component_by_component() {
    let grant = grant(&["team-a/", "meow"]);
    let root = Path::new(ROOT);
    for allowed in ["team-a", "team-a/policy", "team-a/policy/step-3", "./team-a/x", "meow", "meow/", "meow/v2"] {
        assert!(grant.permits(root, Path::new(allowed)), "{allowed} is allowed");
    }
    for refused in ["team-ab", "team-ab/policy", "team", "meow2", "meo", "woof", "", ".", "team-b/team-a"] {
        assert!(!grant.permits(root, Path::new(refused)), "{refused:?} is refused");
    }
}

#[test]
fn a_trailing_star_is_a_prefix_of_the_relative_path() {
    let root = Path::new(ROOT);
    let grant = grant(&["team-a/*", "exp-*"]);
    for allowed in ["team-a/x", "team-a/x/y", "exp-1", "exp-2/policy"] {
        assert!(grant.permits(root, Path::new(allowed)), "{allowed} is allowed");
    }
    for refused in ["team-a", "team-ab/x", "exp", "woof/exp-1"] {
        assert!(!grant.permits(root, Path::new(refused)), "{refused} is refused");
    }
    let everything = self::grant(&["*"]);
    assert!(everything.permits(root, Path::new("woof")));
    assert!(everything.permits(root, Path::new("/srv/adapters/any/where")));
    assert!(!everything.permits(root, Path::new("/srv/other")), "never outside the root");
}

#[test]
fn dot_dot_is_applied_by_spelling_and_never_climbs_out() {
    let root = Path::new(ROOT);
    let grant = grant(&["team-a"]);
    assert!(grant.permits(root, Path::new("team-a/x/../y")));
    assert!(grant.permits(root, Path::new("woof/../team-a/x")), "the spelling lands in team-a");
    for refused in ["team-a/../woof", "team-a/../../srv/adapters/team-a", "..", "../adapters/team-a", "team-a/x/../.."]
    {
        assert!(!grant.permits(root, Path::new(refused)), "{refused} is refused");
    }
}

#[test]
fn absolute_paths_count_only_under_the_root() {
    let root = Path::new(ROOT);
    let grant = grant(&["team-a"]);
    assert!(grant.permits(root, Path::new("/srv/adapters/team-a/x")));
    assert!(grant.permits(root, Path::new("/srv/adapters/./team-a")));
    for refused in [
        "/srv/adapters/woof",
        "/srv/adapters",
        "/srv/adapters-team-a/team-a",
        "/team-a",
        "/srv/adapters/../adapters/woof",
        "/srv/adapters/team-a/../woof",
        "/../srv/adapters/team-a",
    ] {
        assert!(!grant.permits(root, Path::new(refused)), "{refused} is refused");
    }
}

#[test]
fn the_default_grant_reads_adapter_patterns_as_directories() {
    let root = Path::new(ROOT);
    let grant = PathGrant::from_adapter_patterns(["meow", "team-a/*", "..", "/abs"]);
    assert_eq!(grant.describe(), "meow/, team-a/*", "patterns that are no relative path are dropped");
    for allowed in ["meow", "meow/v3", "team-a/policy"] {
        assert!(grant.permits(root, Path::new(allowed)), "{allowed} is allowed");
    }
    for refused in ["meow2", "team-a", "team-ab/x", "woof"] {
        assert!(!grant.permits(root, Path::new(refused)), "{refused} is refused");
    }
    assert_eq!(PathGrant::default().describe(), "none");
    assert!(!PathGrant::default().permits(root, Path::new("meow")));
}

#[test]
fn malformed_path_patterns_are_refused_with_the_reason() {
    for (raw, why) in [
        ("/srv/adapters/meow", "relative"),
        ("team-a/../woof", ".."),
        ("a*b", "trailing"),
        ("", "empty"),
        (".", "empty"),
        ("a\nb", "control"),
    ] {
        let err = PathPattern::parse(raw).expect_err("refused");
        assert!(err.to_string().contains(why), "{raw:?}: {err}");
    }
}
