//! Compatibility levels and which earlier versions a new schema is checked against.

use crate::error::RegistryError;
use crate::schema::Parsed;

/// A subject's (or the registry's) compatibility level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Level {
    /// No checks.
    None,
    /// The new schema reads data written with the latest version.
    #[default]
    Backward,
    /// The new schema reads data written with every version.
    BackwardTransitive,
    /// The latest version reads data written with the new schema.
    Forward,
    /// Every version reads data written with the new schema.
    ForwardTransitive,
    /// Backward and forward against the latest version.
    Full,
    /// Backward and forward against every version.
    FullTransitive,
}

impl Level {
    /// Reads a level (any case).
    pub fn parse(name: &str) -> Result<Self, RegistryError> {
        Ok(match name.to_ascii_uppercase().as_str() {
            "NONE" => Level::None,
            "BACKWARD" => Level::Backward,
            "BACKWARD_TRANSITIVE" => Level::BackwardTransitive,
            "FORWARD" => Level::Forward,
            "FORWARD_TRANSITIVE" => Level::ForwardTransitive,
            "FULL" => Level::Full,
            "FULL_TRANSITIVE" => Level::FullTransitive,
            _ => return Err(RegistryError::InvalidCompatibility(name.to_string())),
        })
    }

    /// Its name in the API.
    pub fn name(self) -> &'static str {
        match self {
            Level::None => "NONE",
            Level::Backward => "BACKWARD",
            Level::BackwardTransitive => "BACKWARD_TRANSITIVE",
            Level::Forward => "FORWARD",
            Level::ForwardTransitive => "FORWARD_TRANSITIVE",
            Level::Full => "FULL",
            Level::FullTransitive => "FULL_TRANSITIVE",
        }
    }

    fn backward(self) -> bool {
        matches!(
            self,
            Level::Backward | Level::BackwardTransitive | Level::Full | Level::FullTransitive
        )
    }

    fn forward(self) -> bool {
        matches!(
            self,
            Level::Forward | Level::ForwardTransitive | Level::Full | Level::FullTransitive
        )
    }

    /// Whether every earlier version counts, not only the latest.
    pub fn transitive(self) -> bool {
        matches!(
            self,
            Level::BackwardTransitive | Level::ForwardTransitive | Level::FullTransitive
        )
    }
}

/// What keeps `new` from being registered after `earlier` (live versions, oldest first, with
/// their version numbers) at `level`; empty when nothing does. With `all` every given
/// version is checked whatever the level (the compatibility endpoint naming one version).
pub fn check(level: Level, new: &Parsed, earlier: &[(i32, &Parsed)], all: bool) -> Vec<String> {
    if level == Level::None {
        return Vec::new();
    }
    let against: &[(i32, &Parsed)] = if level.transitive() || all {
        earlier
    } else {
        match earlier.last() {
            Some(_) => &earlier[earlier.len() - 1..],
            None => &[],
        }
    };
    let mut out = Vec::new();
    for (version, old) in against {
        let mut found = Vec::new();
        if level.backward() {
            found.extend(new.incompatibilities(old));
        }
        if level.forward() {
            found.extend(old.incompatibilities(new));
        }
        out.extend(
            found
                .into_iter()
                .map(|m| format!("{m} (against version {version}, {})", level.name())),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{prepare, SchemaType};

    fn avro(text: &str) -> Parsed {
        prepare(SchemaType::Avro, text, &[], false, 1 << 20)
            .unwrap()
            .parsed
    }

    fn rec(fields: &str) -> Parsed {
        avro(&format!(
            r#"{{"type":"record","name":"R","fields":[{fields}]}}"#
        ))
    }

    #[test]
    fn levels_parse_in_any_case_and_unknown_ones_are_42203() {
        assert_eq!(
            Level::parse("full_transitive").unwrap(),
            Level::FullTransitive
        );
        assert_eq!(Level::parse("NONE").unwrap(), Level::None);
        assert_eq!(Level::parse("SIDEWAYS").unwrap_err().error_code(), 42203);
    }

    #[test]
    fn each_level_checks_its_direction_against_the_latest_or_every_version() {
        // v1: {a}; v2: {a, b default}; new: {a, c without default} and without b.
        let v1 = rec(r#"{"name":"a","type":"int"}"#);
        let v2 = rec(r#"{"name":"a","type":"int"},{"name":"b","type":"int","default":0}"#);
        let adds_c = rec(r#"{"name":"a","type":"int"},{"name":"c","type":"int"}"#);
        let earlier = [(1, &v1), (2, &v2)];
        // Adding a field without a default breaks backward reads of both versions.
        for (level, ok) in [
            (Level::None, true),
            (Level::Backward, false),
            (Level::BackwardTransitive, false),
            (Level::Forward, true),
            (Level::ForwardTransitive, true),
            (Level::Full, false),
            (Level::FullTransitive, false),
        ] {
            let msgs = check(level, &adds_c, &earlier, false);
            assert_eq!(msgs.is_empty(), ok, "{level:?}: {msgs:?}");
        }
        // Dropping the defaulted field b and adding it back without default: v1 lacked b, so
        // only the transitive levels see that v1's data has no b.
        let b_required = rec(r#"{"name":"a","type":"int"},{"name":"b","type":"int"}"#);
        let v2_no_default_earlier = [(1, &v1), (2, &v2)];
        assert!(check(Level::Backward, &b_required, &v2_no_default_earlier, false).is_empty());
        let msgs = check(
            Level::BackwardTransitive,
            &b_required,
            &v2_no_default_earlier,
            false,
        );
        assert!(!msgs.is_empty());
        assert!(msgs[0].contains("against version 1"), "{msgs:?}");
    }

    #[test]
    fn a_changed_schema_type_is_incompatible() {
        let json = prepare(
            SchemaType::Json,
            r#"{"type":"string"}"#,
            &[],
            false,
            1 << 20,
        )
        .unwrap()
        .parsed;
        let a = avro(r#""string""#);
        assert!(!check(Level::Backward, &json, &[(1, &a)], false).is_empty());
    }
}
