//! Avro schemas: validated by the `apache-avro` crate (names, namespaces, defaults, logical
//! types), then read into a small model of what Avro's schema resolution looks at, on which
//! the compatibility of a reader schema with a writer schema is checked.
//!
//! The model is this crate's own rather than `apache-avro`'s `Schema`: resolution ignores
//! logical types, docs and most attributes, and needs the aliases and "has a default" of every
//! field in one place; a small model keeps the rules readable and independent of how that
//! crate's types change between versions.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use crate::schema::Resolved;

/// Most checking steps one compatibility check may take; beyond, the schemas are reported
/// too complex (a bound on time for hostile schemas).
const MAX_STEPS: usize = 200_000;

/// A type as schema resolution sees it.
#[derive(Debug, Clone, PartialEq)]
enum Ty {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Array(Box<Ty>),
    Map(Box<Ty>),
    Union(Vec<Ty>),
    /// A record, enum or fixed, by full name.
    Named(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Def {
    Record(Vec<Field>),
    Enum {
        symbols: Vec<String>,
        default: Option<String>,
    },
    Fixed(u64),
}

#[derive(Debug, Clone, PartialEq)]
struct Named {
    /// Full names of the aliases.
    aliases: Vec<String>,
    def: Def,
}

#[derive(Debug, Clone, PartialEq)]
struct Field {
    name: String,
    aliases: Vec<String>,
    ty: Ty,
    has_default: bool,
}

/// A parsed Avro schema: its root type and every named type it defines or references.
#[derive(Debug, Clone)]
pub struct AvroSchema {
    root: Ty,
    named: HashMap<String, Named>,
}

/// Validates `text` (already parsed as `value`) with its referenced schemas, and returns the
/// model and the normalized form (full names everywhere, no `namespace` keys, primitive types
/// as plain strings; docs, defaults, aliases and other attributes kept).
pub fn parse(
    text: &str,
    value: &Value,
    references: &[Resolved],
) -> Result<(AvroSchema, Value), String> {
    let texts: Vec<&str> = references.iter().map(|r| r.text.as_str()).collect();
    if texts.is_empty() {
        apache_avro::Schema::parse_str(text).map_err(|e| e.to_string())?;
    } else {
        apache_avro::Schema::parse_str_with_list(text, &texts).map_err(|e| e.to_string())?;
    }
    let mut b = Builder::default();
    for r in references {
        let v: Value = serde_json::from_str(&r.text)
            .map_err(|e| format!("reference {} is not JSON: {e}", r.name))?;
        b.walk(&v, None)?;
    }
    let (root, normalized) = b.walk(value, None)?;
    Ok((
        AvroSchema {
            root,
            named: b.named,
        },
        normalized,
    ))
}

/// Reads schema JSON into the model and the normalized form, resolving names as Avro does:
/// a name without a dot is looked up in the enclosing namespace, then in the null namespace.
#[derive(Default)]
struct Builder {
    named: HashMap<String, Named>,
}

fn primitive(name: &str) -> Option<Ty> {
    Some(match name {
        "null" => Ty::Null,
        "boolean" => Ty::Boolean,
        "int" => Ty::Int,
        "long" => Ty::Long,
        "float" => Ty::Float,
        "double" => Ty::Double,
        "bytes" => Ty::Bytes,
        "string" => Ty::String,
        _ => return None,
    })
}

fn namespace_of(fullname: &str) -> Option<&str> {
    fullname.rsplit_once('.').map(|(ns, _)| ns)
}

fn short_name(fullname: &str) -> &str {
    fullname.rsplit_once('.').map_or(fullname, |(_, n)| n)
}

fn qualify(name: &str, ns: Option<&str>) -> String {
    match ns {
        Some(ns) if !ns.is_empty() && !name.contains('.') => format!("{ns}.{name}"),
        _ => name.to_string(),
    }
}

impl Builder {
    fn reference(&self, name: &str, ns: Option<&str>) -> Result<String, String> {
        let qualified = qualify(name, ns);
        if self.named.contains_key(&qualified) {
            return Ok(qualified);
        }
        if self.named.contains_key(name) {
            return Ok(name.to_string());
        }
        Err(format!("unknown type {name:?}"))
    }

    fn walk(&mut self, v: &Value, ns: Option<&str>) -> Result<(Ty, Value), String> {
        match v {
            Value::String(s) => match primitive(s) {
                Some(t) => Ok((t, v.clone())),
                None => {
                    let full = self.reference(s, ns)?;
                    Ok((Ty::Named(full.clone()), Value::String(full)))
                }
            },
            Value::Array(branches) => {
                let mut tys = Vec::with_capacity(branches.len());
                let mut norm = Vec::with_capacity(branches.len());
                for b in branches {
                    let (t, n) = self.walk(b, ns)?;
                    tys.push(t);
                    norm.push(n);
                }
                Ok((Ty::Union(tys), Value::Array(norm)))
            }
            Value::Object(obj) => self.walk_object(obj, ns),
            other => Err(format!("{other} is not an Avro schema")),
        }
    }

    fn walk_object(
        &mut self,
        obj: &Map<String, Value>,
        ns: Option<&str>,
    ) -> Result<(Ty, Value), String> {
        let ty = obj
            .get("type")
            .ok_or("an Avro schema object needs a \"type\"")?;
        let name = match ty {
            Value::String(s) => s.as_str(),
            // {"type": {...}} or {"type": [...]}: the inner schema, with this object's other
            // attributes kept around it.
            nested => {
                let (t, n) = self.walk(nested, ns)?;
                if obj.len() == 1 {
                    return Ok((t, n));
                }
                let mut out = obj.clone();
                out.insert("type".into(), n);
                return Ok((t, Value::Object(out)));
            }
        };
        match name {
            "record" | "error" => self.record(obj, ns),
            "enum" => {
                let (full, out_ns) = self.definition_name(obj, ns)?;
                let symbols = strings(obj.get("symbols")).ok_or("an enum needs \"symbols\"")?;
                let default = obj.get("default").and_then(Value::as_str).map(String::from);
                self.define(
                    &full,
                    obj,
                    out_ns.as_deref(),
                    Def::Enum { symbols, default },
                )?;
                Ok((
                    Ty::Named(full.clone()),
                    named_normal(obj, &full, out_ns.as_deref()),
                ))
            }
            "fixed" => {
                let (full, out_ns) = self.definition_name(obj, ns)?;
                let size = obj
                    .get("size")
                    .and_then(Value::as_u64)
                    .ok_or("a fixed needs a \"size\"")?;
                self.define(&full, obj, out_ns.as_deref(), Def::Fixed(size))?;
                Ok((
                    Ty::Named(full.clone()),
                    named_normal(obj, &full, out_ns.as_deref()),
                ))
            }
            "array" => {
                let items = obj.get("items").ok_or("an array needs \"items\"")?;
                let (t, n) = self.walk(items, ns)?;
                let mut out = obj.clone();
                out.insert("items".into(), n);
                Ok((Ty::Array(Box::new(t)), Value::Object(out)))
            }
            "map" => {
                let values = obj.get("values").ok_or("a map needs \"values\"")?;
                let (t, n) = self.walk(values, ns)?;
                let mut out = obj.clone();
                out.insert("values".into(), n);
                Ok((Ty::Map(Box::new(t)), Value::Object(out)))
            }
            other => match primitive(other) {
                // A primitive in object form; its logical type and attributes do not change
                // how it resolves.
                Some(t) if obj.len() == 1 => Ok((t, Value::String(other.to_string()))),
                Some(t) => Ok((t, Value::Object(obj.clone()))),
                None => {
                    let full = self.reference(other, ns)?;
                    if obj.len() == 1 {
                        return Ok((Ty::Named(full.clone()), Value::String(full)));
                    }
                    let mut out = obj.clone();
                    out.insert("type".into(), Value::String(full.clone()));
                    Ok((Ty::Named(full), Value::Object(out)))
                }
            },
        }
    }

    /// The full name a definition gets, and the namespace its contents are read in.
    fn definition_name(
        &self,
        obj: &Map<String, Value>,
        ns: Option<&str>,
    ) -> Result<(String, Option<String>), String> {
        let name = obj
            .get("name")
            .and_then(Value::as_str)
            .ok_or("a named type needs a \"name\"")?;
        let full = if name.contains('.') {
            name.to_string()
        } else {
            match obj.get("namespace").and_then(Value::as_str) {
                Some(explicit) => qualify(name, Some(explicit)),
                None => qualify(name, ns),
            }
        };
        let inner = namespace_of(&full).map(String::from);
        Ok((full, inner))
    }

    fn define(
        &mut self,
        full: &str,
        obj: &Map<String, Value>,
        ns: Option<&str>,
        def: Def,
    ) -> Result<(), String> {
        let aliases = strings(obj.get("aliases"))
            .unwrap_or_default()
            .into_iter()
            .map(|a| qualify(&a, ns))
            .collect();
        if self.named.contains_key(full) {
            return Err(format!("the name {full:?} is defined twice"));
        }
        self.named.insert(full.to_string(), Named { aliases, def });
        Ok(())
    }

    fn record(
        &mut self,
        obj: &Map<String, Value>,
        ns: Option<&str>,
    ) -> Result<(Ty, Value), String> {
        let (full, inner) = self.definition_name(obj, ns)?;
        // Defined before its fields are read: a field may refer to the record itself.
        self.define(&full, obj, inner.as_deref(), Def::Record(Vec::new()))?;
        let raw_fields = obj
            .get("fields")
            .and_then(Value::as_array)
            .ok_or("a record needs \"fields\"")?;
        let mut fields = Vec::with_capacity(raw_fields.len());
        let mut normal_fields = Vec::with_capacity(raw_fields.len());
        for f in raw_fields {
            let f = f.as_object().ok_or("a record field must be an object")?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or("a record field needs a \"name\"")?;
            let ty = f.get("type").ok_or("a record field needs a \"type\"")?;
            let (t, n) = self.walk(ty, inner.as_deref())?;
            fields.push(Field {
                name: name.to_string(),
                aliases: strings(f.get("aliases")).unwrap_or_default(),
                ty: t,
                has_default: f.contains_key("default"),
            });
            let mut nf = f.clone();
            nf.insert("type".into(), n);
            normal_fields.push(Value::Object(nf));
        }
        if let Some(n) = self.named.get_mut(&full) {
            n.def = Def::Record(fields);
        }
        let mut out = named_normal(obj, &full, inner.as_deref());
        if let Value::Object(m) = &mut out {
            m.insert("fields".into(), Value::Array(normal_fields));
        }
        Ok((Ty::Named(full), out))
    }
}

/// A named type's normalized object: full name, no namespace, aliases as full names.
fn named_normal(obj: &Map<String, Value>, full: &str, ns: Option<&str>) -> Value {
    let mut out = obj.clone();
    out.remove("namespace");
    out.insert("name".into(), Value::String(full.to_string()));
    if let Some(aliases) = strings(obj.get("aliases")) {
        out.insert(
            "aliases".into(),
            Value::Array(
                aliases
                    .into_iter()
                    .map(|a| Value::String(qualify(&a, ns)))
                    .collect(),
            ),
        );
    }
    Value::Object(out)
}

fn strings(v: Option<&Value>) -> Option<Vec<String>> {
    v?.as_array().map(|items| {
        items
            .iter()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect()
    })
}

/// What keeps data written with `writer` from being read with `reader`, by Avro's schema
/// resolution rules (empty: it can be read). One line per problem: a kind, the path in the
/// reader schema, and what is wrong.
pub fn incompatibilities(reader: &AvroSchema, writer: &AvroSchema) -> Vec<String> {
    let mut c = Check {
        reader,
        writer,
        done: HashMap::new(),
        in_progress: HashSet::new(),
        steps: 0,
    };
    let mut out = Vec::new();
    c.check(&reader.root, &writer.root, "", &mut out);
    out
}

struct Check<'a> {
    reader: &'a AvroSchema,
    writer: &'a AvroSchema,
    /// Results of named pairs already checked.
    done: HashMap<(String, String), bool>,
    /// Named pairs being checked further up: a recursive type meets itself here and is taken
    /// as compatible (its other parts decide).
    in_progress: HashSet<(String, String)>,
    steps: usize,
}

fn describe(t: &Ty) -> String {
    match t {
        Ty::Null => "null".into(),
        Ty::Boolean => "boolean".into(),
        Ty::Int => "int".into(),
        Ty::Long => "long".into(),
        Ty::Float => "float".into(),
        Ty::Double => "double".into(),
        Ty::Bytes => "bytes".into(),
        Ty::String => "string".into(),
        Ty::Array(_) => "array".into(),
        Ty::Map(_) => "map".into(),
        Ty::Union(_) => "union".into(),
        Ty::Named(n) => n.clone(),
    }
}

/// Whether a writer primitive is read by a reader primitive: equal, or promoted as the Avro
/// specification allows (int to long, float or double; long to float or double; float to
/// double; string and bytes either way).
fn promotes(reader: &Ty, writer: &Ty) -> bool {
    use Ty::*;
    matches!(
        (reader, writer),
        (Null, Null)
            | (Boolean, Boolean)
            | (Int, Int)
            | (Long, Long | Int)
            | (Float, Float | Int | Long)
            | (Double, Double | Int | Long | Float)
            | (String, String | Bytes)
            | (Bytes, Bytes | String)
    )
}

impl Check<'_> {
    /// Checks without reporting: whether `writer` can be read with `reader`.
    fn fits(&mut self, reader: &Ty, writer: &Ty, path: &str) -> bool {
        let mut scratch = Vec::new();
        self.check(reader, writer, path, &mut scratch);
        scratch.is_empty()
    }

    fn check(&mut self, reader: &Ty, writer: &Ty, path: &str, out: &mut Vec<String>) {
        self.steps += 1;
        if self.steps > MAX_STEPS {
            if self.steps == MAX_STEPS + 1 {
                out.push(format!(
                    "TOO_COMPLEX at {}: the schemas take more than {MAX_STEPS} steps to compare",
                    or_root(path)
                ));
            } else {
                out.push(String::new());
            }
            return;
        }
        // A writer union: every branch it may write must be readable.
        if let Ty::Union(ws) = writer {
            for (i, w) in ws.iter().enumerate() {
                let mut branch = Vec::new();
                self.check(reader, w, path, &mut branch);
                if !branch.is_empty() && !matches!(reader, Ty::Union(_)) {
                    out.extend(branch);
                } else if !branch.is_empty() {
                    out.push(format!(
                        "MISSING_UNION_BRANCH at {}: no branch of the reader's union reads the writer's branch {i} ({})",
                        or_root(path),
                        describe(w)
                    ));
                }
            }
            return;
        }
        // A reader union reads a writer type when one of its branches does.
        if let Ty::Union(rs) = reader {
            let found = rs.iter().any(|r| self.fits(r, writer, path));
            if !found {
                out.push(format!(
                    "MISSING_UNION_BRANCH at {}: the reader's union has no branch that reads {}",
                    or_root(path),
                    describe(writer)
                ));
            }
            return;
        }
        match (reader, writer) {
            (Ty::Array(r), Ty::Array(w)) => self.check(r, w, &format!("{path}/items"), out),
            (Ty::Map(r), Ty::Map(w)) => self.check(r, w, &format!("{path}/values"), out),
            (Ty::Named(r), Ty::Named(w)) => self.named(r, w, path, out),
            (r, w) if promotes(r, w) => {}
            (r, w) => out.push(format!(
                "TYPE_MISMATCH at {}: the reader's {} cannot read the writer's {}",
                or_root(path),
                describe(r),
                describe(w)
            )),
        }
    }

    fn named(&mut self, r: &str, w: &str, path: &str, out: &mut Vec<String>) {
        let pair = (r.to_string(), w.to_string());
        if let Some(ok) = self.done.get(&pair) {
            if !*ok {
                out.push(format!(
                    "TYPE_MISMATCH at {}: the reader's {r} cannot read the writer's {w} (see above)",
                    or_root(path)
                ));
            }
            return;
        }
        if !self.in_progress.insert(pair.clone()) {
            return;
        }
        let before = out.len();
        self.named_inner(r, w, path, out);
        self.in_progress.remove(&pair);
        self.done.insert(pair, out.len() == before);
    }

    fn named_inner(&mut self, r: &str, w: &str, path: &str, out: &mut Vec<String>) {
        let (Some(rd), Some(wd)) = (self.reader.named.get(r), self.writer.named.get(w)) else {
            out.push(format!(
                "TYPE_MISMATCH at {}: type {r} or {w} is not defined",
                or_root(path)
            ));
            return;
        };
        // Names match on their unqualified part, or through the reader's aliases.
        let names_match = short_name(r) == short_name(w)
            || rd
                .aliases
                .iter()
                .any(|a| a == w || short_name(a) == short_name(w));
        if !names_match {
            out.push(format!(
                "NAME_MISMATCH at {}: the reader's {r} does not match the writer's {w} by name or alias",
                or_root(path)
            ));
            return;
        }
        match (&rd.def, &wd.def) {
            (Def::Record(rf), Def::Record(wf)) => {
                for (i, field) in rf.iter().enumerate() {
                    let found = wf.iter().find(|x| x.name == field.name).or_else(|| {
                        wf.iter().find(|x| field.aliases.contains(&x.name))
                    });
                    match found {
                        Some(wfield) => {
                            self.check(&field.ty, &wfield.ty, &format!("{path}/fields/{i}/type"), out)
                        }
                        None if field.has_default => {}
                        None => out.push(format!(
                            "READER_FIELD_MISSING_DEFAULT_VALUE at {path}/fields/{i}: field '{}' of {r} has no default and the writer's {w} does not have it",
                            field.name
                        )),
                    }
                }
            }
            (
                Def::Enum {
                    symbols: rs,
                    default,
                },
                Def::Enum { symbols: ws, .. },
            ) => {
                let missing: Vec<&String> = ws.iter().filter(|s| !rs.contains(s)).collect();
                if !missing.is_empty() && default.is_none() {
                    out.push(format!(
                        "MISSING_ENUM_SYMBOLS at {}/symbols: the reader's {r} lacks {:?} and has no default",
                        path,
                        missing
                    ));
                }
            }
            (Def::Fixed(rs), Def::Fixed(ws)) => {
                if rs != ws {
                    out.push(format!(
                        "FIXED_SIZE_MISMATCH at {path}/size: the reader's {r} has {rs} bytes, the writer's {w} {ws}"
                    ));
                }
            }
            _ => out.push(format!(
                "TYPE_MISMATCH at {}: the reader's {r} and the writer's {w} are different kinds of type",
                or_root(path)
            )),
        }
    }
}

fn or_root(path: &str) -> &str {
    if path.is_empty() {
        "/"
    } else {
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(text: &str) -> AvroSchema {
        let v: Value = serde_json::from_str(text).unwrap();
        parse(text, &v, &[])
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .0
    }

    fn reads(reader: &str, writer: &str) -> Vec<String> {
        incompatibilities(&schema(reader), &schema(writer))
    }

    fn record(fields: &str) -> String {
        format!(r#"{{"type":"record","name":"User","namespace":"com.acme","fields":[{fields}]}}"#)
    }

    /// (change, old schema, new schema, can new read old (backward), can old read new (forward)).
    fn table() -> Vec<(&'static str, String, String, bool, bool)> {
        let id = r#"{"name":"id","type":"long"}"#;
        let name = r#"{"name":"name","type":"string"}"#;
        let name_default = r#"{"name":"name","type":"string","default":"anon"}"#;
        vec![
            ("nothing changes", record(id), record(id), true, true),
            (
                "a field with a default is added",
                record(id),
                record(&format!("{id},{name_default}")),
                true,
                true,
            ),
            (
                "a field without a default is added",
                record(id),
                record(&format!("{id},{name}")),
                false,
                true,
            ),
            (
                "a field without a default is removed",
                record(&format!("{id},{name}")),
                record(id),
                true,
                false,
            ),
            (
                "a field with a default is removed",
                record(&format!("{id},{name_default}")),
                record(id),
                true,
                true,
            ),
            (
                "a field is renamed without an alias",
                record(id),
                record(r#"{"name":"key","type":"long"}"#),
                false,
                false,
            ),
            (
                "a field is renamed with an alias to its old name",
                record(id),
                record(r#"{"name":"key","type":"long","aliases":["id"]}"#),
                true,
                false,
            ),
            (
                "int is promoted to long",
                record(r#"{"name":"n","type":"int"}"#),
                record(r#"{"name":"n","type":"long"}"#),
                true,
                false,
            ),
            (
                "long is promoted to double",
                record(r#"{"name":"n","type":"long"}"#),
                record(r#"{"name":"n","type":"double"}"#),
                true,
                false,
            ),
            (
                "float is promoted to double",
                record(r#"{"name":"n","type":"float"}"#),
                record(r#"{"name":"n","type":"double"}"#),
                true,
                false,
            ),
            (
                "string becomes bytes",
                record(r#"{"name":"n","type":"string"}"#),
                record(r#"{"name":"n","type":"bytes"}"#),
                true,
                true,
            ),
            (
                "a type changes to an unrelated one",
                record(r#"{"name":"n","type":"int"}"#),
                record(r#"{"name":"n","type":"string"}"#),
                false,
                false,
            ),
            (
                "an enum symbol is added",
                r#"{"type":"enum","name":"Color","symbols":["RED","GREEN"]}"#.into(),
                r#"{"type":"enum","name":"Color","symbols":["RED","GREEN","BLUE"]}"#.into(),
                true,
                false,
            ),
            (
                "an enum symbol is added, the enum has a default",
                r#"{"type":"enum","name":"Color","symbols":["RED","GREEN"],"default":"RED"}"#
                    .into(),
                r#"{"type":"enum","name":"Color","symbols":["RED","GREEN","BLUE"],"default":"RED"}"#
                    .into(),
                true,
                true,
            ),
            (
                "a type becomes a union that contains it",
                record(r#"{"name":"n","type":"string"}"#),
                record(r#"{"name":"n","type":["null","string"],"default":null}"#),
                true,
                false,
            ),
            (
                "a union branch is removed",
                r#"["null","string","int"]"#.into(),
                r#"["null","string"]"#.into(),
                false,
                true,
            ),
            (
                "a union gains a branch its old branches promote to",
                r#"["null","int"]"#.into(),
                r#"["null","long"]"#.into(),
                true,
                false,
            ),
            (
                "a nested record gains a field without a default",
                record(
                    r#"{"name":"address","type":{"type":"record","name":"Address","fields":[{"name":"city","type":"string"}]}}"#,
                ),
                record(
                    r#"{"name":"address","type":{"type":"record","name":"Address","fields":[{"name":"city","type":"string"},{"name":"zip","type":"string"}]}}"#,
                ),
                false,
                true,
            ),
            (
                "a record is renamed",
                r#"{"type":"record","name":"A","fields":[]}"#.into(),
                r#"{"type":"record","name":"B","fields":[]}"#.into(),
                false,
                false,
            ),
            (
                "a record is renamed with an alias to its old name",
                r#"{"type":"record","name":"A","namespace":"x","fields":[]}"#.into(),
                r#"{"type":"record","name":"B","namespace":"x","aliases":["A"],"fields":[]}"#
                    .into(),
                true,
                false,
            ),
            (
                "only the namespace changes",
                r#"{"type":"record","name":"A","namespace":"x","fields":[]}"#.into(),
                r#"{"type":"record","name":"A","namespace":"y","fields":[]}"#.into(),
                true,
                true,
            ),
            (
                "a fixed changes size",
                r#"{"type":"fixed","name":"F","size":16}"#.into(),
                r#"{"type":"fixed","name":"F","size":8}"#.into(),
                false,
                false,
            ),
            (
                "array items are promoted",
                r#"{"type":"array","items":"int"}"#.into(),
                r#"{"type":"array","items":"long"}"#.into(),
                true,
                false,
            ),
            (
                "map values change type",
                r#"{"type":"map","values":"int"}"#.into(),
                r#"{"type":"map","values":"boolean"}"#.into(),
                false,
                false,
            ),
            (
                "a logical type is added to the same underlying type",
                record(r#"{"name":"t","type":"long"}"#),
                record(r#"{"name":"t","type":{"type":"long","logicalType":"timestamp-millis"}}"#),
                true,
                true,
            ),
        ]
    }

    #[test]
    fn schema_changes_get_the_verdicts_of_avro_resolution() {
        for (change, old, new, backward, forward) in table() {
            let b = reads(&new, &old);
            assert_eq!(b.is_empty(), backward, "{change}: backward: {b:?}");
            let f = reads(&old, &new);
            assert_eq!(f.is_empty(), forward, "{change}: forward: {f:?}");
        }
    }

    #[test]
    fn a_recursive_record_is_checked_without_looping() {
        let list = r#"{"type":"record","name":"Node","fields":[{"name":"value","type":"long"},{"name":"next","type":["null","Node"]}]}"#;
        let list2 = r#"{"type":"record","name":"Node","fields":[{"name":"value","type":"long"},{"name":"next","type":["null","Node"]},{"name":"tag","type":"string","default":""}]}"#;
        assert!(reads(list2, list).is_empty());
        assert!(reads(list, list2).is_empty());
    }

    #[test]
    fn a_missing_default_is_reported_with_its_field_and_path() {
        let msgs = reads(
            &record(r#"{"name":"id","type":"long"},{"name":"email","type":"string"}"#),
            &record(r#"{"name":"id","type":"long"}"#),
        );
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert!(
            msgs[0].starts_with("READER_FIELD_MISSING_DEFAULT_VALUE at /fields/1")
                && msgs[0].contains("'email'"),
            "{msgs:?}"
        );
    }

    #[test]
    fn invalid_schemas_are_refused_with_a_reason() {
        for bad in [
            r#"{"type":"record","name":"R"}"#,
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":"nope"}]}"#,
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int","default":"x"}]}"#,
            r#"{"type":"enum","name":"E","symbols":["A","A"]}"#,
            r#"{"type":"fixed","name":"F"}"#,
            r#""notatype""#,
            r#"42"#,
        ] {
            let v: Value = serde_json::from_str(bad).unwrap();
            assert!(parse(bad, &v, &[]).is_err(), "{bad} should be invalid");
        }
    }

    #[test]
    fn named_types_from_references_resolve() {
        let address = Resolved {
            name: "com.acme.Address".into(),
            schema_type: crate::schema::SchemaType::Avro,
            text: r#"{"type":"record","name":"Address","namespace":"com.acme","fields":[{"name":"city","type":"string"}]}"#.into(),
        };
        let text = r#"{"type":"record","name":"User","namespace":"com.acme","fields":[{"name":"home","type":"Address"}]}"#;
        let v: Value = serde_json::from_str(text).unwrap();
        let (model, normalized) = parse(text, &v, &[address]).unwrap();
        assert!(model.named.contains_key("com.acme.Address"));
        assert_eq!(
            normalized["fields"][0]["type"],
            Value::String("com.acme.Address".into())
        );
        // Without the reference the type is unknown.
        assert!(parse(text, &v, &[]).is_err());
    }

    #[test]
    fn normalizing_qualifies_names_and_collapses_primitive_objects() {
        let text = r#"{"namespace":"n","type":"record","name":"R","aliases":["Old"],"fields":[{"name":"a","type":{"type":"string"}},{"name":"b","type":{"type":"enum","name":"E","symbols":["X"]}},{"name":"c","type":"E"}]}"#;
        let v: Value = serde_json::from_str(text).unwrap();
        let (_, n) = parse(text, &v, &[]).unwrap();
        assert_eq!(
            crate::schema::canonical_json(&n),
            r#"{"aliases":["n.Old"],"fields":[{"name":"a","type":"string"},{"name":"b","type":{"name":"n.E","symbols":["X"],"type":"enum"}},{"name":"c","type":"n.E"}],"name":"n.R","type":"record"}"#
        );
        // Normalizing the normalized form changes nothing.
        let again = crate::schema::canonical_json(&n);
        let v2: Value = serde_json::from_str(&again).unwrap();
        let (_, n2) = parse(&again, &v2, &[]).unwrap();
        assert_eq!(crate::schema::canonical_json(&n2), again);
    }
}
