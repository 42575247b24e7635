//! One sample of every error the core can answer with, for the fronts' tests: each front runs every sample through
//! its own mapping and checks that it answers the code of the error's [`ErrorClass`](crate::ErrorClass), so the
//! same error answers the same way on every front.
//!
//! The lists are exhaustive by construction: each is written with [`one_of_each!`], whose `match` has no wildcard,
//! so a variant added to an error enum and not listed here fails to compile.

use std::time::Duration;

use crate::{
    Action, AdapterKey, AdapterName, AdapterVersion, CoreError, EngineError, Field, FleetControlError, Limit,
    StateError,
};

/// The samples listed for each variant of `$enum`, in order. Expands to a `match` on `$enum` without a wildcard (a
/// variant that is not listed fails to compile), and checks at run time that each sample is the variant it is
/// listed under.
macro_rules! one_of_each {
    ($enum:ident { $($variant:ident => [$($sample:expr),+ $(,)?]),+ $(,)? }) => {{
        fn variant(error: &$enum) -> &'static str {
            match error {
                $($enum::$variant { .. } => stringify!($variant)),+
            }
        }
        let mut samples: Vec<$enum> = Vec::new();
        $(
            for sample in [$($sample),+] {
                assert_eq!(variant(&sample), stringify!($variant), "a sample listed under the wrong variant");
                samples.push(sample);
            }
        )+
        samples
    }};
}

fn meow() -> AdapterKey {
    AdapterKey::Lora(AdapterName::parse("meow").expect("a valid name"))
}

/// One sample of every [`EngineError`] variant.
pub fn every_engine_error() -> Vec<EngineError> {
    one_of_each!(EngineError {
        AdapterFiles => [EngineError::AdapterFiles("no adapter_config.json".into())],
        AdapterIncompatible => [EngineError::AdapterIncompatible("q_proj has rank 0".into())],
        AdapterNotLoaded => [EngineError::AdapterNotLoaded(AdapterName::parse("meow").expect("a valid name"))],
        Stopped => [EngineError::Stopped],
        Unavailable => [EngineError::Unavailable("no READY worker holds meow@2".into())],
        NonFiniteOutput => [EngineError::NonFiniteOutput("at step 3".into())],
        TooLarge => [EngineError::TooLarge("needs 70 KV cache blocks; the cache has 64".into())],
        Internal => [EngineError::Internal("boom".into())],
    })
}

/// One sample of every [`StateError`] variant.
pub fn every_state_error() -> Vec<StateError> {
    one_of_each!(StateError {
        Failed => [StateError::Failed("disk full".into())],
        Unavailable => [StateError::Unavailable("etcd is unreachable".into())],
    })
}

/// One sample of every [`CoreError`] variant; [`CoreError::Engine`] and [`CoreError::State`] once per variant of the
/// error they carry, and [`CoreError::SwapFailed`] once over each engine and state error (a swap answers as its
/// load failed).
pub fn every_core_error() -> Vec<CoreError> {
    let swap_failed = |source: CoreError| CoreError::SwapFailed {
        adapter: AdapterName::parse("meow").expect("a valid name"),
        serving: AdapterVersion(1),
        source: Box::new(source),
    };
    let mut samples = one_of_each!(CoreError {
        InvalidArgument => [CoreError::invalid(Field::MaxTokens, "must be at least 1")],
        UnknownAdapter => [CoreError::UnknownAdapter(meow())],
        GateHoldExpired => [CoreError::GateHoldExpired { adapter: meow(), held_for: Duration::from_secs(1) }],
        VersionNotReached => [CoreError::VersionNotReached {
            adapter: meow(),
            current: AdapterVersion(2),
            requested: AdapterVersion(3),
            held_for: Duration::from_secs(1),
        }],
        VersionRetired => [CoreError::VersionRetired {
            adapter: AdapterName::parse("meow").expect("a valid name"),
            requested: AdapterVersion(1),
            retained: vec![AdapterVersion(2), AdapterVersion(3)],
        }],
        StalenessHoldExpired => [CoreError::StalenessHoldExpired {
            adapter: meow(),
            capacity: 16,
            held_for: Duration::from_secs(1),
        }],
        DrainTimedOut => [CoreError::DrainTimedOut {
            adapter: meow(),
            still_running: 2,
            waited: Duration::from_secs(5),
        }],
        SwapFailed => [swap_failed(EngineError::AdapterFiles("no adapter_config.json".into()).into())],
        AbortedWhileKept => [CoreError::AbortedWhileKept(meow())],
        AdapterUnavailable => [CoreError::AdapterUnavailable(meow())],
        ShuttingDown => [CoreError::ShuttingDown],
        Overloaded => [CoreError::Overloaded { limit: Limit::InFlightPerAdapter, cap: 8, adapter: meow() }],
        TooManyAdapters => [CoreError::TooManyAdapters { max_loras: 4 }],
        Unauthenticated => [CoreError::Unauthenticated("no API key was presented")],
        PermissionDenied => [
            CoreError::PermissionDenied { action: Action::Control, adapter: Some(meow()) },
            CoreError::PermissionDenied { action: Action::Admin, adapter: None },
        ],
        PathNotPermitted => [CoreError::PathNotPermitted {
            field: Field::Path,
            requested: "woof".into(),
            allowed: "meow/".into(),
        }],
        Engine => [CoreError::Engine(EngineError::Internal("boom".into()))],
        WeightsMissing => [CoreError::WeightsMissing { adapter: meow(), reason: "/gone/meow is missing".into() }],
        AdapterTooLarge => [CoreError::AdapterTooLarge { size: 2_000_000, limit: 1_000_000 }],
        UnsupportedFormat => [CoreError::UnsupportedFormat("it starts with a pickle's magic bytes".into())],
        State => [CoreError::State(StateError::Failed("disk full".into()))],
    });
    samples.extend(every_engine_error().into_iter().map(CoreError::Engine));
    samples.extend(every_state_error().into_iter().map(CoreError::State));
    samples.extend(every_engine_error().into_iter().map(|error| swap_failed(error.into())));
    samples.extend(every_state_error().into_iter().map(|error| swap_failed(error.into())));
    samples
}

/// One sample of every [`FleetControlError`] variant.
pub fn every_fleet_error() -> Vec<FleetControlError> {
    one_of_each!(FleetControlError {
        InvalidArgument => [FleetControlError::InvalidArgument { field: "address", reason: "names no port".into() }],
        UnknownWorker => [FleetControlError::UnknownWorker("http://w:1".into())],
        WorkerExists => [FleetControlError::WorkerExists("http://w:2".into())],
        TooManyWorkers => [FleetControlError::TooManyWorkers { max: 256 }],
        NoFleet => [FleetControlError::NoFleet],
        Unavailable => [FleetControlError::Unavailable("the fleet is stopping".into())],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorClass;

    #[test]
    fn the_lists_cover_every_class_they_can_and_a_swap_answers_as_its_load() {
        let classes: Vec<ErrorClass> = every_core_error().iter().map(CoreError::class).collect();
        for class in [
            ErrorClass::Invalid,
            ErrorClass::NotFound,
            ErrorClass::Unavailable,
            ErrorClass::Timeout,
            ErrorClass::Conflict,
            ErrorClass::Overloaded,
            ErrorClass::Unauthenticated,
            ErrorClass::Forbidden,
            ErrorClass::Precondition,
            ErrorClass::NotServing,
            ErrorClass::Gone,
            ErrorClass::TooLarge,
            ErrorClass::UnsupportedFormat,
            ErrorClass::Internal,
        ] {
            assert!(classes.contains(&class), "no core error of class {class:?}");
        }
        let fleet: Vec<ErrorClass> = every_fleet_error().iter().map(FleetControlError::class).collect();
        assert!(fleet.contains(&ErrorClass::AlreadyExists));
        for error in every_core_error() {
            if let CoreError::SwapFailed { source, .. } = &error {
                assert_eq!(error.class(), source.class(), "{error}");
            }
        }
    }
}
