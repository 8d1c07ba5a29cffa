//! JSON report writer.

use std::path::Path;

use serde::Serialize;

use crate::error::{BenchError, Result};

/// Pretty JSON of any report, with a trailing newline.
pub fn to_json<T: Serialize>(report: &T) -> Result<String> {
    let mut s = serde_json::to_string_pretty(report)?;
    s.push('\n');
    Ok(s)
}

/// Writes a report as JSON to `path`.
pub fn write<T: Serialize>(report: &T, path: &Path) -> Result<()> {
    std::fs::write(path, to_json(report)?)
        .map_err(|e| BenchError::io(format!("writing {}", path.display()), e))
}
