//! JSON Schema: structural validation of a schema and the compatibility of a reader schema
//! with a writer schema.
//!
//! No maintained Rust crate decides whether one JSON Schema accepts everything another one
//! accepts (validators check instances against a schema, not schemas against each other), so
//! the rules are written here, after the ones Confluent documents for its registry: a reader
//! must accept every document the writer accepts. Content models matter: an object schema is
//! open when it allows properties it does not name (`additionalProperties` absent or true),
//! closed when it does not (`false`), and partially open with an `additionalProperties`
//! schema. Adding a property to an open writer's content model is incompatible (old data may
//! hold that property with any value), removing one from a closed reader's is too; widening
//! types (integer to number), enums and bounds is compatible, narrowing them is not; a newly
//! required property is compatible only when it is new and has a default.
//!
//! The rules are sufficient, not complete: where a combination of keywords is beyond them
//! (e.g. `oneOf` branches that overlap) they err on the side of "incompatible".

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::schema::Resolved;

/// Most checking steps one compatibility check may take (a bound on time).
const MAX_STEPS: usize = 200_000;
/// Most `$ref` hops followed in a row.
const MAX_REF_HOPS: usize = 32;

const TYPES: [&str; 7] = [
    "null", "boolean", "object", "array", "number", "string", "integer",
];

/// A JSON Schema with the documents its references name.
#[derive(Debug)]
pub struct JsonSchema {
    root: Value,
    /// Referenced documents by reference name and by `$id`.
    documents: HashMap<String, Value>,
}

impl JsonSchema {
    /// The schema document.
    pub fn root(&self) -> &Value {
        &self.root
    }

    fn document(&self, base: &str) -> Option<&Value> {
        if let Some(d) = self.documents.get(base) {
            return Some(d);
        }
        if self.root.get("$id").and_then(Value::as_str) == Some(base) {
            return Some(&self.root);
        }
        // "https://example.com/schemas/address.json" may be referenced as "address.json".
        let last = base.rsplit('/').next().unwrap_or(base);
        self.documents
            .iter()
            .find(|(name, _)| name.rsplit('/').next() == Some(last))
            .map(|(_, d)| d)
    }

    /// The schema `reference` points at from inside `doc`, with the document it is in.
    fn resolve<'a>(&'a self, doc: &'a Value, reference: &str) -> Option<(&'a Value, &'a Value)> {
        let (base, fragment) = reference.split_once('#').unwrap_or((reference, ""));
        let target = if base.is_empty() {
            doc
        } else {
            self.document(base)?
        };
        if fragment.is_empty() {
            return Some((target, target));
        }
        if !fragment.starts_with('/') {
            // A named anchor: `$anchor` (2019-09+) or an `$id` of "#name" (draft 7).
            return find_anchor(target, fragment).map(|v| (target, v));
        }
        let decoded = percent_decode(fragment);
        target.pointer(&decoded).map(|v| (target, v))
    }
}

fn find_anchor<'a>(v: &'a Value, anchor: &str) -> Option<&'a Value> {
    match v {
        Value::Object(m) => {
            let hit = m.get("$anchor").and_then(Value::as_str) == Some(anchor)
                || m.get("$id")
                    .and_then(Value::as_str)
                    .and_then(|id| id.strip_prefix('#'))
                    == Some(anchor);
            if hit {
                return Some(v);
            }
            m.values().find_map(|c| find_anchor(c, anchor))
        }
        Value::Array(items) => items.iter().find_map(|c| find_anchor(c, anchor)),
        _ => None,
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Checks `root` is a JSON Schema (keywords of the right shapes, every `$ref` resolvable) with
/// its referenced documents.
pub fn parse(root: Value, references: &[Resolved]) -> Result<JsonSchema, String> {
    let mut documents = HashMap::new();
    for r in references {
        let doc: Value = serde_json::from_str(&r.text)
            .map_err(|e| format!("reference {} is not JSON: {e}", r.name))?;
        if let Some(id) = doc.get("$id").and_then(Value::as_str) {
            documents
                .entry(id.to_string())
                .or_insert_with(|| doc.clone());
        }
        documents.entry(r.name.clone()).or_insert(doc);
    }
    let schema = JsonSchema { root, documents };
    validate(&schema, &schema.root, &schema.root, "")?;
    for (name, doc) in &schema.documents {
        validate(&schema, doc, doc, &format!("{name}#"))
            .map_err(|e| format!("reference {name}: {e}"))?;
    }
    Ok(schema)
}

const SCHEMA_MAPS: [&str; 5] = [
    "properties",
    "patternProperties",
    "definitions",
    "$defs",
    "dependentSchemas",
];
const SCHEMA_VALUES: [&str; 9] = [
    "additionalProperties",
    "additionalItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedProperties",
];
const SCHEMA_LISTS: [&str; 4] = ["allOf", "anyOf", "oneOf", "prefixItems"];
const COUNTS: [&str; 6] = [
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
];

fn validate(s: &JsonSchema, doc: &Value, v: &Value, path: &str) -> Result<(), String> {
    let m = match v {
        Value::Bool(_) => return Ok(()),
        Value::Object(m) => m,
        other => {
            return Err(format!(
                "{}: a schema must be an object or a boolean, not {other}",
                or_root(path)
            ))
        }
    };
    let at = |k: &str| format!("{path}/{k}");
    if let Some(t) = m.get("type") {
        let names: Vec<&Value> = match t {
            Value::Array(items) if !items.is_empty() => items.iter().collect(),
            Value::String(_) => vec![t],
            _ => {
                return Err(format!(
                    "{}: \"type\" must be a type name or a list of them",
                    at("type")
                ))
            }
        };
        for n in names {
            if !n.as_str().is_some_and(|n| TYPES.contains(&n)) {
                return Err(format!("{}: {n} is not a JSON Schema type", at("type")));
            }
        }
    }
    for k in SCHEMA_MAPS {
        if let Some(x) = m.get(k) {
            let map = x
                .as_object()
                .ok_or_else(|| format!("{}: must be an object of schemas", at(k)))?;
            for (name, sub) in map {
                validate(s, doc, sub, &format!("{}/{name}", at(k)))?;
            }
        }
    }
    for k in SCHEMA_VALUES {
        if let Some(x) = m.get(k) {
            validate(s, doc, x, &at(k))?;
        }
    }
    for k in SCHEMA_LISTS {
        if let Some(x) = m.get(k) {
            let list = x
                .as_array()
                .filter(|l| !l.is_empty())
                .ok_or_else(|| format!("{}: must be a non-empty list of schemas", at(k)))?;
            for (i, sub) in list.iter().enumerate() {
                validate(s, doc, sub, &format!("{}/{i}", at(k)))?;
            }
        }
    }
    match m.get("items") {
        Some(Value::Array(list)) => {
            for (i, sub) in list.iter().enumerate() {
                validate(s, doc, sub, &format!("{}/{i}", at("items")))?;
            }
        }
        Some(x) => validate(s, doc, x, &at("items"))?,
        None => {}
    }
    if let Some(r) = m.get("required") {
        let ok = r.as_array().is_some_and(|l| l.iter().all(Value::is_string));
        if !ok {
            return Err(format!(
                "{}: must be a list of property names",
                at("required")
            ));
        }
    }
    if let Some(e) = m.get("enum") {
        if !e.is_array() {
            return Err(format!("{}: must be a list", at("enum")));
        }
    }
    for k in COUNTS {
        if let Some(x) = m.get(k) {
            if x.as_u64().is_none() {
                return Err(format!("{}: must be a non-negative integer", at(k)));
            }
        }
    }
    for k in ["minimum", "maximum"] {
        if let Some(x) = m.get(k) {
            if !x.is_number() {
                return Err(format!("{}: must be a number", at(k)));
            }
        }
    }
    for k in ["exclusiveMinimum", "exclusiveMaximum"] {
        if let Some(x) = m.get(k) {
            if !x.is_number() && !x.is_boolean() {
                return Err(format!("{}: must be a number", at(k)));
            }
        }
    }
    if let Some(x) = m.get("multipleOf") {
        if !x.as_f64().is_some_and(|f| f > 0.0) {
            return Err(format!("{}: must be a number above 0", at("multipleOf")));
        }
    }
    if let Some(x) = m.get("pattern") {
        if !x.is_string() {
            return Err(format!("{}: must be a string", at("pattern")));
        }
    }
    if let Some(x) = m.get("dependencies") {
        let map = x
            .as_object()
            .ok_or_else(|| format!("{}: must be an object", at("dependencies")))?;
        for (name, dep) in map {
            if !dep.is_array() {
                validate(s, doc, dep, &format!("{}/{name}", at("dependencies")))?;
            }
        }
    }
    if let Some(r) = m.get("$ref") {
        let r = r
            .as_str()
            .ok_or_else(|| format!("{}: must be a string", at("$ref")))?;
        if s.resolve(doc, r).is_none() {
            return Err(format!(
                "{}: {r:?} does not resolve (a missing reference?)",
                at("$ref")
            ));
        }
    }
    Ok(())
}

fn or_root(path: &str) -> &str {
    if path.is_empty() {
        "/"
    } else {
        path
    }
}

/// What keeps documents valid under `writer` from being valid under `reader` (empty:
/// nothing). One line per problem: a kind, a path, what is wrong.
pub fn incompatibilities(reader: &JsonSchema, writer: &JsonSchema) -> Vec<String> {
    let mut c = Check {
        reader,
        writer,
        in_progress: HashSet::new(),
        steps: 0,
    };
    let mut out = Vec::new();
    c.check(
        Node::new(&reader.root, &reader.root),
        Node::new(&writer.root, &writer.root),
        "",
        &mut out,
    );
    let mut seen = HashSet::new();
    out.retain(|m| seen.insert(m.clone()));
    out
}

/// A schema inside the document it belongs to (relative `$ref`s resolve in that document).
#[derive(Clone, Copy)]
struct Node<'a> {
    doc: &'a Value,
    v: &'a Value,
}

impl<'a> Node<'a> {
    fn new(doc: &'a Value, v: &'a Value) -> Self {
        Self { doc, v }
    }

    fn get(&self, k: &str) -> Option<&'a Value> {
        self.v.get(k)
    }

    fn child(&self, v: &'a Value) -> Node<'a> {
        Node { doc: self.doc, v }
    }

    /// Accepts every document: `true` or a schema with no constraining keyword.
    fn accepts_all(&self) -> bool {
        match self.v {
            Value::Bool(b) => *b,
            Value::Object(m) => m.keys().all(|k| is_annotation(k)),
            _ => false,
        }
    }

    fn rejects_all(&self) -> bool {
        matches!(self.v, Value::Bool(false))
    }
}

/// Keywords that describe without constraining.
fn is_annotation(k: &str) -> bool {
    matches!(
        k,
        "$schema"
            | "$id"
            | "$comment"
            | "title"
            | "description"
            | "default"
            | "examples"
            | "deprecated"
            | "readOnly"
            | "writeOnly"
            | "definitions"
            | "$defs"
            | "format"
            | "$anchor"
    ) || k.starts_with("x-")
        || k.starts_with("connect.")
}

/// What an object schema does with properties it does not name.
enum Extra<'a> {
    /// Allows any.
    Open,
    /// Allows none.
    Closed,
    /// Allows those valid under a schema.
    Schema(Node<'a>),
}

fn extra<'a>(n: Node<'a>, key: &str) -> Extra<'a> {
    match n.get(key) {
        None => Extra::Open,
        Some(v) => {
            let s = n.child(v);
            if s.accepts_all() {
                Extra::Open
            } else if s.rejects_all() {
                Extra::Closed
            } else {
                Extra::Schema(s)
            }
        }
    }
}

fn types(n: Node<'_>) -> Option<Vec<&str>> {
    match n.get("type")? {
        Value::String(s) => Some(vec![s.as_str()]),
        Value::Array(items) => Some(items.iter().filter_map(Value::as_str).collect()),
        _ => None,
    }
}

fn number(n: Node<'_>, k: &str) -> Option<f64> {
    n.get(k).and_then(Value::as_f64)
}

struct Check<'a> {
    reader: &'a JsonSchema,
    writer: &'a JsonSchema,
    /// (reader, writer) schema pairs being checked further up, by address: a recursive
    /// schema meets itself here and is taken as compatible (its other parts decide).
    in_progress: HashSet<(usize, usize)>,
    steps: usize,
}

impl<'a> Check<'a> {
    fn deref(&self, schema: &'a JsonSchema, mut n: Node<'a>) -> Node<'a> {
        for _ in 0..MAX_REF_HOPS {
            let Some(r) = n.get("$ref").and_then(Value::as_str) else {
                return n;
            };
            match schema.resolve(n.doc, r) {
                Some((doc, v)) => n = Node { doc, v },
                None => return n,
            }
        }
        n
    }

    fn fits(&mut self, r: Node<'a>, w: Node<'a>, path: &str) -> bool {
        let mut scratch = Vec::new();
        self.check(r, w, path, &mut scratch);
        scratch.is_empty()
    }

    fn check(&mut self, r: Node<'a>, w: Node<'a>, path: &str, out: &mut Vec<String>) {
        self.steps += 1;
        if self.steps > MAX_STEPS {
            out.push(format!(
                "TOO_COMPLEX at {}: the schemas take more than {MAX_STEPS} steps to compare",
                or_root(path)
            ));
            return;
        }
        let r = self.deref(self.reader, r);
        let w = self.deref(self.writer, w);
        if r.accepts_all() || w.rejects_all() {
            return;
        }
        if r.rejects_all() {
            out.push(format!(
                "SCHEMA_NARROWED at {}: the new schema accepts nothing here",
                or_root(path)
            ));
            return;
        }
        let pair = (r.v as *const Value as usize, w.v as *const Value as usize);
        if !self.in_progress.insert(pair) {
            return;
        }
        self.combined(r, w, path, out);
        self.in_progress.remove(&pair);
    }

    /// The combining keywords, then the rest.
    fn combined(&mut self, r: Node<'a>, w: Node<'a>, path: &str, out: &mut Vec<String>) {
        // A writer sum type: each branch it may write must be accepted.
        for kind in ["oneOf", "anyOf"] {
            if let Some(branches) = w.get(kind).and_then(Value::as_array) {
                if kind == "anyOf" && r.get("oneOf").is_some() && r.get("anyOf").is_none() {
                    out.push(format!(
                        "COMBINED_TYPE_CHANGED at {}: anyOf became oneOf",
                        or_root(path)
                    ));
                    return;
                }
                for (i, b) in branches.iter().enumerate() {
                    self.check(r, w.child(b), &format!("{path}/{kind}/{i}"), out);
                }
                return;
            }
        }
        // A writer allOf: its documents are valid under every branch, so it is enough that
        // the rest of the writer, or one branch, is accepted.
        if let Some(branches) = w.get("allOf").and_then(Value::as_array) {
            let mut base = Vec::new();
            self.base(r, w, path, &mut base);
            if base.is_empty() {
                return;
            }
            for b in branches {
                if self.fits(r, w.child(b), path) {
                    return;
                }
            }
            out.extend(base);
            return;
        }
        // A reader sum type: one branch must accept all the writer's documents.
        for kind in ["oneOf", "anyOf"] {
            if let Some(branches) = r.get(kind).and_then(Value::as_array) {
                let found = branches
                    .iter()
                    .any(|b| self.fits(r.child(b), w, &format!("{path}/{kind}")));
                if !found {
                    out.push(format!(
                        "SUM_TYPE_NARROWED at {}: no branch of the new schema's {kind} accepts all of the old schema's documents",
                        or_root(path)
                    ));
                }
            }
        }
        if let Some(branches) = r.get("allOf").and_then(Value::as_array) {
            for (i, b) in branches.iter().enumerate() {
                self.check(r.child(b), w, &format!("{path}/allOf/{i}"), out);
            }
        }
        if let Some(not) = r.get("not") {
            if w.get("not") != Some(not) {
                out.push(format!(
                    "NOT_TYPE_NARROWED at {}/not: the new schema excludes documents the old one accepted",
                    path
                ));
            }
        }
        self.base(r, w, path, out);
    }

    /// Everything but the combining keywords.
    fn base(&mut self, r: Node<'a>, w: Node<'a>, path: &str, out: &mut Vec<String>) {
        let at = or_root(path).to_string();
        let (rt, wt) = (types(r), types(w));
        if let Some(rt) = &rt {
            match &wt {
                None => {
                    out.push(format!(
                        "TYPE_NARROWED at {at}: the new schema allows only {rt:?} where any type was allowed"
                    ));
                    return;
                }
                Some(wt) => {
                    let lost: Vec<&&str> = wt
                        .iter()
                        .filter(|t| {
                            !(rt.contains(t) || (**t == "integer" && rt.contains(&"number")))
                        })
                        .collect();
                    if !lost.is_empty() {
                        out.push(format!(
                            "TYPE_CHANGED at {at}: the new schema no longer allows {lost:?} (it allows {rt:?})"
                        ));
                        return;
                    }
                }
            }
        }
        let has = |t: &str| wt.as_ref().is_none_or(|wt| wt.contains(&t));
        self.enums(r, w, &at, out);
        if has("number") || has("integer") {
            self.numbers(r, w, &at, out);
        }
        if has("string") {
            self.strings(r, w, &at, out);
        }
        if has("object") {
            self.objects(r, w, path, out);
        }
        if has("array") {
            self.arrays(r, w, path, out);
        }
    }

    fn enums(&mut self, r: Node<'a>, w: Node<'a>, at: &str, out: &mut Vec<String>) {
        let allowed = |n: Node<'a>| -> Option<Vec<&'a Value>> {
            match (n.get("enum"), n.get("const")) {
                (Some(Value::Array(e)), _) => Some(e.iter().collect()),
                (_, Some(c)) => Some(vec![c]),
                _ => None,
            }
        };
        let Some(ra) = allowed(r) else {
            return;
        };
        match allowed(w) {
            None => out.push(format!(
                "ENUM_ARRAY_NARROWED at {at}: the new schema allows only listed values where the old one did not list them"
            )),
            Some(wa) => {
                let lost: Vec<&&Value> = wa.iter().filter(|v| !ra.contains(v)).collect();
                if !lost.is_empty() {
                    out.push(format!(
                        "ENUM_ARRAY_NARROWED at {at}: the new schema no longer allows {lost:?}"
                    ));
                }
            }
        }
    }

    fn numbers(&mut self, r: Node<'a>, w: Node<'a>, at: &str, out: &mut Vec<String>) {
        // A lower bound the reader sets must be met by one the writer sets.
        if let Some(rm) = number(r, "minimum") {
            let ok = number(w, "minimum").is_some_and(|wm| wm >= rm)
                || number(w, "exclusiveMinimum").is_some_and(|wm| wm >= rm);
            if !ok {
                out.push(format!(
                    "MINIMUM_ADDED_OR_INCREASED at {at}: the new schema's minimum {rm} is above what the old one allowed"
                ));
            }
        }
        if let Some(rm) = number(r, "maximum") {
            let ok = number(w, "maximum").is_some_and(|wm| wm <= rm)
                || number(w, "exclusiveMaximum").is_some_and(|wm| wm <= rm);
            if !ok {
                out.push(format!(
                    "MAXIMUM_ADDED_OR_DECREASED at {at}: the new schema's maximum {rm} is below what the old one allowed"
                ));
            }
        }
        if let Some(re) = number(r, "exclusiveMinimum") {
            let ok = number(w, "exclusiveMinimum").is_some_and(|we| we >= re)
                || number(w, "minimum").is_some_and(|wm| wm > re);
            if !ok {
                out.push(format!(
                    "EXCLUSIVE_MINIMUM_ADDED_OR_INCREASED at {at}: the new schema excludes {re} and below"
                ));
            }
        }
        if let Some(re) = number(r, "exclusiveMaximum") {
            let ok = number(w, "exclusiveMaximum").is_some_and(|we| we <= re)
                || number(w, "maximum").is_some_and(|wm| wm < re);
            if !ok {
                out.push(format!(
                    "EXCLUSIVE_MAXIMUM_ADDED_OR_DECREASED at {at}: the new schema excludes {re} and above"
                ));
            }
        }
        // Draft 4 writes exclusivity as booleans beside minimum and maximum.
        for (flag, bound) in [
            ("exclusiveMinimum", "minimum"),
            ("exclusiveMaximum", "maximum"),
        ] {
            let r_on = r.get(flag) == Some(&Value::Bool(true));
            let w_on = w.get(flag) == Some(&Value::Bool(true));
            if r_on && !w_on && number(r, bound) == number(w, bound) {
                out.push(format!(
                    "{}_ADDED at {at}: the new schema excludes the bound itself",
                    flag.to_ascii_uppercase()
                ));
            }
        }
        if let Some(rm) = number(r, "multipleOf") {
            let ok = number(w, "multipleOf").is_some_and(|wm| {
                let q = wm / rm;
                (q - q.round()).abs() < 1e-9
            });
            if !ok {
                out.push(format!(
                    "MULTIPLE_OF_ADDED_OR_CHANGED at {at}: old documents need not be multiples of {rm}"
                ));
            }
        }
    }

    fn strings(&mut self, r: Node<'a>, w: Node<'a>, at: &str, out: &mut Vec<String>) {
        self.at_most(r, w, "maxLength", at, out);
        self.at_least(r, w, "minLength", at, out);
        if let Some(p) = r.get("pattern") {
            if w.get("pattern") != Some(p) {
                out.push(format!(
                    "PATTERN_ADDED_OR_CHANGED at {at}: the new schema's pattern {p} need not hold for old documents"
                ));
            }
        }
    }

    /// The reader's upper bound `k` must be at or above the writer's.
    fn at_most(&self, r: Node<'a>, w: Node<'a>, k: &str, at: &str, out: &mut Vec<String>) {
        if let Some(rv) = number(r, k) {
            if !number(w, k).is_some_and(|wv| wv <= rv) {
                out.push(format!(
                    "{}_ADDED_OR_DECREASED at {at}: the new schema's {k} {rv} is below what the old one allowed",
                    upper(k)
                ));
            }
        }
    }

    /// The reader's lower bound `k` must be at or below the writer's.
    fn at_least(&self, r: Node<'a>, w: Node<'a>, k: &str, at: &str, out: &mut Vec<String>) {
        if let Some(rv) = number(r, k) {
            if !number(w, k).is_some_and(|wv| wv >= rv) {
                out.push(format!(
                    "{}_ADDED_OR_INCREASED at {at}: the new schema's {k} {rv} is above what the old one allowed",
                    upper(k)
                ));
            }
        }
    }

    fn objects(&mut self, r: Node<'a>, w: Node<'a>, path: &str, out: &mut Vec<String>) {
        let at = or_root(path).to_string();
        let props = |n: Node<'a>| -> Vec<(&'a String, &'a Value)> {
            n.get("properties")
                .and_then(Value::as_object)
                .map(|m| m.iter().collect())
                .unwrap_or_default()
        };
        let (rp, wp) = (props(r), props(w));
        let find = |list: &[(&'a String, &'a Value)], name: &str| -> Option<&'a Value> {
            list.iter()
                .find(|(k, _)| k.as_str() == name)
                .map(|(_, v)| *v)
        };
        let (r_extra, w_extra) = (
            extra(r, "additionalProperties"),
            extra(w, "additionalProperties"),
        );
        let w_patterns = patterns(w);
        let r_patterns = patterns(r);
        for &(name, rs) in &rp {
            let p = format!("{path}/properties/{name}");
            match find(&wp, name) {
                Some(ws) => self.check(r.child(rs), w.child(ws), &p, out),
                None => {
                    // New in the reader: what may the writer have put under this name?
                    if let Some(ws) = matching(&w_patterns, name) {
                        self.check(r.child(rs), w.child(ws), &p, out);
                        continue;
                    }
                    match &w_extra {
                        Extra::Closed => {}
                        Extra::Open => {
                            if !r.child(rs).accepts_all() {
                                out.push(format!(
                                    "PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL at {p}: old documents may hold '{name}' with any value"
                                ));
                            }
                        }
                        Extra::Schema(ws) => self.check(r.child(rs), *ws, &p, out),
                    }
                }
            }
        }
        for &(name, ws) in &wp {
            if find(&rp, name).is_some() {
                continue;
            }
            let p = format!("{path}/properties/{name}");
            // Gone from the reader: does it still accept the property?
            if let Some(rs) = matching(&r_patterns, name) {
                self.check(r.child(rs), w.child(ws), &p, out);
                continue;
            }
            match &r_extra {
                Extra::Open => {}
                Extra::Closed => out.push(format!(
                    "PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL at {p}: old documents may hold '{name}', which the new schema refuses"
                )),
                Extra::Schema(rs) => self.check(*rs, w.child(ws), &p, out),
            }
        }
        // Patterns are compared as written: documents may hold properties under a pattern
        // of either schema, and regular expressions are not compared for overlap.
        let (rpp, wpp) = (r.get("patternProperties"), w.get("patternProperties"));
        if rpp != wpp && !(rpp.is_none() && matches!(r_extra, Extra::Open)) {
            out.push(format!(
                "PATTERN_PROPERTIES_CHANGED at {at}/patternProperties: old documents may hold properties the new patterns constrain"
            ));
        }
        match (&r_extra, &w_extra) {
            (Extra::Open, _) | (_, Extra::Closed) => {}
            (Extra::Closed, _) => out.push(format!(
                "ADDITIONAL_PROPERTIES_REMOVED at {at}: the new schema refuses properties it does not name, which old documents may hold"
            )),
            (Extra::Schema(_), Extra::Open) => out.push(format!(
                "ADDITIONAL_PROPERTIES_NARROWED at {at}/additionalProperties: old documents may hold other properties of any value"
            )),
            (Extra::Schema(rs), Extra::Schema(ws)) => {
                self.check(*rs, *ws, &format!("{path}/additionalProperties"), out)
            }
        }
        let required = |n: Node<'a>| -> Vec<&'a str> {
            n.get("required")
                .and_then(Value::as_array)
                .map(|l| l.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default()
        };
        let (rr, wr) = (required(r), required(w));
        for name in rr.iter().filter(|n| !wr.contains(n)) {
            if find(&wp, name).is_some() {
                out.push(format!(
                    "REQUIRED_ATTRIBUTE_ADDED at {at}/required: '{name}' is now required and old documents may lack it"
                ));
            } else if find(&rp, name).is_none_or(|s| s.get("default").is_none()) {
                out.push(format!(
                    "REQUIRED_PROPERTY_ADDED at {at}/required: new property '{name}' is required and has no default"
                ));
            }
        }
        self.at_most(r, w, "maxProperties", &at, out);
        self.at_least(r, w, "minProperties", &at, out);
        for k in [
            "dependencies",
            "dependentRequired",
            "dependentSchemas",
            "propertyNames",
        ] {
            if let Some(rv) = r.get(k) {
                if w.get(k) != Some(rv) {
                    out.push(format!(
                        "{}_CHANGED at {at}/{k}: old documents need not meet the new schema's {k}",
                        upper(k)
                    ));
                }
            }
        }
    }

    fn arrays(&mut self, r: Node<'a>, w: Node<'a>, path: &str, out: &mut Vec<String>) {
        let at = or_root(path).to_string();
        let (rt, r_rest) = tuple(r);
        let (wt, w_rest) = tuple(w);
        for i in 0..rt.len().max(wt.len()) {
            let p = format!("{path}/items/{i}");
            let rs = rt
                .get(i)
                .map(|v| Item::Schema(r.child(v)))
                .unwrap_or(match &r_rest {
                    Extra::Open => Item::Any,
                    Extra::Closed => Item::None,
                    Extra::Schema(s) => Item::Schema(*s),
                });
            let ws = wt
                .get(i)
                .map(|v| Item::Schema(w.child(v)))
                .unwrap_or(match &w_rest {
                    Extra::Open => Item::Any,
                    Extra::Closed => Item::None,
                    Extra::Schema(s) => Item::Schema(*s),
                });
            match (rs, ws) {
                (Item::Any, _) | (_, Item::None) => {}
                (Item::None, _) => out.push(format!(
                    "ITEM_REMOVED at {p}: the new schema refuses an item old documents may have"
                )),
                (Item::Schema(rs), Item::Any) => {
                    if !rs.accepts_all() {
                        out.push(format!(
                            "ITEM_ADDED_TO_OPEN_CONTENT_MODEL at {p}: old documents may have any item here"
                        ))
                    }
                }
                (Item::Schema(rs), Item::Schema(ws)) => self.check(rs, ws, &p, out),
            }
        }
        match (&r_rest, &w_rest) {
            (Extra::Open, _) | (_, Extra::Closed) => {}
            (Extra::Closed, _) => out.push(format!(
                "ADDITIONAL_ITEMS_REMOVED at {at}: the new schema refuses items beyond its list, which old documents may have"
            )),
            (Extra::Schema(rs), Extra::Open) => {
                if !rs.accepts_all() {
                    out.push(format!(
                        "ITEMS_NARROWED at {at}/items: old documents may have items of any value"
                    ))
                }
            }
            (Extra::Schema(rs), Extra::Schema(ws)) => {
                self.check(*rs, *ws, &format!("{path}/items"), out)
            }
        }
        self.at_most(r, w, "maxItems", &at, out);
        self.at_least(r, w, "minItems", &at, out);
        if r.get("uniqueItems") == Some(&Value::Bool(true))
            && w.get("uniqueItems") != Some(&Value::Bool(true))
        {
            out.push(format!(
                "UNIQUE_ITEMS_ADDED at {at}: old documents may repeat items"
            ));
        }
        if let Some(c) = r.get("contains") {
            if w.get("contains") != Some(c) {
                out.push(format!(
                    "CONTAINS_CHANGED at {at}/contains: old documents need not contain such an item"
                ));
            }
        }
    }
}

enum Item<'a> {
    Any,
    None,
    Schema(Node<'a>),
}

/// An array schema as a list of positional item schemas and what follows them.
fn tuple<'a>(n: Node<'a>) -> (Vec<&'a Value>, Extra<'a>) {
    if let Some(prefix) = n.get("prefixItems").and_then(Value::as_array) {
        return (prefix.iter().collect(), extra(n, "items"));
    }
    match n.get("items") {
        Some(Value::Array(list)) => (list.iter().collect(), extra(n, "additionalItems")),
        _ => (Vec::new(), extra(n, "items")),
    }
}

/// `patternProperties` as (pattern, schema) pairs.
fn patterns<'a>(n: Node<'a>) -> Vec<(&'a str, &'a Value)> {
    n.get("patternProperties")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.as_str(), v)).collect())
        .unwrap_or_default()
}

/// The schema of the first pattern matching `name`. Patterns are ECMA-262 regular
/// expressions; those the `regex` crate cannot compile match nothing (the check then treats
/// the name as unmatched, which can only make it stricter).
fn matching<'a>(patterns: &[(&str, &'a Value)], name: &str) -> Option<&'a Value> {
    patterns.iter().find_map(|(p, s)| {
        regex::Regex::new(p)
            .ok()
            .filter(|re| re.is_match(name))
            .map(|_| *s)
    })
}

fn upper(k: &str) -> String {
    let mut out = String::new();
    for c in k.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(text: &str) -> JsonSchema {
        parse(serde_json::from_str(text).unwrap(), &[]).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn reads(reader: &str, writer: &str) -> Vec<String> {
        incompatibilities(&schema(reader), &schema(writer))
    }

    /// (change, old, new, backward: new accepts old's documents, forward: old accepts new's).
    fn table() -> Vec<(&'static str, &'static str, &'static str, bool, bool)> {
        vec![
            (
                "nothing changes",
                r#"{"type":"object","properties":{"a":{"type":"string"}}}"#,
                r#"{"type":"object","properties":{"a":{"type":"string"}}}"#,
                true,
                true,
            ),
            (
                "a property is added to an open content model",
                r#"{"type":"object","properties":{"a":{"type":"string"}}}"#,
                r#"{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}}}"#,
                false,
                true,
            ),
            (
                "a property is added to a closed content model",
                r#"{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}"#,
                r#"{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}},"additionalProperties":false}"#,
                true,
                false,
            ),
            (
                "a property is removed from an open content model",
                r#"{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}}}"#,
                r#"{"type":"object","properties":{"a":{"type":"string"}}}"#,
                true,
                false,
            ),
            (
                "a property is removed from a closed content model",
                r#"{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}},"additionalProperties":false}"#,
                r#"{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}"#,
                false,
                true,
            ),
            (
                "a type is widened from integer to number",
                r#"{"type":"integer"}"#,
                r#"{"type":"number"}"#,
                true,
                false,
            ),
            (
                "a type changes",
                r#"{"type":"string"}"#,
                r#"{"type":"boolean"}"#,
                false,
                false,
            ),
            (
                "a type is added to a list of types",
                r#"{"type":"string"}"#,
                r#"{"type":["string","null"]}"#,
                true,
                false,
            ),
            (
                "an existing property becomes required",
                r#"{"type":"object","properties":{"a":{"type":"string"}}}"#,
                r#"{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}"#,
                false,
                true,
            ),
            (
                "a new required property with a default is added to a closed model",
                r#"{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}"#,
                r#"{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string","default":"x"}},"required":["b"],"additionalProperties":false}"#,
                true,
                false,
            ),
            (
                "a new required property without a default is added to a closed model",
                r#"{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}"#,
                r#"{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},"required":["b"],"additionalProperties":false}"#,
                false,
                false,
            ),
            (
                "the content model is closed",
                r#"{"type":"object","properties":{"a":{"type":"string"}}}"#,
                r#"{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}"#,
                false,
                true,
            ),
            (
                "maxLength is decreased",
                r#"{"type":"string","maxLength":10}"#,
                r#"{"type":"string","maxLength":5}"#,
                false,
                true,
            ),
            (
                "minimum is added",
                r#"{"type":"number"}"#,
                r#"{"type":"number","minimum":0}"#,
                false,
                true,
            ),
            (
                "an enum gains a value",
                r#"{"enum":["a","b"]}"#,
                r#"{"enum":["a","b","c"]}"#,
                true,
                false,
            ),
            (
                "array items change type",
                r#"{"type":"array","items":{"type":"string"}}"#,
                r#"{"type":"array","items":{"type":"integer"}}"#,
                false,
                false,
            ),
            (
                "a oneOf gains a branch",
                r#"{"oneOf":[{"type":"string"},{"type":"integer"}]}"#,
                r#"{"oneOf":[{"type":"string"},{"type":"integer"},{"type":"boolean"}]}"#,
                true,
                false,
            ),
            (
                "a type becomes a oneOf containing it",
                r#"{"type":"string"}"#,
                r#"{"oneOf":[{"type":"string"},{"type":"null"}]}"#,
                true,
                false,
            ),
            (
                "a nested property changes type through a definition",
                r##"{"type":"object","properties":{"p":{"$ref":"#/definitions/P"}},"definitions":{"P":{"type":"object","properties":{"x":{"type":"integer"}}}}}"##,
                r##"{"type":"object","properties":{"p":{"$ref":"#/definitions/P"}},"definitions":{"P":{"type":"object","properties":{"x":{"type":"string"}}}}}"##,
                false,
                false,
            ),
        ]
    }

    #[test]
    fn schema_changes_get_the_documented_verdicts() {
        for (change, old, new, backward, forward) in table() {
            let b = reads(new, old);
            assert_eq!(b.is_empty(), backward, "{change}: backward: {b:?}");
            let f = reads(old, new);
            assert_eq!(f.is_empty(), forward, "{change}: forward: {f:?}");
        }
    }

    #[test]
    fn a_recursive_schema_is_checked_without_looping() {
        let tree = r##"{"type":"object","properties":{"children":{"type":"array","items":{"$ref":"#"}}}}"##;
        assert!(reads(tree, tree).is_empty());
    }

    #[test]
    fn invalid_schemas_are_refused_with_a_reason() {
        for bad in [
            r#"42"#,
            r#"{"type":"text"}"#,
            r#"{"properties":{"a":7}}"#,
            r#"{"required":"a"}"#,
            r#"{"minLength":-1}"#,
            r##"{"$ref":"#/definitions/missing"}"##,
            r#"{"$ref":"other.json"}"#,
            r#"{"anyOf":[]}"#,
        ] {
            let v = serde_json::from_str(bad).unwrap();
            assert!(parse(v, &[]).is_err(), "{bad} should be invalid");
        }
    }

    #[test]
    fn references_resolve_by_name_and_with_a_pointer() {
        let other = Resolved {
            name: "address.json".into(),
            schema_type: crate::schema::SchemaType::Json,
            text: r##"{"type":"object","definitions":{"City":{"type":"string"}},"properties":{"city":{"$ref":"#/definitions/City"}}}"##.into(),
        };
        let v = serde_json::from_str(
            r#"{"type":"object","properties":{"home":{"$ref":"address.json"},"city":{"$ref":"address.json#/definitions/City"}}}"#,
        )
        .unwrap();
        let s = parse(v, std::slice::from_ref(&other)).unwrap();
        assert!(incompatibilities(&s, &s).is_empty());
    }
}
